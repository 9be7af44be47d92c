package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/agent-sidecar/agent-sidecar/clients/go/sidecar"
	"google.golang.org/protobuf/encoding/protojson"
)

// scenario is one entry of scenarios.json ({lang} already substituted).
type scenario struct {
	ID             string          `json:"id"`
	Title          string          `json:"title"`
	Transport      string          `json:"transport"`
	Source         json.RawMessage `json:"source"`
	Concurrency    int             `json:"concurrency"`
	Profile        string          `json:"profile"`
	Text           string          `json:"text"`
	FirstText      string          `json:"first_text"`
	SecondText     string          `json:"second_text"`
	QueuedTexts    []string        `json:"queued_texts"`
	CutAfterFrames int             `json:"cut_after_frames"`
	IdleTimeoutMS  int             `json:"stream_idle_timeout_ms"`
	OutageMS       int             `json:"outage_ms"`
	FirstOutageMS  int             `json:"first_outage_ms"`
	ResumeWindowMS int             `json:"resume_window_ms"`
	WithinMS       int             `json:"within_ms"`
	CallTimeoutMS  int             `json:"call_timeout_ms"`
	Turns          int             `json:"turns"`
	Words          int             `json:"words"`
	WordChars      int             `json:"word_chars"`
	PauseMS        int             `json:"pause_ms"`
	Forms          []string        `json:"forms"`
	Invalid        []string        `json:"invalid"`
	Accepted       []string        `json:"accepted"`
	Tool           *toolDef        `json:"tool"`
	Expect         expect          `json:"expect"`
}

type toolDef struct {
	Namespace   string          `json:"namespace"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Schema      json.RawMessage `json:"schema"`
}

type expect struct {
	SessionKey            string   `json:"session_key"`
	DistinctSessionIDs    int      `json:"distinct_session_ids"`
	KindsPattern          []string `json:"kinds_pattern"`
	FinalText             *string  `json:"final_text"`
	SameFrames            bool     `json:"same_frames"`
	TurnCount             int64    `json:"turn_count"`
	ErrorReason           string   `json:"error_reason"`
	FirstCompletes        bool     `json:"first_completes"`
	CompletionOrder       []string `json:"completion_order"`
	QueuePositions        []int32  `json:"queue_positions"`
	Gapless               bool     `json:"gapless"`
	LastKind              string   `json:"last_kind"`
	ToolCallName          string   `json:"tool_call_name"`
	ToolResultOK          *bool    `json:"tool_result_ok"`
	FinalTextContains     string   `json:"final_text_contains"`
	SameSessionID         bool     `json:"same_session_id"`
	TCPWithoutTokenReason string   `json:"tcp_without_token_reason"`
	WrongCACode           string   `json:"wrong_ca_code"`
	WithoutClientCertCode string   `json:"without_client_cert_code"`
	// Regular expressions, matched case-insensitively against an error's text.
	WithoutClientCertMatches string   `json:"without_client_cert_matches"`
	ForeignClientCertMatches string   `json:"foreign_client_cert_matches"`
	PlainOnTLSMatches        string   `json:"plain_on_tls_matches"`
	MissingSocketMatches     string   `json:"missing_socket_matches"`
	WrongCAMatches           string   `json:"wrong_ca_matches"`
	AtTerminalKinds          []string `json:"at_terminal_kinds"`
	BeforeTerminalKinds      []string `json:"before_terminal_kinds"`
	Code                     string   `json:"code"`
	Reason                   *string  `json:"reason"`
}

// source decodes the scenario's SessionSource (proto field names).
func (sc *scenario) source() (*sidecar.Source, error) {
	src := &sidecar.Source{}
	if len(sc.Source) == 0 {
		return nil, errors.New("scenario has no source")
	}
	if err := protojson.Unmarshal(sc.Source, src); err != nil {
		return nil, fmt.Errorf("source: %w", err)
	}
	return src, nil
}

var scenarioFuncs = map[string]func(context.Context, *runner, *scenario) error{
	"get_or_create_idempotent": getOrCreateIdempotent,
	"echo_prompt":              echoPrompt,
	"duplicate_request_id":     duplicateRequestID,
	"reject_if_busy":           rejectIfBusy,
	"queue_order":              queueOrder,
	"stream_resume":            streamResume,
	"stream_stall":             streamStall,
	"prompt_outage":            promptOutage,
	"watch_after_terminal":     watchAfterTerminal,
	"tool_host_outage":         toolHostOutage,
	"client_deadline":          clientDeadline,
	"target_forms":             targetForms,
	"tool_call":                toolCall,
	"tool_scope_violation":     toolScopeViolation,
	"unix_and_tcp":             unixAndTCP,
	"tls_custom_ca":            tlsCustomCA,
	"mtls_client_cert":         mtlsClientCert,
	"watch_too_slow":           watchTooSlow,
	"connect_failure_reason":   connectFailureReason,
}

func getOrCreateIdempotent(ctx context.Context, r *runner, sc *scenario) error {
	c, err := r.unixClient(ctx)
	if err != nil {
		return err
	}
	src, err := sc.source()
	if err != nil {
		return err
	}
	n := max(sc.Concurrency, 1)
	sessions := make([]*sidecar.Session, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { sessions[i], errs[i] = c.GetOrCreateSession(ctx, src) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	ids := map[string]bool{}
	for _, s := range sessions {
		ids[s.GetSessionId()] = true
		if want := sc.Expect.SessionKey; want != "" && s.GetSessionKey() != want {
			return fmt.Errorf("session_key %q, want %q", s.GetSessionKey(), want)
		}
	}
	if want := sc.Expect.DistinctSessionIDs; want > 0 && len(ids) != want {
		return fmt.Errorf("%d concurrent calls gave %d distinct session ids, want %d", n, len(ids), want)
	}
	return nil
}

func unixAndTCP(ctx context.Context, r *runner, sc *scenario) error {
	if r.tcpTarget == "" {
		return errors.New("no --tcp target given")
	}
	src, err := sc.source()
	if err != nil {
		return err
	}
	uc, err := r.unixClient(ctx)
	if err != nil {
		return err
	}
	viaUnix, err := uc.GetOrCreateSession(ctx, src)
	if err != nil {
		return fmt.Errorf("unix: %w", err)
	}
	tc, err := dial(ctx, r.tcpTarget, sidecar.WithToken(r.token))
	if err != nil {
		return fmt.Errorf("tcp: %w", err)
	}
	defer tc.Close()
	viaTCP, err := tc.GetOrCreateSession(ctx, src)
	if err != nil {
		return fmt.Errorf("tcp with token: %w", err)
	}
	if sc.Expect.SameSessionID && viaUnix.GetSessionId() != viaTCP.GetSessionId() {
		return fmt.Errorf("unix session %s, tcp session %s", viaUnix.GetSessionId(), viaTCP.GetSessionId())
	}
	if want := sc.Expect.TCPWithoutTokenReason; want != "" {
		anon, err := dial(ctx, r.tcpTarget)
		if err != nil {
			return fmt.Errorf("tcp without token: %w", err)
		}
		defer anon.Close()
		_, err = anon.GetOrCreateSession(ctx, src)
		if err := wantReason(err, want); err != nil {
			return fmt.Errorf("tcp without token: %w", err)
		}
	}
	return nil
}

// wantReason checks that err is a typed *sidecar.Error with the reason.
func wantReason(err error, reason string) error {
	if err == nil {
		return fmt.Errorf("no error, want %s", reason)
	}
	var se *sidecar.Error
	if !errors.As(err, &se) {
		return fmt.Errorf("error is not a *sidecar.Error: %T %v", err, err)
	}
	if se.Reason != reason || !sidecar.IsReason(err, reason) {
		return fmt.Errorf("reason %q (%v), want %s", se.Reason, err, reason)
	}
	return nil
}

// matchKinds matches kinds against a pattern of kinds, each optionally
// suffixed with + (one or more), * (zero or more) or ? (zero or one).
func matchKinds(pattern, kinds []string) bool {
	if len(pattern) == 0 {
		return len(kinds) == 0
	}
	p, rest := pattern[0], pattern[1:]
	name, lo, hi := p, 1, 1
	switch {
	case strings.HasSuffix(p, "+"):
		name, lo, hi = p[:len(p)-1], 1, len(kinds)
	case strings.HasSuffix(p, "*"):
		name, lo, hi = p[:len(p)-1], 0, len(kinds)
	case strings.HasSuffix(p, "?"):
		name, lo, hi = p[:len(p)-1], 0, 1
	}
	for n := 0; n <= hi && n <= len(kinds); n++ {
		if n > 0 && kinds[n-1] != name {
			break
		}
		if n >= lo && matchKinds(rest, kinds[n:]) {
			return true
		}
	}
	return false
}

// checkGapless checks seq runs 1..n without gap or repeat.
func checkGapless(frames []*sidecar.Frame) error {
	for i, f := range frames {
		if f.Seq != int64(i+1) {
			return fmt.Errorf("frame %d has seq %d (seqs %v)", i, f.Seq, seqsOf(frames))
		}
	}
	return nil
}

func kindsOf(frames []*sidecar.Frame) []string {
	var out []string
	for _, f := range frames {
		out = append(out, f.Kind())
	}
	return out
}

func seqsOf(frames []*sidecar.Frame) []int64 {
	var out []int64
	for _, f := range frames {
		out = append(out, f.Seq)
	}
	return out
}

// finalText returns the completed frame's final_text ("" if none).
func finalText(frames []*sidecar.Frame) string {
	for _, f := range slices.Backward(frames) {
		if c := f.GetCompleted(); c != nil {
			return c.GetFinalText()
		}
	}
	return ""
}

func lastKind(frames []*sidecar.Frame) string {
	if len(frames) == 0 {
		return ""
	}
	return frames[len(frames)-1].Kind()
}

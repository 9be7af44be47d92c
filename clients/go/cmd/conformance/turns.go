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
	"google.golang.org/protobuf/proto"
)

// turn is a prompt running in the background.
type turn struct {
	accepted chan int32    // the accepted frame's queue_position
	started  chan struct{} // closed at the started frame or at the end
	done     chan struct{} // closed when the iterator ends
	frames   []*sidecar.Frame
	err      error
}

// startTurn runs a prompt in a goroutine; onEnd (if set) runs at its terminal frame.
func startTurn(ctx context.Context, c *sidecar.Client, p sidecar.PromptParams, onEnd func(*sidecar.Frame)) *turn {
	t := &turn{accepted: make(chan int32, 1), started: make(chan struct{}), done: make(chan struct{})}
	go func() {
		var once sync.Once
		markStarted := func() { once.Do(func() { close(t.started) }) }
		defer close(t.done)
		defer markStarted()
		for f, err := range c.Prompt(ctx, p) {
			if err != nil {
				t.err = err
				return
			}
			t.frames = append(t.frames, f)
			switch {
			case f.GetAccepted() != nil:
				select {
				case t.accepted <- f.GetAccepted().GetQueuePosition():
				default:
				}
			case f.GetStarted() != nil:
				markStarted()
			case f.Terminal() && onEnd != nil:
				onEnd(f)
			}
		}
	}()
	return t
}

// wait blocks until the turn ends or ctx does.
func (t *turn) wait(ctx context.Context) error {
	select {
	case <-t.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("turn did not end: %w", ctx.Err())
	}
}

// waitStarted blocks until the turn has started; a turn that ended with an
// error instead is reported.
func (t *turn) waitStarted(ctx context.Context) error {
	select {
	case <-t.started:
		select {
		case <-t.done:
			if t.err != nil {
				return fmt.Errorf("first turn: %w (kinds %v)", t.err, kindsOf(t.frames))
			}
		default:
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("turn did not start: %w", ctx.Err())
	}
}

// promptParams builds the scenario's PromptParams for text.
func promptParams(sc *scenario, text string) (sidecar.PromptParams, error) {
	src, err := sc.source()
	return sidecar.PromptParams{RequestID: sidecar.NewRequestID(), Source: src, Text: text, Profile: sc.Profile}, err
}

func echoPrompt(ctx context.Context, r *runner, sc *scenario) error {
	c, err := r.unixClient(ctx)
	if err != nil {
		return err
	}
	p, err := promptParams(sc, sc.Text)
	if err != nil {
		return err
	}
	frames, err := sidecar.Collect(c.Prompt(ctx, p))
	if err != nil {
		return fmt.Errorf("prompt: %w (kinds %v)", err, kindsOf(frames))
	}
	if pat := sc.Expect.KindsPattern; pat != nil && !matchKinds(pat, kindsOf(frames)) {
		return fmt.Errorf("kinds %v do not match %v", kindsOf(frames), pat)
	}
	if err := checkGapless(frames); err != nil {
		return err
	}
	for _, f := range frames {
		if f.RequestId != p.RequestID {
			return fmt.Errorf("frame seq %d has request_id %q, want %q", f.Seq, f.RequestId, p.RequestID)
		}
	}
	if want := sc.Expect.FinalText; want != nil && finalText(frames) != *want {
		return fmt.Errorf("final_text %q, want %q", finalText(frames), *want)
	}
	return nil
}

func duplicateRequestID(ctx context.Context, r *runner, sc *scenario) error {
	c, err := r.unixClient(ctx)
	if err != nil {
		return err
	}
	p, err := promptParams(sc, sc.Text)
	if err != nil {
		return err
	}
	before, err := c.GetOrCreateSession(ctx, p.Source, sidecar.WithProfile(sc.Profile))
	if err != nil {
		return fmt.Errorf("get_or_create: %w", err)
	}
	first, err := sidecar.Collect(c.Prompt(ctx, p))
	if err != nil {
		return fmt.Errorf("first prompt: %w", err)
	}
	second, err := sidecar.Collect(c.Prompt(ctx, p))
	if err != nil {
		return fmt.Errorf("repeated prompt: %w", err)
	}
	if sc.Expect.SameFrames {
		if len(first) != len(second) {
			return fmt.Errorf("first run %v, repeat %v", kindsOf(first), kindsOf(second))
		}
		for i := range first {
			if a, b := withoutAt(first[i]), withoutAt(second[i]); !proto.Equal(a, b) {
				return fmt.Errorf("frame %d differs: %v vs %v", i, a, b)
			}
		}
	}
	if want := sc.Expect.TurnCount; want > 0 {
		after, err := c.GetSession(ctx, first[0].SessionKey)
		if err != nil {
			return fmt.Errorf("get_session: %w", err)
		}
		if got := after.GetTurnCount() - before.GetTurnCount(); got != want {
			return fmt.Errorf("turn_count grew by %d, want %d", got, want)
		}
	}
	return nil
}

// withoutAt copies a frame minus its timestamp: the replay must carry the same
// request, session, seq, cursor and event; the sidecar is not asked for
// bit-identical timestamps between the live send and the persisted row.
func withoutAt(f *sidecar.Frame) proto.Message {
	c := proto.CloneOf(f.ActivityFrame)
	c.At = nil
	return c
}

func rejectIfBusy(ctx context.Context, r *runner, sc *scenario) error {
	c, err := r.unixClient(ctx)
	if err != nil {
		return err
	}
	p1, err := promptParams(sc, sc.FirstText)
	if err != nil {
		return err
	}
	first := startTurn(ctx, c, p1, nil)
	if err := first.waitStarted(ctx); err != nil {
		return err
	}
	p2, _ := promptParams(sc, sc.SecondText)
	p2.Delivery = sidecar.DeliveryRejectIfBusy
	frames, err := sidecar.Collect(c.Prompt(ctx, p2))
	if len(frames) != 0 {
		return fmt.Errorf("rejected prompt streamed frames %v", kindsOf(frames))
	}
	if err := wantReason(err, sc.Expect.ErrorReason); err != nil {
		return err
	}
	if sc.Expect.FirstCompletes {
		if err := first.wait(ctx); err != nil {
			return err
		}
		if first.err != nil || lastKind(first.frames) != sidecar.KindCompleted {
			return fmt.Errorf("first turn did not complete: %v (kinds %v)", first.err, kindsOf(first.frames))
		}
	}
	return nil
}

func queueOrder(ctx context.Context, r *runner, sc *scenario) error {
	c, err := r.unixClient(ctx)
	if err != nil {
		return err
	}
	var mu sync.Mutex
	var order []string
	onEnd := func(f *sidecar.Frame) {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, f.GetCompleted().GetFinalText())
	}
	p, err := promptParams(sc, sc.FirstText)
	if err != nil {
		return err
	}
	turns := []*turn{startTurn(ctx, c, p, onEnd)}
	if err := turns[0].waitStarted(ctx); err != nil {
		return err
	}
	var positions []int32
	for _, text := range sc.QueuedTexts {
		p, _ := promptParams(sc, text)
		p.Delivery = sidecar.DeliveryQueue
		t := startTurn(ctx, c, p, onEnd)
		turns = append(turns, t)
		select { // send the next one only once this one is acknowledged
		case pos := <-t.accepted:
			positions = append(positions, pos)
		case <-t.done:
			return fmt.Errorf("queued %q ended before accepted: %v", text, t.err)
		case <-ctx.Done():
			return fmt.Errorf("queued %q not accepted: %w", text, ctx.Err())
		}
	}
	for i, t := range turns {
		if err := t.wait(ctx); err != nil {
			return err
		}
		if t.err != nil {
			return fmt.Errorf("turn %d: %w (kinds %v)", i, t.err, kindsOf(t.frames))
		}
	}
	if want := sc.Expect.QueuePositions; want != nil && !slices.Equal(positions, want) {
		return fmt.Errorf("queue positions %v, want %v", positions, want)
	}
	if want := sc.Expect.CompletionOrder; want != nil && !slices.Equal(order, want) {
		return fmt.Errorf("completion order was %q, want %q", order, want)
	}
	return nil
}

func toolCall(ctx context.Context, r *runner, sc *scenario) error {
	if sc.Tool == nil {
		return errors.New("scenario has no tool")
	}
	c, err := r.unixClient(ctx)
	if err != nil {
		return err
	}
	host := sidecar.NewToolHost(sc.Tool.Namespace)
	host.Register(sc.Tool.Name, sc.Tool.Description, sc.Tool.Schema, func(_ context.Context, args []byte) (any, error) {
		var in struct{ A, B int64 }
		if err := json.Unmarshal(args, &in); err != nil {
			return nil, fmt.Errorf("bad arguments: %w", err)
		}
		return in.A + in.B, nil
	})
	hctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- host.Serve(hctx, c) }()
	defer func() { stop(); <-served }()
	select {
	case <-host.Ready(): // registered, or Serve stopped first (then Err says why)
		if err := host.Err(); err != nil {
			return fmt.Errorf("tool host: %v", err)
		}
	case <-ctx.Done():
		return fmt.Errorf("tool host never registered: %w", ctx.Err())
	}
	p, err := promptParams(sc, sc.Text)
	if err != nil {
		return err
	}
	frames, err := sidecar.Collect(c.Prompt(ctx, p))
	if err != nil {
		return fmt.Errorf("prompt: %w (kinds %v)", err, kindsOf(frames))
	}
	var call, res *sidecar.Frame
	for _, f := range frames {
		if f.GetToolCall() != nil && call == nil {
			call = f
		}
		if f.GetToolResult() != nil && res == nil {
			res = f
		}
	}
	if want := sc.Expect.ToolCallName; want != "" && (call == nil || call.GetToolCall().GetName() != want) {
		return fmt.Errorf("no tool_call of %s in %v", want, kindsOf(frames))
	}
	if want := sc.Expect.ToolResultOK; want != nil && (res == nil || res.GetToolResult().GetOk() != *want) {
		return fmt.Errorf("tool_result %v, want ok=%v", res.GetToolResult(), *want)
	}
	if want := sc.Expect.FinalTextContains; want != "" && !strings.Contains(finalText(frames), want) {
		return fmt.Errorf("final_text %q does not contain %q", finalText(frames), want)
	}
	return nil
}

func toolScopeViolation(ctx context.Context, r *runner, sc *scenario) error {
	c, err := r.unixClient(ctx)
	if err != nil {
		return err
	}
	p, err := promptParams(sc, sc.Text)
	if err != nil {
		return err
	}
	frames, err := sidecar.Collect(c.Prompt(ctx, p))
	if err := wantReason(err, sc.Expect.ErrorReason); err != nil {
		return fmt.Errorf("%w (kinds %v)", err, kindsOf(frames))
	}
	if want := sc.Expect.LastKind; want != "" && lastKind(frames) != want {
		return fmt.Errorf("last kind %q, want %q", lastKind(frames), want)
	}
	if len(frames) == 0 {
		return errors.New("no frames before the error")
	}
	if f := frames[len(frames)-1].GetFailed(); f != nil && f.GetReason() != sc.Expect.ErrorReason {
		return fmt.Errorf("failed frame reason %q, want %q", f.GetReason(), sc.Expect.ErrorReason)
	}
	return nil
}

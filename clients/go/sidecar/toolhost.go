package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/agent-sidecar/agent-sidecar/clients/go/agentsidecarv1"
	"google.golang.org/grpc/codes"
)

// ToolFunc implements one hosted tool. args is the model's arguments object
// as JSON. The result is sent as JSON: a json.RawMessage is sent as is, any
// other value goes through json.Marshal. A returned error (or a panic) is
// reported to the sidecar as a failed invocation. ctx ends when the
// sidecar's timeout for the call passes, the stream that brought the call
// ends (its result could not be delivered any more) or Serve stops: a tool
// should return then. The host does not wait for it; a tool that ignores ctx
// holds up nothing but its own goroutine, which may outlive Serve. The
// invocation itself is available through InvocationFromContext.
type ToolFunc func(ctx context.Context, args []byte) (any, error)

// Invocation is one call of a hosted tool (session, request, timeout).
type Invocation = pb.ToolInvocation

type invocationKey struct{}

// InvocationFromContext returns the invocation a ToolFunc is serving.
func InvocationFromContext(ctx context.Context) (*Invocation, bool) {
	inv, ok := ctx.Value(invocationKey{}).(*Invocation)
	return inv, ok
}

type hostedTool struct {
	spec *pb.ToolSpec
	fn   ToolFunc
}

// ToolHost hosts tools for the agent over ToolService.ServeTools:
//
//	host := sidecar.NewToolHost("local")
//	host.Register("local.clock.now", "Current time", `{"type":"object"}`, clockNow)
//	go host.Serve(ctx, client)
//	<-host.Ready()
//	if err := host.Err(); err != nil { ... } // Serve stopped before registering
type ToolHost struct {
	namespace string

	// OnRetry, when set, is called before each new attempt to open and
	// register the stream after a failed one (attempt 1, 2, ... since the last
	// registration), with why the last one failed: an adapter started before
	// its sidecar waits for it, and a wrong port waits the same way, so this is
	// where to see it. When nil, the host logs (package log) the 1st failure and
	// every RetryLogEvery-th after it. Set it before Serve.
	OnRetry func(attempt int, err error)

	mu    sync.Mutex
	tools map[string]*hostedTool
	order []string

	ready     chan struct{}
	readyOnce sync.Once
	serving   atomic.Bool
	err       error // why the last Serve stopped; guarded by mu
}

// NewToolHost returns a host for tools under namespace (a dotted prefix such
// as "discord" or "conf.go").
func NewToolHost(namespace string) *ToolHost {
	return &ToolHost{namespace: namespace, tools: map[string]*hostedTool{}, ready: make(chan struct{})}
}

// Namespace returns the host's namespace.
func (h *ToolHost) Namespace() string { return h.namespace }

// Register adds a tool. name is the full dotted name ("local.clock.now"); a
// name without the namespace prefix gets it prepended. schema is the JSON
// Schema of the arguments: a string, []byte or json.RawMessage holding JSON,
// any other value to be marshalled, or nil for {"type":"object"}. Like
// http.HandleFunc it panics on programmer errors (duplicate name, invalid
// schema). Register tools before Serve; later ones are sent on the next
// (re)connection only.
func (h *ToolHost) Register(name, description string, schema any, fn ToolFunc) {
	if h.namespace != "" && !strings.HasPrefix(name, h.namespace+".") {
		name = h.namespace + "." + name
	}
	raw, err := schemaJSON(schema)
	if err != nil {
		panic(fmt.Sprintf("sidecar: tool %s: %v", name, err))
	}
	if fn == nil {
		panic(fmt.Sprintf("sidecar: tool %s: nil ToolFunc", name))
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, dup := h.tools[name]; dup {
		panic(fmt.Sprintf("sidecar: tool %s registered twice", name))
	}
	h.tools[name] = &hostedTool{spec: &pb.ToolSpec{Name: name, Description: description, ParametersJsonSchema: raw}, fn: fn}
	h.order = append(h.order, name)
}

func schemaJSON(schema any) (string, error) {
	var b []byte
	switch s := schema.(type) {
	case nil:
		return `{"type":"object"}`, nil
	case string:
		b = []byte(s)
	case []byte:
		b = s
	case json.RawMessage:
		b = s
	default:
		m, err := json.Marshal(s)
		if err != nil {
			return "", fmt.Errorf("schema: %w", err)
		}
		b = m
	}
	if !json.Valid(b) {
		return "", errors.New("schema is not valid JSON")
	}
	return string(b), nil
}

// Ready is closed once the sidecar has confirmed the first registration, or
// once Serve stops without one (registration refused, ctx ended), so waiting on it cannot hang;
// Err then says which.
func (h *ToolHost) Ready() <-chan struct{} { return h.ready }

// Err says why the host is not serving: nil while Serve runs (and before it
// first runs); once Serve has returned, its error, or ctx's error when it
// returned because ctx ended. After <-Ready(), a nil Err means registered.
func (h *ToolHost) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

func (h *ToolHost) setErr(err error) {
	h.mu.Lock()
	h.err = err
	h.mu.Unlock()
}

// Serve opens ToolService.ServeTools on c, registers the tools, closes
// Ready() when the sidecar confirms, and answers invocations concurrently
// until ctx ends (then it returns nil, at once: it does not wait for tools
// still running, whose ctx is cancelled). If the stream drops it cancels the
// calls in flight (their results cannot be delivered) and reconnects and
// registers again, with a backoff capped at 5 s, for as long as ctx lives
// (the client's resume window does not apply), reporting each failed attempt
// to OnRetry (or the log); a refusal by the sidecar (an error carrying a
// reason), a TLS handshake or certificate failure (a wrong CA, a missing
// client certificate), a local error (a message that cannot be encoded, a bad
// token) or the Client being closed is returned at once; a refusal after
// the stream registered (a result past the sidecar's limits: that call fails)
// is followed by a new registration. When Serve
// returns, Ready() is closed and Err() reports why.
func (h *ToolHost) Serve(ctx context.Context, c *Client) (err error) {
	if !h.serving.CompareAndSwap(false, true) {
		return errors.New("sidecar: ToolHost.Serve is already running")
	}
	h.setErr(nil)
	defer func() {
		stopped := err
		if stopped == nil {
			stopped = ctx.Err()
		}
		h.setErr(stopped)
		h.readyOnce.Do(func() { close(h.ready) }) // never leave <-Ready() hanging
		h.serving.Store(false)
	}()
	delay := 100 * time.Millisecond
	attempt := 0
	for {
		registered, err := h.serveOnce(ctx, c)
		if ctx.Err() != nil {
			return nil
		}
		if registered {
			delay, attempt = 100*time.Millisecond, 0
		}
		// However long the sidecar stays out of reach: a tool host is a service.
		// Not past a TLS failure (a wrong CA, no client certificate for an
		// mTLS listener, TLS to a plain port): no wait will mend that. A
		// refusal after the stream registered is of a result, not of the host.
		if !(c.connectionBroke(ctx, err) && !isTLSFailure(err) || registered && refusedResult(ctx, c, err)) {
			return err
		}
		attempt++
		h.retrying(attempt, err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
		delay = min(delay*2, 5*time.Second)
	}
}

// refusedResult reports whether err, which ended a stream that had
// registered, is the sidecar's refusal of something sent after that: a result
// past its limits (a result_json over max_text_bytes is INVALID_ARGUMENT), for
// which the sidecar fails that call and ends the stream. The host registers
// again, as after a drop; a refusal of the registration itself (a revoked
// token, say) then comes before ToolsRegistered and ends Serve.
func refusedResult(ctx context.Context, c *Client, err error) bool {
	e, ok := FromError(err)
	return ok && e.Reason != "" && !e.local && ctx.Err() == nil && !c.closed()
}

// RetryLogEvery: without an OnRetry, a ToolHost logs the first failed attempt
// and every RetryLogEvery-th after it (about one a minute at the 5 s backoff).
const RetryLogEvery = 12

func (h *ToolHost) retrying(attempt int, err error) {
	if h.OnRetry != nil {
		h.OnRetry(attempt, err)
		return
	}
	if attempt == 1 || attempt%RetryLogEvery == 0 {
		log.Printf("sidecar: ToolHost %q: ServeTools failed (attempt %d), retrying: %v", h.namespace, attempt, err)
	}
}

// isTLSFailure reports whether err is a TLS handshake or certificate failure
// (grpc-go reports them UNAVAILABLE, as it does a refused connection): a CA
// that did not sign the sidecar's certificate, no client certificate for an
// mTLS listener or one it refused (ErrClientCertRefused: it asked for one,
// then closed the connection), TLS to a plain listener. grpc-go keeps only the text. Not a
// connection the peer closed or reset during the handshake ("authentication
// handshake failed: EOF") or, without TLS, before its first byte
// (ErrClosedAtSetup): a proxy whose sidecar is down (Docker's port
// forwarding, say) does that to every connection, and a wait mends it.
func isTLSFailure(err error) bool {
	e, ok := FromError(err)
	if !ok || e.Reason != "" || e.Code != codes.Unavailable {
		return false
	}
	switch {
	case strings.Contains(e.Message, ErrClientCertRefused.Error()):
		return true
	case strings.Contains(e.Message, ErrClosedAtSetup.Error()):
		return false // a proxy whose sidecar is down, or a TLS listener: no telling which
	}
	m := strings.TrimSuffix(e.Message, `"`) // grpc-go quotes the cause: desc = "..."
	if strings.HasSuffix(m, ": EOF") || strings.HasSuffix(m, "connection reset by peer") {
		return false
	}
	return strings.Contains(m, "authentication handshake failed") || strings.Contains(m, "tls: ") ||
		strings.Contains(m, "x509: ")
}

// serveOnce runs one ServeTools stream; registered says the sidecar confirmed
// it. When the stream ends it cancels the ctx of the calls it started and
// returns without waiting for them: their results, which nobody could
// receive any more, are dropped.
func (h *ToolHost) serveOnce(ctx context.Context, c *Client) (registered bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()

	stream, err := c.Tools.ServeTools(sctx)
	if err != nil {
		return false, err
	}
	h.mu.Lock()
	reg := &pb.RegisterTools{Namespace: h.namespace}
	for _, name := range h.order {
		reg.Tools = append(reg.Tools, h.tools[name].spec)
	}
	h.mu.Unlock()
	if err := stream.Send(&pb.ServeToolsRequest{Message: &pb.ServeToolsRequest_Register{Register: reg}}); err != nil {
		if !errors.Is(err, io.EOF) {
			return false, err // raised here (e.g. a name that is not valid UTF-8)
		}
		_, rerr := stream.Recv() // the real reason the stream broke comes from Recv
		return false, rerr
	}
	resp, err := stream.Recv()
	if err != nil {
		return false, err
	}
	if resp.GetRegistered() == nil {
		return false, fmt.Errorf("sidecar: ServeTools: expected ToolsRegistered, got %T", resp.GetMessage())
	}
	h.readyOnce.Do(func() { close(h.ready) })

	var sendMu sync.Mutex // a gRPC stream allows one sender at a time
	for {
		resp, err := stream.Recv()
		if err != nil {
			return true, err
		}
		inv := resp.GetInvocation()
		if inv == nil {
			continue
		}
		go func() {
			res := h.invoke(sctx, inv)
			if sctx.Err() != nil {
				return // this stream is gone: the result cannot be delivered
			}
			sendMu.Lock()
			defer sendMu.Unlock()
			_ = stream.Send(&pb.ServeToolsRequest{Message: &pb.ServeToolsRequest_Result{Result: res}})
		}()
	}
}

// invoke runs one tool call and packs its outcome.
func (h *ToolHost) invoke(ctx context.Context, inv *pb.ToolInvocation) (res *pb.ToolInvocationResult) {
	res = &pb.ToolInvocationResult{InvocationId: inv.GetInvocationId()}
	fail := func(msg string) {
		// Not valid UTF-8 could not be sent, and failing to send ends the stream.
		msg = strings.ToValidUTF8(msg, "\uFFFD")
		res.Ok, res.Error = false, msg
		b, _ := json.Marshal(map[string]string{"error": msg})
		res.ResultJson = string(b)
	}
	h.mu.Lock()
	t := h.tools[inv.GetToolName()]
	h.mu.Unlock()
	if t == nil {
		fail("unknown tool " + inv.GetToolName())
		return res
	}
	ctx = context.WithValue(ctx, invocationKey{}, inv)
	if ms := inv.GetTimeoutMs(); ms > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(ms)*time.Millisecond)
		defer cancel()
	}
	defer func() {
		if p := recover(); p != nil {
			fail(fmt.Sprintf("tool %s panicked: %v", inv.GetToolName(), p))
		}
	}()
	out, err := t.fn(ctx, []byte(inv.GetArgumentsJson()))
	if err != nil {
		fail(err.Error())
		return res
	}
	var b []byte
	if raw, ok := out.(json.RawMessage); ok && json.Valid(raw) {
		b = raw
	} else if b, err = json.Marshal(out); err != nil {
		fail("result is not JSON-serialisable: " + err.Error())
		return res
	}
	res.Ok, res.ResultJson = true, strings.ToValidUTF8(string(b), "\uFFFD") // a json.RawMessage may hold any bytes
	return res
}

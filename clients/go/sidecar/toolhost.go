package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/agent-sidecar/agent-sidecar/clients/go/agentsidecarv1"
)

// ToolFunc implements one hosted tool. args is the model's arguments object
// as JSON. The result is sent as JSON: a json.RawMessage is sent as is, any
// other value goes through json.Marshal. A returned error (or a panic) is
// reported to the sidecar as a failed invocation. ctx ends when the
// sidecar's timeout for the call passes or the host stops; the invocation
// itself is available through InvocationFromContext.
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
type ToolHost struct {
	namespace string

	mu    sync.Mutex
	tools map[string]*hostedTool
	order []string

	ready     chan struct{}
	readyOnce sync.Once
	serving   atomic.Bool
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

// Ready is closed once the sidecar has confirmed the first registration.
func (h *ToolHost) Ready() <-chan struct{} { return h.ready }

// Serve opens ToolService.ServeTools on c, registers the tools, closes
// Ready() when the sidecar confirms, and answers invocations concurrently
// until ctx ends (then it returns nil). If the stream drops it reconnects
// and registers again, for up to the client's resume window; a refusal by
// the sidecar (an error carrying a reason) is returned at once.
func (h *ToolHost) Serve(ctx context.Context, c *Client) error {
	if !h.serving.CompareAndSwap(false, true) {
		return errors.New("sidecar: ToolHost.Serve is already running")
	}
	defer h.serving.Store(false)
	var dropped time.Time
	delay := 100 * time.Millisecond
	for {
		registered, err := h.serveOnce(ctx, c)
		if ctx.Err() != nil {
			return nil
		}
		if registered || dropped.IsZero() {
			dropped, delay = time.Now(), 100*time.Millisecond
		}
		if !c.resumable(ctx, err) || time.Since(dropped) > c.resumeWindow {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
		delay = min(delay*2, 2*time.Second)
	}
}

// serveOnce runs one ServeTools stream; registered says the sidecar confirmed it.
func (h *ToolHost) serveOnce(ctx context.Context, c *Client) (registered bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()

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
		_, rerr := stream.Recv() // the real reason a Send failed comes from Recv
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
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := h.invoke(sctx, inv)
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
	res.Ok, res.ResultJson = true, string(b)
	return res
}

package sidecar

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	pb "github.com/agent-sidecar/agent-sidecar/clients/go/agentsidecarv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// trackingListener remembers accepted connections so a test can cut them.
type trackingListener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

func (l *trackingListener) cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.Close()
	}
	l.conns = nil
}

// fakePrompt serves six frames; Prompt cuts the connection after three.
type fakePrompt struct {
	pb.UnimplementedPromptServiceServer
	lis        *trackingListener
	mu         sync.Mutex
	watchAfter []int64
	auth       []string
}

func (f *fakePrompt) frames(id string) []*pb.ActivityFrame {
	kinds := []string{KindAccepted, KindStarted, KindTextDelta, KindTextDelta, KindUsage, KindCompleted}
	var out []*pb.ActivityFrame
	for i, k := range kinds {
		fr := fr(int64(i+1), k)
		fr.RequestId = id
		out = append(out, fr)
	}
	return out
}

func (f *fakePrompt) Prompt(req *pb.PromptRequest, s grpc.ServerStreamingServer[pb.PromptResponse]) error {
	md, _ := metadata.FromIncomingContext(s.Context())
	f.mu.Lock()
	f.auth = append(f.auth, md.Get("authorization")...)
	f.mu.Unlock()
	for _, fr := range f.frames(req.GetRequestId())[:3] {
		if err := s.Send(&pb.PromptResponse{Frame: fr}); err != nil {
			return err
		}
	}
	time.Sleep(50 * time.Millisecond)
	f.lis.cut()
	<-s.Context().Done()
	return s.Context().Err()
}

func (f *fakePrompt) WatchActivity(req *pb.WatchActivityRequest, s grpc.ServerStreamingServer[pb.WatchActivityResponse]) error {
	if req.GetRequestId() == "hang" { // a turn that never produces a frame
		<-s.Context().Done()
		return nil
	}
	f.mu.Lock()
	f.watchAfter = append(f.watchAfter, req.GetAfterSeq())
	f.mu.Unlock()
	for _, fr := range f.frames(req.GetRequestId())[req.GetAfterSeq()-1:] { // one duplicate on purpose
		if err := s.Send(&pb.WatchActivityResponse{Frame: fr}); err != nil {
			return err
		}
	}
	return nil
}

// fakeTools registers, sends three invocations and collects the results.
type fakeTools struct {
	pb.UnimplementedToolServiceServer
	registered chan *pb.RegisterTools
	results    chan *pb.ToolInvocationResult
}

func (f *fakeTools) ServeTools(s grpc.BidiStreamingServer[pb.ServeToolsRequest, pb.ServeToolsResponse]) error {
	m, err := s.Recv()
	if err != nil {
		return err
	}
	reg := m.GetRegister()
	f.registered <- reg
	names := []string{}
	for _, t := range reg.GetTools() {
		names = append(names, t.GetName())
	}
	s.Send(&pb.ServeToolsResponse{Message: &pb.ServeToolsResponse_Registered{Registered: &pb.ToolsRegistered{Namespace: reg.GetNamespace(), ToolNames: names}}})
	for i, call := range [][2]string{{"t.add", `{"a":2,"b":3}`}, {"t.fail", `{}`}, {"t.missing", `{}`}} {
		inv := &pb.ToolInvocation{InvocationId: string(rune('a' + i)), ToolName: call[0], ArgumentsJson: call[1], TimeoutMs: 1000}
		s.Send(&pb.ServeToolsResponse{Message: &pb.ServeToolsResponse_Invocation{Invocation: inv}})
	}
	for {
		m, err := s.Recv()
		if err != nil {
			return err
		}
		f.results <- m.GetResult()
	}
}

func startFake(t *testing.T) (*fakePrompt, *fakeTools, string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	tl := &trackingListener{Listener: l}
	srv := grpc.NewServer()
	fp := &fakePrompt{lis: tl}
	ft := &fakeTools{registered: make(chan *pb.RegisterTools, 1), results: make(chan *pb.ToolInvocationResult, 3)}
	pb.RegisterPromptServiceServer(srv, fp)
	pb.RegisterToolServiceServer(srv, ft)
	go srv.Serve(tl)
	t.Cleanup(srv.Stop)
	return fp, ft, "unix:" + sock
}

func TestPromptResumesAcrossRealDisconnect(t *testing.T) {
	fp, _, target := startFake(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, target, WithToken("tok"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	frames, err := Collect(c.Prompt(ctx, PromptParams{SessionKey: "k", Text: "hi"}))
	if err != nil {
		t.Fatal(err)
	}
	if got := seqs(frames); !slices.Equal(got, []int64{1, 2, 3, 4, 5, 6}) {
		t.Fatalf("seqs = %v", got)
	}
	if !slices.Equal(fp.watchAfter, []int64{3}) {
		t.Fatalf("WatchActivity after_seq = %v", fp.watchAfter)
	}
	if !slices.Equal(fp.auth, []string{"Bearer tok"}) {
		t.Fatalf("authorization = %v", fp.auth)
	}
}

// The call's own deadline, reached while the stream is connected, ends the
// iterator with DEADLINE_EXCEEDED and no reason, never AGENT_TIMEOUT (as in
// the Python and Node clients).
func TestWatchDeadlineIsClientDeadline(t *testing.T) {
	_, _, target := startFake(t)
	dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(dctx, target)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel2 := context.WithTimeout(dctx, 200*time.Millisecond)
	defer cancel2()
	frames, err := Collect(c.Watch(ctx, WatchParams{RequestID: "hang"}))
	if len(frames) != 0 {
		t.Fatalf("frames = %v", seqs(frames))
	}
	checkClientDeadline(t, err)
}

func TestToolHostServes(t *testing.T) {
	_, ft, target := startFake(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	host := NewToolHost("t")
	host.Register("add", "Add a and b", map[string]any{"type": "object"}, func(ctx context.Context, args []byte) (any, error) {
		if inv, ok := InvocationFromContext(ctx); !ok || inv.GetToolName() != "t.add" {
			return nil, errors.New("no invocation in context")
		}
		return 5, nil
	})
	host.Register("t.fail", "Always fails", `{"type":"object"}`, func(context.Context, []byte) (any, error) {
		return nil, errors.New("boom")
	})
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- host.Serve(sctx, c) }()
	select {
	case <-host.Ready():
	case <-ctx.Done():
		t.Fatal("never ready")
	}
	reg := <-ft.registered
	if reg.GetNamespace() != "t" || len(reg.GetTools()) != 2 || reg.GetTools()[0].GetName() != "t.add" {
		t.Fatalf("register = %v", reg)
	}
	got := map[string]*pb.ToolInvocationResult{}
	for range 3 {
		r := <-ft.results
		got[r.GetInvocationId()] = r
	}
	if r := got["a"]; !r.GetOk() || r.GetResultJson() != "5" {
		t.Fatalf("add: %v", r)
	}
	if r := got["b"]; r.GetOk() || r.GetError() != "boom" {
		t.Fatalf("fail: %v", r)
	}
	if r := got["c"]; r.GetOk() {
		t.Fatalf("missing: %v", r)
	}
	stop()
	if err := <-served; err != nil {
		t.Fatalf("Serve = %v", err)
	}
}

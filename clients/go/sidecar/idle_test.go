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
)

// The idle watchdog of Prompt and Watch (WithStreamIdleTimeout), the
// connection generations it closes, against a real gRPC server on a Unix socket.

// A consumer that takes longer than the idle timeout over a frame is no
// stall: the watchdog is disarmed while the caller has the frame (the Python
// client's timer stayed armed there and cut a healthy call).
func TestIdleWatchdogDoesNotTimeTheCaller(t *testing.T) {
	fp := &scriptedPrompt{prompt: func(_ int, req *pb.PromptRequest, s grpc.ServerStreamingServer[pb.PromptResponse]) error {
		return sendFrames(req, s, 0, 6)
	}}
	const idle = 200 * time.Millisecond
	c := startServer(t, func(s *grpc.Server) { pb.RegisterPromptServiceServer(s, fp) }, WithStreamIdleTimeout(idle))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var got []int64
	for f, err := range c.Prompt(ctx, PromptParams{SessionKey: "k", Text: "slow consumer"}) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, f.Seq)
		if f.Seq <= 2 {
			time.Sleep(3 * idle) // the caller's own work on a frame
		}
	}
	if !slices.Equal(got, []int64{1, 2, 3, 4, 5, 6}) {
		t.Fatalf("seqs = %v", got)
	}
	if prompts, watches := fp.calls(); len(prompts) != 1 || len(watches) != 0 {
		t.Fatalf("the healthy call was cut: Prompt calls %v, WatchActivity after_seq %v", prompts, watches)
	}
}

// stallTools registers a host and sends it one invocation per registration.
type stallTools struct {
	pb.UnimplementedToolServiceServer
	registered chan int
	results    chan string
	mu         sync.Mutex
	n          int
}

func (f *stallTools) ServeTools(s grpc.BidiStreamingServer[pb.ServeToolsRequest, pb.ServeToolsResponse]) error {
	m, err := s.Recv()
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.n++
	n := f.n
	f.mu.Unlock()
	reg := m.GetRegister()
	s.Send(&pb.ServeToolsResponse{Message: &pb.ServeToolsResponse_Registered{Registered: &pb.ToolsRegistered{Namespace: reg.GetNamespace()}}})
	f.registered <- n
	inv := &pb.ToolInvocation{InvocationId: string(rune('0' + n)), ToolName: "t.echo", ArgumentsJson: "{}", TimeoutMs: 5000}
	s.Send(&pb.ServeToolsResponse{Message: &pb.ServeToolsResponse_Invocation{Invocation: inv}})
	for {
		m, err := s.Recv()
		if err != nil {
			return err
		}
		f.results <- m.GetResult().GetInvocationId()
	}
}

// A stream that goes silent (no frame, no keepalive) beside a healthy stream
// and a tool host on the same connection: its watchdog closes the
// connection; the healthy stream resumes and completes, the tool host
// registers again and answers; none ends with an error (Python's client used
// to close its channel under such calls, which cancelled them).
func TestStalledStreamBesideHealthyOnes(t *testing.T) {
	steadyAt3 := make(chan struct{})
	fp := &scriptedPrompt{prompt: func(_ int, req *pb.PromptRequest, s grpc.ServerStreamingServer[pb.PromptResponse]) error {
		switch req.GetText() {
		case "stall": // two frames, then a black hole: nothing more, not even keepalives
			if err := sendFrames(req, s, 0, 2); err != nil {
				return err
			}
			<-s.Context().Done()
			return s.Context().Err()
		default: // three frames, then keepalives (seq 3) until the connection goes
			if err := sendFrames(req, s, 0, 3); err != nil {
				return err
			}
			close(steadyAt3)
			for {
				ka := fr(3, KindKeepalive)
				ka.RequestId = req.GetRequestId()
				if err := s.Send(&pb.PromptResponse{Frame: ka}); err != nil {
					return err
				}
				select {
				case <-s.Context().Done():
					return s.Context().Err()
				case <-time.After(50 * time.Millisecond):
				}
			}
		}
	}}
	ft := &stallTools{registered: make(chan int, 8), results: make(chan string, 8)}
	c := startServer(t, func(s *grpc.Server) {
		pb.RegisterPromptServiceServer(s, fp)
		pb.RegisterToolServiceServer(s, ft)
	}, WithStreamIdleTimeout(500*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	host := NewToolHost("t")
	host.Register("echo", "", nil, func(context.Context, []byte) (any, error) { return "ok", nil })
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- host.Serve(sctx, c) }()
	if n := <-ft.registered; n != 1 {
		t.Fatalf("registration %d", n)
	}
	if id := <-ft.results; id != "1" {
		t.Fatalf("result of %q", id)
	}

	type outcome struct {
		seqs []int64
		err  error
	}
	run := func(text string) chan outcome {
		ch := make(chan outcome, 1)
		go func() {
			frames, err := Collect(c.Prompt(ctx, PromptParams{RequestID: text, SessionKey: "k", Text: text}))
			ch <- outcome{seqs(frames), err}
		}()
		return ch
	}
	steady := run("steady")
	<-steadyAt3
	stalled := run("stall")
	for name, ch := range map[string]chan outcome{"steady": steady, "stall": stalled} {
		o := <-ch
		if o.err != nil || !slices.Equal(o.seqs, []int64{1, 2, 3, 4, 5, 6}) {
			t.Fatalf("%s: seqs %v, err %v", name, o.seqs, o.err)
		}
	}
	_, watches := fp.calls()
	if !slices.Contains(watches, 2) || !slices.Contains(watches, 3) {
		t.Fatalf("WatchActivity after_seq %v: both streams should have resumed", watches)
	}
	// The tool host lost its connection too: it registers again and answers.
	select {
	case n := <-ft.registered:
		if n != 2 {
			t.Fatalf("registration %d", n)
		}
	case err := <-served:
		t.Fatalf("Serve returned %v", err)
	}
	if id := <-ft.results; id != "2" {
		t.Fatalf("result of %q", id)
	}
	stop()
	if err := <-served; err != nil {
		t.Fatalf("Serve = %v", err)
	}
}

// A stream's idle timer closes only the connections of the generation it
// opened its call in: one firing just after another stream's close must not
// kill the connection the others have resumed on since.
func TestConnSetClosesOnlyTheGenerationItSaw(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { b := make([]byte, 1); c.Read(b); c.Close() }()
		}
	}()
	s := &connSet{live: map[net.Conn]struct{}{}}
	ctx := context.Background()
	old, err := s.dial(ctx, "unix://"+sock)
	if err != nil {
		t.Fatal(err)
	}
	seen := s.generation() // two streams opened their calls on old
	if !s.closeGen(seen) { // the first stream's timer
		t.Fatal("the first close did nothing")
	}
	if _, err := old.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("old connection still open: %v", err)
	}
	fresh, err := s.dial(ctx, "unix://"+sock) // the resumed calls
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if s.closeGen(seen) { // the second stream's timer, just after
		t.Fatal("a stale generation closed the fresh connection")
	}
	if _, err := fresh.Write([]byte("x")); err != nil {
		t.Fatalf("fresh connection closed: %v", err)
	}
	if !s.closeGen(s.generation()) { // a stream on the fresh connection may still close it
		t.Fatal("the current generation was not closed")
	}
}

package sidecar

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	pb "github.com/agent-sidecar/agent-sidecar/clients/go/agentsidecarv1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Bad input gets a clear error naming the argument at once: never a hang, a
// silent wrong result, or a long retry of something that can never work.

// startServer serves the services register adds on a fresh Unix socket and
// returns a client connected to it.
func startServer(t *testing.T, register func(*grpc.Server), opts ...Option) *Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	register(srv)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, "unix:"+sock, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// wantInvalidArgument checks err is a local INVALID_ARGUMENT naming field.
func wantInvalidArgument(t *testing.T, what string, err error, field string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) || e.Code != codes.InvalidArgument || !errors.Is(err, ErrInvalidArgument) ||
		len(e.FieldViolations) != 1 || e.FieldViolations[0].Field != field || !strings.Contains(e.Message, field) {
		t.Fatalf("%s: want INVALID_ARGUMENT naming %s, got %#v", what, field, err)
	}
}

func TestPromptRejectsInvalidUTF8UpFront(t *testing.T) {
	fp, _, target := startFake(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	src := &Source{Platform: "local", ChatType: "dm", ChatId: "x"}
	for field, p := range map[string]PromptParams{
		"text":           {Source: src, Text: "caf\xe9"},
		"session_key":    {SessionKey: "agent:main:local:dm:\xff", Text: "hi"},
		"source.chat_id": {Source: &Source{Platform: "local", ChatType: "dm", ChatId: "caf\xe9"}, Text: "hi"},
		"attachments[1].name": {Source: src, Text: "hi",
			Attachments: []*Attachment{{Name: "ok"}, {Name: "\xff"}}},
	} {
		start := time.Now()
		frames, err := Collect(c.Prompt(ctx, p))
		if len(frames) != 0 || time.Since(start) > time.Second {
			t.Fatalf("%s: %d frames after %v", field, len(frames), time.Since(start))
		}
		wantInvalidArgument(t, field, err, field)
	}
	_, err = Collect(c.Watch(ctx, WatchParams{SessionKey: "k\xff"}))
	wantInvalidArgument(t, "Watch", err, "session_key")
	// The resume point a watch does not use: the sidecar refuses it too, never ignores it.
	_, err = Collect(c.Watch(ctx, WatchParams{SessionKey: "k", AfterSeq: 5}))
	wantInvalidArgument(t, "Watch by key with AfterSeq", err, "after_seq")
	_, err = Collect(c.Watch(ctx, WatchParams{RequestID: "r", AfterCursor: 5}))
	wantInvalidArgument(t, "Watch by request with AfterCursor", err, "after_cursor")
	if len(fp.auth) != 0 {
		t.Fatalf("a Prompt reached the server: %v", fp.auth)
	}
	// The raw stubs too, unary and streaming: the field is named, nothing is retried.
	_, err = c.Sessions.GetSession(ctx, &pb.GetSessionRequest{SessionKey: "\xff"})
	wantInvalidArgument(t, "GetSession", err, "session_key")
	_, err = c.Prompts.Prompt(ctx, &pb.PromptRequest{SessionKey: "k", Text: "caf\xe9"})
	wantInvalidArgument(t, "raw Prompt", err, "text")
	_, _, err = c.AppendMessages(ctx, "s", &Message{Role: "user", Content: "ok"}, &Message{Role: "user", Content: "caf\xe9"})
	wantInvalidArgument(t, "AppendMessages", err, "messages[1].content")
}

// rawCreds sends a header value gRPC refuses locally (WithToken refuses it
// in Dial; a raw grpc.DialOption gets past that).
type rawCreds string

func (r rawCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": string(r)}, nil
}
func (rawCreds) RequireTransportSecurity() bool { return false }

// A failure raised on this side (INTERNAL, like an HTTP/2 stream reset) is
// not a dropped connection: Prompt and ToolHost.Serve give up at once
// instead of retrying for the whole resume window.
func TestLocalErrorIsNotResumed(t *testing.T) {
	_, _, target := startFake(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, target, WithDialOptions(grpc.WithPerRPCCredentials(rawCreds("Bearer a\nb"))))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	_, err = Collect(c.Prompt(ctx, PromptParams{SessionKey: "k", Text: "hi"}))
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "non-printable") || time.Since(start) > 2*time.Second {
		t.Fatalf("Prompt: %v after %v", err, time.Since(start))
	}
	host := NewToolHost("t")
	host.Register("x", "", nil, func(context.Context, []byte) (any, error) { return 1, nil })
	start = time.Now()
	if err := host.Serve(ctx, c); status.Code(err) != codes.Internal || time.Since(start) > 2*time.Second {
		t.Fatalf("Serve: %v after %v", err, time.Since(start))
	}
}

func TestDialRejectsUnprintableToken(t *testing.T) {
	for _, tok := range []string{"secret\n", "tök", "a\r\nx-evil: 1", "a\x00b", "\xff"} {
		err := dialLazy(t, "unix:/nonexistent.sock", WithToken(tok))
		if err == nil || !strings.Contains(err.Error(), "WithToken") || strings.Contains(err.Error(), tok) {
			t.Errorf("WithToken(%q): %v", tok, err)
		}
	}
	if err := dialLazy(t, "unix:/nonexistent.sock", WithToken("ok-token_1.2~+/=")); err != nil {
		t.Error(err)
	}
}

// scriptedTools serves ServeTools with a function per stream (0, 1, ...).
type scriptedTools struct {
	pb.UnimplementedToolServiceServer
	mu      sync.Mutex
	streams int
	serve   func(n int, s grpc.BidiStreamingServer[pb.ServeToolsRequest, pb.ServeToolsResponse]) error
}

func (f *scriptedTools) ServeTools(s grpc.BidiStreamingServer[pb.ServeToolsRequest, pb.ServeToolsResponse]) error {
	f.mu.Lock()
	n := f.streams
	f.streams++
	f.mu.Unlock()
	return f.serve(n, s)
}

// register answers the registration message.
func register(s grpc.BidiStreamingServer[pb.ServeToolsRequest, pb.ServeToolsResponse]) error {
	m, err := s.Recv()
	if err != nil {
		return err
	}
	return s.Send(&pb.ServeToolsResponse{Message: &pb.ServeToolsResponse_Registered{
		Registered: &pb.ToolsRegistered{Namespace: m.GetRegister().GetNamespace()}}})
}

func invoke(s grpc.BidiStreamingServer[pb.ServeToolsRequest, pb.ServeToolsResponse], id, tool string) error {
	return s.Send(&pb.ServeToolsResponse{Message: &pb.ServeToolsResponse_Invocation{
		Invocation: &pb.ToolInvocation{InvocationId: id, ToolName: tool, ArgumentsJson: "{}"}}})
}

// stuckHost hosts t.stuck, which ignores its ctx until the test ends, and
// t.polite, which returns when its ctx ends; started gets the name of each
// call that began, politeDone is closed when t.polite saw its ctx end.
func stuckHost(t *testing.T) (host *ToolHost, started chan string, politeDone chan struct{}) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	started, politeDone = make(chan string, 10), make(chan struct{})
	host = NewToolHost("t")
	host.Register("stuck", "", nil, func(context.Context, []byte) (any, error) {
		started <- "stuck"
		<-release
		return 1, nil
	})
	host.Register("polite", "", nil, func(ctx context.Context, _ []byte) (any, error) {
		started <- "polite"
		<-ctx.Done()
		close(politeDone)
		return nil, ctx.Err()
	})
	return host, started, politeDone
}

func TestToolHostServeReturnsDespiteStuckTool(t *testing.T) {
	ft := &scriptedTools{serve: func(_ int, s grpc.BidiStreamingServer[pb.ServeToolsRequest, pb.ServeToolsResponse]) error {
		if err := register(s); err != nil {
			return err
		}
		invoke(s, "1", "t.stuck")
		<-s.Context().Done()
		return nil
	}}
	c := startServer(t, func(s *grpc.Server) { pb.RegisterToolServiceServer(s, ft) })
	host, started, _ := stuckHost(t)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- host.Serve(ctx, c) }()
	<-started
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve still running 5s after its ctx was cancelled: held up by a tool that ignores ctx")
	}
	if !errors.Is(host.Err(), context.Canceled) {
		t.Fatalf("Err = %v", host.Err())
	}
}

// When the stream drops, the calls in flight are cancelled and the host
// registers again at once, even though one of them never returns.
func TestToolHostReregistersDespiteStuckTool(t *testing.T) {
	drop := make(chan struct{})
	registered := make(chan int, 2)
	ft := &scriptedTools{serve: func(n int, s grpc.BidiStreamingServer[pb.ServeToolsRequest, pb.ServeToolsResponse]) error {
		if err := register(s); err != nil {
			return err
		}
		registered <- n
		if n == 0 {
			invoke(s, "1", "t.stuck")
			invoke(s, "2", "t.polite")
			<-drop
			return status.Error(codes.Unavailable, "sidecar restarting")
		}
		<-s.Context().Done()
		return nil
	}}
	c := startServer(t, func(s *grpc.Server) { pb.RegisterToolServiceServer(s, ft) })
	host, started, politeDone := stuckHost(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go host.Serve(ctx, c)
	<-registered
	<-started
	<-started
	close(drop)
	for _, what := range []string{"the polite tool's ctx was not cancelled", "no second registration"} {
		ch := politeDone
		if what == "no second registration" {
			ch = make(chan struct{})
			go func() { <-registered; close(ch) }()
		}
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatalf("5s after the stream dropped: %s", what)
		}
	}
}

// go host.Serve(ctx, c); <-host.Ready() must not hang when Serve stops
// before registering: Ready is closed and Err says why.
func TestToolHostReadyUnblocksWhenServeStops(t *testing.T) {
	ft := &scriptedTools{serve: func(n int, s grpc.BidiStreamingServer[pb.ServeToolsRequest, pb.ServeToolsResponse]) error {
		m, err := s.Recv()
		if err != nil {
			return err
		}
		if m.GetRegister().GetNamespace() == "" {
			st, _ := status.New(codes.InvalidArgument, "register.namespace is required").WithDetails(
				&errdetails.ErrorInfo{Domain: ErrorDomain, Reason: ReasonInvalidArgument})
			return st.Err()
		}
		<-s.Context().Done() // never confirms
		return nil
	}}
	c := startServer(t, func(s *grpc.Server) { pb.RegisterToolServiceServer(s, ft) })
	wait := func(h *ToolHost) {
		t.Helper()
		select {
		case <-h.Ready():
		case <-time.After(5 * time.Second):
			t.Fatal("<-Ready() hangs")
		}
	}

	refused := NewToolHost("")
	if refused.Err() != nil {
		t.Fatal("Err before Serve")
	}
	go refused.Serve(context.Background(), c)
	wait(refused)
	if !IsReason(refused.Err(), ReasonInvalidArgument) {
		t.Fatalf("Err = %v", refused.Err())
	}

	unconfirmed := NewToolHost("t")
	ctx, cancel := context.WithCancel(context.Background())
	go unconfirmed.Serve(ctx, c)
	time.AfterFunc(100*time.Millisecond, cancel)
	wait(unconfirmed)
	if !errors.Is(unconfirmed.Err(), context.Canceled) {
		t.Fatalf("Err = %v", unconfirmed.Err())
	}
}

// fakeSessions records the ListSessions requests.
type fakeSessions struct {
	pb.UnimplementedSessionServiceServer
	mu   sync.Mutex
	list []*pb.ListSessionsRequest
}

// take returns the active_within_seconds of the requests so far and forgets them.
func (f *fakeSessions) take() (secs []int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.list {
		secs = append(secs, r.GetActiveWithinSeconds())
	}
	f.list = nil
	return secs
}

func (f *fakeSessions) ListSessions(_ context.Context, r *pb.ListSessionsRequest) (*pb.ListSessionsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.list = append(f.list, r)
	return &pb.ListSessionsResponse{}, nil
}

func TestIntegerArgumentsDoNotWrap(t *testing.T) {
	fs := &fakeSessions{}
	c := startServer(t, func(s *grpc.Server) { pb.RegisterSessionServiceServer(s, fs) })
	ctx := context.Background()
	var big int64 = 1<<32 + 1 // would become 1
	if math.MaxInt == math.MaxInt32 {
		t.Skip("int is 32 bits")
	}
	for _, n := range []int64{big, 1 << 31, math.MinInt32 - 1} {
		_, err := c.RewindSession(ctx, "s", int(n))
		wantInvalidArgument(t, "RewindSession", err, "n")
	}
	_, err := c.SearchMessages(ctx, "q", "", int(big-1))
	wantInvalidArgument(t, "SearchMessages", err, "limit")

	for d, want := range map[time.Duration]int64{500 * time.Millisecond: 1, time.Nanosecond: 1,
		time.Second: 1, 1500 * time.Millisecond: 2, 0: 0, math.MaxInt64: math.MaxInt64/int64(time.Second) + 1} {
		if _, err := Collect2(c.ListSessions(ctx, "", d)); err != nil {
			t.Fatal(err)
		}
		if got := fs.take(); len(got) != 1 || got[0] != want {
			t.Fatalf("activeWithin %v: sent active_within_seconds %v, want %d", d, got, want)
		}
	}
	_, err = Collect2(c.ListSessions(ctx, "", -500*time.Millisecond))
	wantInvalidArgument(t, "ListSessions", err, "activeWithin")
	if got := fs.take(); len(got) != 0 {
		t.Fatal("a negative activeWithin was sent")
	}
}

// Collect2 drains a Seq2 of sessions.
func Collect2(seq func(func(*Session, error) bool)) (out []*Session, err error) {
	for s, e := range seq {
		if e != nil {
			return out, e
		}
		out = append(out, s)
	}
	return out, nil
}

// dialRefused dials target, not lazily (a target it took would wait out the
// 3 s context): how long Dial took, and its error.
func dialRefused(target string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	c, err := Dial(ctx, target)
	if err == nil {
		c.Close()
	}
	return time.Since(start), err
}

func TestDialRejectsMalformedTargets(t *testing.T) {
	for _, target := range []string{"", "host:", ":99999", "localhost:99999", "localhost:0", "unix:", "unix://",
		"unix-abstract:", "127.0.0.1:-1", "tcp:", "tcp://", "dns:///", "dns:///host:", "a b:80",
		"   ", "[::1", "[::1]:", "host:port", "unix:" + t.TempDir(),
		// Outside the targets every client takes (TargetForms): no port, no host, another scheme.
		":7700", "sidecar", "::1", "passthrough:///bufnet", "relative/s.sock", "http://127.0.0.1:1",
		// As the Python client reads them (_args.normalize_target): a signed port, a bracketed
		// host that is no IPv6 address, a scheme in capitals, an authority without a path.
		"localhost:+80", "[::1]:+80", "dns:localhost:+80", "tcp:localhost:+80", "localhost:-80", "localhost: 80",
		"[127.0.0.1]:80", "[localhost]:80", "[]:80", "[::1]80", "DNS:///localhost:1", "Unix:/tmp/s.sock",
		"dns:", "dns:localhost", "dns://auth", "dns:///[::1]", "unix-abstract://x", "unix://localhost", "unix:/",
		" localhost:80", "localhost:80 ", "a*b:80", "ipv4:127.0.0.1:80", "localhost:٣"} {
		took, err := dialRefused(target)
		if !errors.Is(err, ErrInvalidTarget) || took > time.Second || !strings.Contains(err.Error(), target) {
			t.Errorf("Dial(%q): %v after %v", target, err, took)
		}
	}
	// Targets gRPC can dial are still accepted.
	for _, target := range append(append([]string{"unix:rel/s.sock", "unix:/abs/s.sock", "unix:///abs/s.sock",
		"unix-abstract:name", "dns:///localhost:1", "dns:localhost:1", "tcp://127.0.0.1:1", "tcp:127.0.0.1:1",
		"/abs/s.sock", "./rel/s.sock", "../rel/s.sock", "[fe80::1]:80", "my_host.internal:65535",
		// As the Python client reads them: an authority before a unix path is dropped, a port may
		// have leading zeros, a host name has no length limit here.
		"unix://localhost/abs/s.sock", "unix-abstract:///name", "dns:127.0.0.1:1", "dns://8.8.8.8/localhost:1",
		"[::1]:1", "[::ffff:127.0.0.1]:1", "localhost:0080", strings.Repeat("a", 300) + ":80"},
		localTargets...), remoteTargets...) {
		if err := dialLazy(t, target); err != nil {
			t.Errorf("Dial(%q): %v", target, err)
		}
	}
}

// unix://AUTHORITY/PATH is the socket PATH (grpc-go's resolver refuses an
// authority, so the client drops it): it reaches a sidecar listening there.
func TestUnixTargetWithAuthorityDialsItsPath(t *testing.T) {
	_, _, target := startFake(t)
	path := strings.TrimPrefix(target, "unix:")
	for _, form := range []string{"unix://localhost" + path, "unix://" + path, path} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := Dial(ctx, form)
		cancel()
		if err != nil {
			t.Fatalf("Dial(%q): %v", form, err)
		}
		c.Close()
	}
}

// A Unix socket path past the 107 bytes of a sockaddr_un (less its NUL) can
// never reach a sidecar: Dial used to wait for ctx and fail "not ready
// (TRANSIENT_FAILURE): context deadline exceeded".
func TestDialRejectsUnixPathsPast107Bytes(t *testing.T) {
	s := strings.Repeat
	for target, n := range map[string]int{
		"unix:/tmp/" + s("s", 110):               115,
		"unix:/tmp/" + s("s", 103):               108, // one byte too many
		"unix:///tmp/" + s("s", 103):             108, // the path is /tmp/sss...
		"unix:" + s("s", 108):                    108, // relative
		"unix:/tmp/" + s("é", 52):                109, // bytes of UTF-8, not characters
		"unix:/tmp/" + s("s", 100) + "%41%42%43": 108, // the resolver decodes percent-escapes
		"unix-abstract:" + s("s", 108):           108,
	} {
		took, err := dialRefused(target)
		want := fmt.Sprintf("sidecar: dial %q: invalid target: a Unix socket path may be at most 107 bytes; this one is %d", target, n)
		if !errors.Is(err, ErrInvalidTarget) || err.Error() != want || took > time.Second {
			t.Errorf("Dial(%q): %v after %v; want %s", target, err, took, want)
		}
	}
	for _, target := range []string{"unix:/tmp/" + s("s", 102), "unix:///tmp/" + s("s", 102), "unix:" + s("s", 107),
		"unix:/tmp/" + s("é", 51), "unix:/tmp/" + s("s", 99) + "%41%42%43", "unix-abstract:" + s("s", 107)} {
		if err := dialLazy(t, target); err != nil { // exactly 107 bytes
			t.Errorf("Dial(%q): %v", target, err)
		}
	}
}

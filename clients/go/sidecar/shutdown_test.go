package sidecar

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	pb "github.com/agent-sidecar/agent-sidecar/clients/go/agentsidecarv1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A sidecar stopping cleanly (SIGTERM) shuts its gRPC server down, which
// cancels the calls that reached the connection at that instant: status
// CANCELLED, details "CANCELLED", no ErrorInfo. The turn may never have been
// taken, so the client resumes (re-sends the idempotent Prompt, or watches
// after the last seq), as the Python client does. A CANCELLED carrying the
// sidecar's ErrorInfo (a turn cancelled on purpose) and a cancellation this
// side caused (a closed Client) are final.

// scriptedPrompt answers Prompt with a function per call (0, 1, ...) and
// WatchActivity with the six frames after after_seq; it records the request
// id of each Prompt call and the after_seq of each WatchActivity call.
type scriptedPrompt struct {
	pb.UnimplementedPromptServiceServer
	mu         sync.Mutex
	promptIDs  []string
	watchAfter []int64
	prompt     func(n int, req *pb.PromptRequest, s grpc.ServerStreamingServer[pb.PromptResponse]) error
}

func (f *scriptedPrompt) Prompt(req *pb.PromptRequest, s grpc.ServerStreamingServer[pb.PromptResponse]) error {
	f.mu.Lock()
	n := len(f.promptIDs)
	f.promptIDs = append(f.promptIDs, req.GetRequestId())
	f.mu.Unlock()
	return f.prompt(n, req, s)
}

func (f *scriptedPrompt) WatchActivity(req *pb.WatchActivityRequest, s grpc.ServerStreamingServer[pb.WatchActivityResponse]) error {
	f.mu.Lock()
	f.watchAfter = append(f.watchAfter, req.GetAfterSeq())
	f.mu.Unlock()
	for _, fr := range (&fakePrompt{}).frames(req.GetRequestId())[req.GetAfterSeq():] {
		if err := s.Send(&pb.WatchActivityResponse{Frame: fr}); err != nil {
			return err
		}
	}
	return nil
}

func (f *scriptedPrompt) calls() (promptIDs []string, watchAfter []int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.promptIDs), slices.Clone(f.watchAfter)
}

// sendFrames sends frames [from, to) of the six-frame turn of req.
func sendFrames(req *pb.PromptRequest, s grpc.ServerStreamingServer[pb.PromptResponse], from, to int) error {
	for _, fr := range (&fakePrompt{}).frames(req.GetRequestId())[from:to] {
		if err := s.Send(&pb.PromptResponse{Frame: fr}); err != nil {
			return err
		}
	}
	return nil
}

// What grpc-go's server shutdown sends for a call in flight.
var errShutdownCancel = status.Error(codes.Canceled, "CANCELLED")

func TestPromptResumesServerShutdownCancel(t *testing.T) {
	for name, first := range map[string]error{
		"cancelled": errShutdownCancel,
		"unknown":   status.Error(codes.Unknown, "transport: the stream is done"),
	} {
		t.Run(name, func(t *testing.T) {
			fp := &scriptedPrompt{prompt: func(n int, req *pb.PromptRequest, s grpc.ServerStreamingServer[pb.PromptResponse]) error {
				if n == 0 {
					return first // nothing sent: the turn was never taken
				}
				return sendFrames(req, s, 0, 6)
			}}
			c := startServer(t, func(s *grpc.Server) { pb.RegisterPromptServiceServer(s, fp) })
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			frames, err := Collect(c.Prompt(ctx, PromptParams{SessionKey: "k", Text: "hi"}))
			if err != nil {
				t.Fatalf("Prompt: %v (frames %v)", err, seqs(frames))
			}
			if got := seqs(frames); !slices.Equal(got, []int64{1, 2, 3, 4, 5, 6}) || frames[5].Kind() != KindCompleted {
				t.Fatalf("seqs = %v", got)
			}
			ids, watches := fp.calls()
			if len(ids) != 2 || ids[0] == "" || ids[0] != ids[1] || len(watches) != 0 {
				t.Fatalf("Prompt calls (request ids) %q, WatchActivity calls (after_seq) %v; want two Prompts with one request id", ids, watches)
			}
		})
	}
}

// Cancelled by the shutdown after some frames got through: the iterator
// resumes with WatchActivity after the last seq, no gap, no duplicate.
func TestPromptResumesServerShutdownCancelMidTurn(t *testing.T) {
	fp := &scriptedPrompt{prompt: func(n int, req *pb.PromptRequest, s grpc.ServerStreamingServer[pb.PromptResponse]) error {
		if err := sendFrames(req, s, 0, 3); err != nil {
			return err
		}
		return errShutdownCancel
	}}
	c := startServer(t, func(s *grpc.Server) { pb.RegisterPromptServiceServer(s, fp) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	frames, err := Collect(c.Prompt(ctx, PromptParams{RequestID: "r-mid", SessionKey: "k", Text: "hi"}))
	if err != nil {
		t.Fatalf("Prompt: %v (frames %v)", err, seqs(frames))
	}
	if got := seqs(frames); !slices.Equal(got, []int64{1, 2, 3, 4, 5, 6}) {
		t.Fatalf("seqs = %v", got)
	}
	if ids, watches := fp.calls(); !slices.Equal(ids, []string{"r-mid"}) || !slices.Equal(watches, []int64{3}) {
		t.Fatalf("Prompt calls %q, WatchActivity after_seq %v", ids, watches)
	}
}

// CANCELLED with the sidecar's ErrorInfo (reason CANCELLED: Cancel,
// SuspendSession, an INTERRUPT) is the sidecar's answer: the typed error, at
// once, and the Prompt is not sent again.
func TestPromptDoesNotResumeSidecarCancelled(t *testing.T) {
	st, err := status.New(codes.Canceled, "cancelled by INTERRUPT").WithDetails(
		&errdetails.ErrorInfo{Domain: ErrorDomain, Reason: ReasonCancelled})
	if err != nil {
		t.Fatal(err)
	}
	fp := &scriptedPrompt{prompt: func(int, *pb.PromptRequest, grpc.ServerStreamingServer[pb.PromptResponse]) error {
		return st.Err()
	}}
	c := startServer(t, func(s *grpc.Server) { pb.RegisterPromptServiceServer(s, fp) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	frames, err := Collect(c.Prompt(ctx, PromptParams{SessionKey: "k", Text: "hi"}))
	var e *Error
	if len(frames) != 0 || !errors.As(err, &e) || e.Code != codes.Canceled || e.Reason != ReasonCancelled ||
		!errors.Is(err, ErrCancelled) || errors.Is(err, context.Canceled) {
		t.Fatalf("frames %v, err %#v; want the typed CANCELLED error", seqs(frames), err)
	}
	if time.Since(start) > 2*time.Second {
		t.Fatalf("took %v", time.Since(start))
	}
	if ids, _ := fp.calls(); len(ids) != 1 {
		t.Fatalf("Prompt sent %d times", len(ids))
	}
}

// A closed Client fails calls CANCELLED ("grpc: the client connection is
// closing") while ctx is alive: that is no dropped connection, so Prompt
// returns at once instead of retrying for the 30 s resume window, whether
// the Client was closed before the prompt or during its stream.
func TestPromptOnClosedClientIsNotResumed(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	fp := &scriptedPrompt{prompt: func(_ int, req *pb.PromptRequest, s grpc.ServerStreamingServer[pb.PromptResponse]) error {
		if err := sendFrames(req, s, 0, 1); err != nil {
			return err
		}
		select { // the turn goes on until the client leaves
		case <-s.Context().Done():
		case <-release:
		}
		return nil
	}}
	c := startServer(t, func(s *grpc.Server) { pb.RegisterPromptServiceServer(s, fp) }, WithResumeWindow(30*time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// Closed during the stream, after the first frame.
	start := time.Now()
	var frames []*Frame
	var err error
	for f, ferr := range c.Prompt(ctx, PromptParams{SessionKey: "k", Text: "hi"}) {
		if ferr != nil {
			err = ferr
			break
		}
		frames = append(frames, f)
		c.Close()
	}
	if len(frames) != 1 || status.Code(err) != codes.Canceled || errors.Is(err, context.Canceled) || time.Since(start) > 2*time.Second {
		t.Fatalf("closed mid-stream: frames %v, err %v after %v; want CANCELLED at once", seqs(frames), err, time.Since(start))
	}

	// Closed before the prompt.
	start = time.Now()
	frames, err = Collect(c.Prompt(ctx, PromptParams{SessionKey: "k", Text: "hi"}))
	if len(frames) != 0 || status.Code(err) != codes.Canceled || time.Since(start) > 2*time.Second {
		t.Fatalf("closed before: frames %v, err %v after %v; want CANCELLED at once", seqs(frames), err, time.Since(start))
	}
	if ids, watches := fp.calls(); len(ids) != 1 || len(watches) != 0 {
		t.Fatalf("Prompt calls %q, WatchActivity calls %v; want only the first Prompt", ids, watches)
	}

	// ToolHost.Serve, which resumes the same way, returns too.
	host := NewToolHost("t")
	start = time.Now()
	if err := host.Serve(ctx, c); status.Code(err) != codes.Canceled || time.Since(start) > 2*time.Second {
		t.Fatalf("Serve on a closed Client: %v after %v; want CANCELLED at once", err, time.Since(start))
	}
}

package sidecar

import (
	"context"
	"errors"
	"io"
	"slices"
	"testing"
	"time"

	pb "github.com/agent-sidecar/agent-sidecar/clients/go/agentsidecarv1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fr builds a frame of the given kind and seq.
func fr(seq int64, kind string) *pb.ActivityFrame {
	f := &pb.ActivityFrame{RequestId: "r1", Seq: seq, Cursor: 100 + seq}
	switch kind {
	case KindAccepted:
		f.Event = &pb.ActivityFrame_Accepted_{Accepted: &pb.ActivityFrame_Accepted{}}
	case KindStarted:
		f.Event = &pb.ActivityFrame_Started_{Started: &pb.ActivityFrame_Started{}}
	case KindTextDelta:
		f.Event = &pb.ActivityFrame_TextDelta_{TextDelta: &pb.ActivityFrame_TextDelta{Text: "x"}}
	case KindUsage:
		f.Event = &pb.ActivityFrame_Usage{Usage: &pb.Usage{}}
	case KindCompleted:
		f.Event = &pb.ActivityFrame_Completed_{Completed: &pb.ActivityFrame_Completed{FinalText: "done"}}
	case KindFailed:
		f.Event = &pb.ActivityFrame_Failed_{Failed: &pb.ActivityFrame_Failed{Reason: ReasonCancelled, Message: "stopped"}}
	case KindKeepalive:
		f.Event = &pb.ActivityFrame_Keepalive_{Keepalive: &pb.ActivityFrame_Keepalive{}}
	}
	return f
}

func TestSeqFilter(t *testing.T) {
	f := &seqFilter{}
	steps := []struct {
		frame *pb.ActivityFrame
		want  verdict
	}{
		{fr(1, KindAccepted), emit},
		{fr(1, KindKeepalive), skip},
		{fr(1, KindAccepted), skip}, // duplicate
		{fr(2, KindStarted), emit},
		{fr(4, KindTextDelta), gap}, // 3 missing
		{fr(3, KindTextDelta), emit},
		{fr(2, KindStarted), skip},
		{fr(4, KindTextDelta), emit},
		{nil, skip},
	}
	for i, s := range steps {
		if got := f.admit(s.frame); got != s.want {
			t.Fatalf("step %d: admit(seq %d) = %v, want %v", i, s.frame.GetSeq(), got, s.want)
		}
	}
	if f.last != 4 {
		t.Fatalf("last = %d", f.last)
	}
}

func TestCursorFilter(t *testing.T) {
	f := &cursorFilter{last: 101}
	got := []verdict{f.admit(fr(1, KindAccepted)), f.admit(fr(2, KindStarted)), f.admit(fr(2, KindKeepalive)), f.admit(fr(2, KindStarted))}
	if !slices.Equal(got, []verdict{skip, emit, skip, skip}) {
		t.Fatalf("got %v", got)
	}
}

// A live watch's first keepalive carries the cursor it starts after: a drop
// before any frame resumes there, not "live" again (AfterCursor 0).
func TestCursorFilterResumesFromAKeepalivesCursor(t *testing.T) {
	f := &cursorFilter{}
	head := fr(0, KindKeepalive)
	head.Cursor = 40
	stale := fr(0, KindKeepalive)
	stale.Cursor = 30
	if f.admit(head) != skip || f.point() != 40 || f.admit(stale) != skip || f.point() != 40 {
		t.Fatalf("point = %d, want 40", f.point())
	}
	next := fr(1, KindAccepted)
	next.Cursor = 41
	if f.admit(next) != emit || f.point() != 41 {
		t.Fatalf("point = %d, want 41", f.point())
	}
}

// attempt scripts one stream: either open fails, or frames then err.
type attempt struct {
	openErr error
	frames  []*pb.ActivityFrame
	end     error
}

var errDrop = status.Error(codes.Unavailable, "error reading from server: EOF")

// runScript drives follow over scripted streams, recording the resume point
// each stream was opened with.
func runScript(t *testing.T, window time.Duration, script []attempt) (frames []*Frame, errs []error, opens []int64) {
	t.Helper()
	return runScriptCtx(t, context.Background(), window, script)
}

func runScriptCtx(t *testing.T, ctx context.Context, window time.Duration, script []attempt) (frames []*Frame, errs []error, opens []int64) {
	t.Helper()
	c := &Client{resumeWindow: window}
	filter := &seqFilter{}
	n := 0
	open := func(ctx context.Context) (recvFunc, error) {
		opens = append(opens, filter.last)
		if n >= len(script) {
			return nil, errDrop
		}
		a := script[n]
		n++
		if a.openErr != nil {
			return nil, a.openErr
		}
		i := 0
		return func() (*pb.ActivityFrame, error) {
			if i < len(a.frames) {
				i++
				return a.frames[i-1], nil
			}
			if a.end == nil {
				return nil, io.EOF
			}
			return nil, a.end
		}, nil
	}
	c.follow(ctx, open, filter, true, false, func(f *Frame, err error) bool {
		if err != nil {
			errs = append(errs, err)
		} else {
			frames = append(frames, f)
		}
		return true
	})
	return frames, errs, opens
}

func seqs(frames []*Frame) []int64 {
	var out []int64
	for _, f := range frames {
		out = append(out, f.Seq)
	}
	return out
}

func TestFollowResumesWithoutGapOrDuplicate(t *testing.T) {
	frames, errs, opens := runScript(t, 5*time.Second, []attempt{
		{frames: []*pb.ActivityFrame{fr(1, KindAccepted), fr(2, KindStarted), fr(3, KindTextDelta)}, end: errDrop},
		// The resumed stream overlaps what was already seen and sends a keepalive.
		{frames: []*pb.ActivityFrame{fr(2, KindStarted), fr(3, KindTextDelta), fr(4, KindTextDelta), fr(4, KindKeepalive)}, end: errors.New("read: connection reset")},
		{openErr: errDrop}, // sidecar restarting
		{frames: []*pb.ActivityFrame{fr(6, KindCompleted)}},                                         // a gap: 5 is missing
		{frames: []*pb.ActivityFrame{fr(5, KindUsage), fr(6, KindCompleted), fr(7, KindTextDelta)}}, // ends at 6
	})
	if len(errs) != 0 {
		t.Fatalf("errors: %v", errs)
	}
	if got := seqs(frames); !slices.Equal(got, []int64{1, 2, 3, 4, 5, 6}) {
		t.Fatalf("seqs = %v", got)
	}
	if !slices.Equal(opens, []int64{0, 3, 4, 4, 4}) {
		t.Fatalf("resume points = %v", opens)
	}
	if frames[len(frames)-1].Kind() != KindCompleted {
		t.Fatal("last frame is not completed")
	}
}

func TestFollowFailedFrameThenTypedError(t *testing.T) {
	st, _ := status.New(codes.Canceled, "cancelled by user").WithDetails(&errdetails.ErrorInfo{Domain: ErrorDomain, Reason: ReasonCancelled})
	for _, end := range []error{convertError(context.Background(), st.Err()), nil} {
		frames, errs, _ := runScript(t, time.Second, []attempt{
			{frames: []*pb.ActivityFrame{fr(1, KindAccepted), fr(2, KindFailed)}, end: end},
		})
		if len(frames) != 2 || frames[1].Kind() != KindFailed {
			t.Fatalf("frames = %v", seqs(frames))
		}
		if len(errs) != 1 || !IsReason(errs[0], ReasonCancelled) {
			t.Fatalf("errs = %v", errs)
		}
		var e *Error
		if !errors.As(errs[0], &e) || e.Code != codes.Canceled {
			t.Fatalf("not a typed error: %v", errs[0])
		}
	}
}

func TestFollowDoesNotResumeSidecarErrors(t *testing.T) {
	st, _ := status.New(codes.Aborted, "busy").WithDetails(&errdetails.ErrorInfo{Domain: ErrorDomain, Reason: ReasonAgentBusy})
	// LLM_API_FAILURE is UNAVAILABLE too, but carries a reason: never resumed.
	st2, _ := status.New(codes.Unavailable, "model down").WithDetails(&errdetails.ErrorInfo{Domain: ErrorDomain, Reason: ReasonLLMAPIFailure})
	for _, s := range []*status.Status{st, st2} {
		frames, errs, opens := runScript(t, 5*time.Second, []attempt{{end: convertError(context.Background(), s.Err())}})
		if len(frames) != 0 || len(errs) != 1 || len(opens) != 1 {
			t.Fatalf("frames %v errs %v opens %v", seqs(frames), errs, opens)
		}
		if r := s.Details()[0].(*errdetails.ErrorInfo).Reason; !IsReason(errs[0], r) {
			t.Fatalf("err = %v, want %s", errs[0], r)
		}
	}
}

func TestFollowGivesUpAfterResumeWindow(t *testing.T) {
	start := time.Now()
	frames, errs, opens := runScript(t, 300*time.Millisecond, []attempt{
		{frames: []*pb.ActivityFrame{fr(1, KindAccepted)}, end: errDrop},
	})
	if len(frames) != 1 || len(errs) != 1 || status.Code(errs[0]) != codes.Unavailable {
		t.Fatalf("frames %v errs %v", seqs(frames), errs)
	}
	if len(opens) < 3 || time.Since(start) > 3*time.Second {
		t.Fatalf("opens %v after %v", opens, time.Since(start))
	}
}

func TestFollowStopsWhenCallerBreaks(t *testing.T) {
	c := &Client{resumeWindow: time.Second}
	opens := 0
	open := func(ctx context.Context) (recvFunc, error) {
		opens++
		return func() (*pb.ActivityFrame, error) { return fr(int64(opens), KindAccepted), nil }, nil
	}
	calls := 0
	c.follow(context.Background(), open, &seqFilter{}, true, false, func(*Frame, error) bool { calls++; return false })
	if calls != 1 || opens != 1 {
		t.Fatalf("calls %d opens %d", calls, opens)
	}
}

// The deadline passing while the iterator waits to reconnect is
// DEADLINE_EXCEEDED without a reason too, not a bare context.DeadlineExceeded; a cancelled context is an *Error.
func TestFollowDeadlineDuringOutage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	frames, errs, opens := runScriptCtx(t, ctx, 10*time.Second, []attempt{
		{frames: []*pb.ActivityFrame{fr(1, KindAccepted)}, end: errDrop},
	})
	if len(frames) != 1 || len(errs) != 1 || len(opens) < 2 {
		t.Fatalf("frames %v errs %v opens %v", seqs(frames), errs, opens)
	}
	checkClientDeadline(t, errs[0])

	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	_, errs, _ = runScriptCtx(t, ctx, 10*time.Second, nil)
	var e *Error
	if len(errs) != 1 || !errors.As(errs[0], &e) || e.Code != codes.Canceled || e.Reason != "" || !errors.Is(errs[0], context.Canceled) {
		t.Fatalf("errs = %#v", errs)
	}
}

// A status DEADLINE_EXCEEDED with no sidecar reason is the call's own deadline
// (DEADLINE_EXCEEDED, no reason).
func TestFollowDeadlineStatusIsClientDeadline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	<-ctx.Done()
	_, errs, _ := runScriptCtx(t, ctx, time.Second, []attempt{
		{openErr: convertError(ctx, status.Error(codes.DeadlineExceeded, "context deadline exceeded"))},
	})
	if len(errs) != 1 {
		t.Fatalf("errs = %v", errs)
	}
	checkClientDeadline(t, errs[0])
}

// Giving up on a seq gap or an I/O error yields an *Error with code
// UNAVAILABLE and no reason.
func TestFollowGiveUpIsUnavailableError(t *testing.T) {
	for name, a := range map[string]attempt{
		"gap":   {frames: []*pb.ActivityFrame{fr(1, KindAccepted), fr(3, KindTextDelta)}},
		"reset": {frames: []*pb.ActivityFrame{fr(1, KindAccepted)}, end: errors.New("read: connection reset")},
	} {
		// A zero window disables resume, so the first break is final.
		frames, errs, _ := runScript(t, 0, []attempt{a})
		var e *Error
		if len(frames) != 1 || len(errs) != 1 || !errors.As(errs[0], &e) {
			t.Fatalf("%s: frames %v errs %#v", name, seqs(frames), errs)
		}
		if e.Code != codes.Unavailable || e.Reason != "" || status.Code(errs[0]) != codes.Unavailable {
			t.Fatalf("%s: got %+v", name, e)
		}
		if errors.Is(errs[0], io.EOF) {
			t.Fatalf("%s: io.EOF leaks through (callers read it as a clean end)", name)
		}
	}
}

// grpc-go reports an HTTP/2 reset stream (e.g. from a proxy) as INTERNAL with
// no details: resumed like UNAVAILABLE. With a sidecar reason it is final.
func TestFollowResumesInternalWithoutReason(t *testing.T) {
	rst := status.Error(codes.Internal, "stream terminated by RST_STREAM with error code: INTERNAL_ERROR")
	frames, errs, opens := runScript(t, 5*time.Second, []attempt{
		{frames: []*pb.ActivityFrame{fr(1, KindAccepted)}, end: convertError(context.Background(), rst)},
		{frames: []*pb.ActivityFrame{fr(2, KindCompleted)}},
	})
	if len(errs) != 0 || !slices.Equal(seqs(frames), []int64{1, 2}) || !slices.Equal(opens, []int64{0, 1}) {
		t.Fatalf("frames %v errs %v opens %v", seqs(frames), errs, opens)
	}
	st, _ := status.New(codes.Internal, "bug").WithDetails(&errdetails.ErrorInfo{Domain: ErrorDomain, Reason: "SOMETHING_NEW"})
	_, errs, opens = runScript(t, 5*time.Second, []attempt{{end: convertError(context.Background(), st.Err())}})
	if len(errs) != 1 || len(opens) != 1 || !IsReason(errs[0], "SOMETHING_NEW") {
		t.Fatalf("errs %v opens %v", errs, opens)
	}
}

// A request's stream that ends OK is final (the sidecar ends one so only once
// the turn is over): a Prompt's without its terminal frame lost the rest of
// the turn (ErrFramesGone, at once, not after the resume window); a Watch the
// caller opened past the terminal frame ends cleanly, with no frame.
func TestFollowCleanEndIsFinal(t *testing.T) {
	frames, errs, opens := runScript(t, 10*time.Second, []attempt{{frames: []*pb.ActivityFrame{fr(1, KindAccepted)}}})
	if len(frames) != 1 || len(errs) != 1 || len(opens) != 1 || !errors.Is(errs[0], ErrFramesGone) {
		t.Fatalf("frames %v errs %v opens %v", seqs(frames), errs, opens)
	}
	c := &Client{resumeWindow: 10 * time.Second}
	n := 0
	open := func(ctx context.Context) (recvFunc, error) {
		n++
		return func() (*pb.ActivityFrame, error) { return nil, io.EOF }, nil
	}
	c.follow(context.Background(), open, &seqFilter{last: 9}, true, true, func(f *Frame, err error) bool {
		t.Fatalf("yielded %v %v", f, err)
		return false
	})
	if n != 1 {
		t.Fatalf("opened %d times", n)
	}
}

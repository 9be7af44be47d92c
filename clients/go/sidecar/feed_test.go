package sidecar

import (
	"context"
	"io"
	"slices"
	"testing"
	"time"

	pb "github.com/agent-sidecar/agent-sidecar/clients/go/agentsidecarv1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestFeedTooSlowResumesFromItsCursor: the sidecar ends a session or platform
// watch whose reader stalled with STREAM_TOO_SLOW, naming the cursor to resume
// from (the frames are persisted: nothing is lost). The feed reopens from its
// last cursor, as a request's stream does with its seq, instead of ending a
// watch that "follows every turn until ctx ends" with the error. (Against a
// real sidecar a platform watch left unread while large turns streamed ended
// this way.)
func TestFeedTooSlowResumesFromItsCursor(t *testing.T) {
	st, err := status.New(codes.ResourceExhausted, "the stream's client stopped reading ...").WithDetails(
		&errdetails.ErrorInfo{Domain: ErrorDomain, Reason: ReasonStreamTooSlow,
			Metadata: map[string]string{"platform": "p", "after_cursor": "102"}},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(10 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	tooSlow := convertError(context.Background(), st.Err())
	all := []*pb.ActivityFrame{fr(1, KindAccepted), fr(2, KindStarted), fr(3, KindTextDelta), fr(4, KindCompleted)}
	c := &Client{resumeWindow: 5 * time.Second}
	filter := &cursorFilter{}
	var opens []int64
	open := func(context.Context) (recvFunc, error) {
		opens = append(opens, filter.last)
		var frames []*pb.ActivityFrame
		for _, f := range all {
			if f.Cursor > filter.last {
				frames = append(frames, f)
			}
		}
		end := io.EOF
		if len(opens) == 1 {
			frames, end = frames[:2], tooSlow
		}
		return func() (*pb.ActivityFrame, error) {
			if len(frames) == 0 {
				return nil, end
			}
			f := frames[0]
			frames = frames[1:]
			return f, nil
		}, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var cursors []int64
	var errs []error
	c.follow(ctx, open, filter, false, false, func(f *Frame, err error) bool {
		if err != nil {
			errs = append(errs, err)
			return false
		}
		cursors = append(cursors, f.Cursor)
		if len(cursors) == len(all) {
			cancel() // a feed never ends by itself: stop once every frame came
			return false
		}
		return true
	})
	if len(errs) != 0 {
		t.Fatalf("the feed ended with %v after cursors %v", errs, cursors)
	}
	if !slices.Equal(cursors, []int64{101, 102, 103, 104}) {
		t.Fatalf("cursors = %v, want 101..104 once each", cursors)
	}
	if !slices.Equal(opens, []int64{0, 102}) {
		t.Fatalf("opened from %v, want [0 102]", opens)
	}
}

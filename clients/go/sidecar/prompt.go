package sidecar

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"iter"
	"sync/atomic"
	"time"

	pb "github.com/agent-sidecar/agent-sidecar/clients/go/agentsidecarv1"
	"google.golang.org/grpc/codes"
)

// Delivery says what a prompt does when its session already has a turn in flight.
type Delivery = pb.DeliveryMode

// Delivery modes (docs/semantics.md, "Delivery modes").
const (
	DeliveryDefault      = pb.DeliveryMode_DELIVERY_MODE_UNSPECIFIED // FOLLOW_UP
	DeliveryRejectIfBusy = pb.DeliveryMode_DELIVERY_MODE_REJECT_IF_BUSY
	DeliveryFollowUp     = pb.DeliveryMode_DELIVERY_MODE_FOLLOW_UP
	DeliveryQueue        = pb.DeliveryMode_DELIVERY_MODE_QUEUE
	DeliveryInterrupt    = pb.DeliveryMode_DELIVERY_MODE_INTERRUPT
	DeliveryRollback     = pb.DeliveryMode_DELIVERY_MODE_ROLLBACK
	DeliverySteer        = pb.DeliveryMode_DELIVERY_MODE_STEER
)

type (
	// Attachment is a file sent with a prompt.
	Attachment = pb.Attachment
	// Queue is a session's pending follow-up slot and FIFO overflow.
	Queue = pb.GetQueueResponse
)

// PromptParams describes one turn. Give Source or SessionKey.
type PromptParams struct {
	// RequestID is the idempotency key; Prompt generates one when empty.
	// Set it yourself when you need to know it before the first frame.
	RequestID   string
	Source      *Source
	SessionKey  string
	Text        string
	Attachments []*Attachment
	Delivery    Delivery
	// Profile for a session created from Source; "" means "main".
	Profile string
}

// NewRequestID returns a random UUIDv4 string for PromptParams.RequestID.
func NewRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// Prompt runs one turn and returns an iterator over its frames:
//
//	for f, err := range c.Prompt(ctx, p) { ... }
//
// The RPC starts when iteration starts; breaking out of the loop ends it (the
// turn itself goes on in the sidecar). Keepalive frames are skipped. If the
// connection drops mid-turn, the iterator reconnects and resumes with
// WatchActivity(request_id, after_seq=last seen), so the caller sees every
// frame exactly once, in seq order. A turn ending with a failed frame yields
// that frame and then (nil, *Error) carrying its reason. Errors such as
// AGENT_BUSY arrive as (nil, *Error) with no frame before them. When ctx's
// deadline passes the error is DEADLINE_EXCEEDED without a reason (never
// AGENT_TIMEOUT, which is a turn's server-side timeout; errors.Is(err,
// context.DeadlineExceeded) holds); when resuming gives up it is
// UNAVAILABLE without a reason. Ranging the same iterator twice replays the
// turn (same request id, no second turn). A string that is not valid UTF-8
// (Text, SessionKey, a Source field, ...) ends it at once with an
// INVALID_ARGUMENT *Error naming the field, before anything is sent.
func (c *Client) Prompt(ctx context.Context, p PromptParams) iter.Seq2[*Frame, error] {
	req := &pb.PromptRequest{
		RequestId:   p.RequestID,
		Source:      p.Source,
		SessionKey:  p.SessionKey,
		Text:        p.Text,
		Attachments: p.Attachments,
		Delivery:    p.Delivery,
		Profile:     p.Profile,
	}
	if req.RequestId == "" {
		req.RequestId = NewRequestID()
	}
	return func(yield func(*Frame, error) bool) {
		if err := checkUTF8(req); err != nil {
			yield(nil, err)
			return
		}
		filter := &seqFilter{}
		open := func(ctx context.Context) (recvFunc, error) {
			if filter.last == 0 {
				// Nothing acknowledged yet: re-sending the same request id is safe.
				s, err := c.Prompts.Prompt(ctx, req)
				if err != nil {
					return nil, err
				}
				return func() (*pb.ActivityFrame, error) { r, err := s.Recv(); return r.GetFrame(), err }, nil
			}
			return c.watch(ctx, &pb.WatchActivityRequest{RequestId: req.RequestId, AfterSeq: filter.last})
		}
		c.follow(ctx, open, filter, true, false, yield)
	}
}

// WatchParams selects frames to watch: exactly one of RequestID, SessionKey
// and Platform.
type WatchParams struct {
	RequestID  string
	SessionKey string
	Platform   string
	// AfterSeq (with RequestID): replay frames whose seq is greater.
	AfterSeq int64
	// AfterCursor (with SessionKey or Platform): replay frames whose cursor is
	// greater; 0 means live frames only.
	AfterCursor int64
}

// Watch replays persisted frames after a point, then follows live ones.
// With RequestID it behaves like Prompt's iterator (ends at the terminal
// frame, typed error after failed). With SessionKey or Platform it follows
// every turn until ctx ends (the last value is then an *Error wrapping the
// context error; DEADLINE_EXCEEDED without a reason when its deadline passed),
// resuming after the last cursor seen when the connection drops or the
// sidecar ends it with a reason that allows the same call again
// (STREAM_TOO_SLOW when the reader stalled, OVERLOADED, ...); failed frames
// are yielded as frames, not errors.
func (c *Client) Watch(ctx context.Context, p WatchParams) iter.Seq2[*Frame, error] {
	return func(yield func(*Frame, error) bool) {
		if err := checkUTF8(&pb.WatchActivityRequest{RequestId: p.RequestID, SessionKey: p.SessionKey, Platform: p.Platform}); err != nil {
			yield(nil, err)
			return
		}
		if err := checkResumePoint(p); err != nil {
			yield(nil, err)
			return
		}
		if p.RequestID != "" {
			filter := &seqFilter{last: p.AfterSeq}
			open := func(ctx context.Context) (recvFunc, error) {
				return c.watch(ctx, &pb.WatchActivityRequest{RequestId: p.RequestID, AfterSeq: filter.last})
			}
			c.follow(ctx, open, filter, true, true, yield)
			return
		}
		filter := &cursorFilter{last: p.AfterCursor}
		open := func(ctx context.Context) (recvFunc, error) {
			return c.watch(ctx, &pb.WatchActivityRequest{SessionKey: p.SessionKey, Platform: p.Platform, AfterCursor: filter.last})
		}
		c.follow(ctx, open, filter, false, false, yield)
	}
}

// checkResumePoint refuses the resume point a watch does not use, naming it,
// as the sidecar does: AfterSeq applies with RequestID, AfterCursor with
// SessionKey or Platform. Dropped instead, a replay asked for would silently
// become live frames only, losing those it asked for.
func checkResumePoint(p WatchParams) error {
	if p.RequestID != "" && p.AfterCursor != 0 {
		return invalidArgument("after_cursor", "applies only with session_key or platform")
	}
	if p.RequestID == "" && p.AfterSeq != 0 {
		return invalidArgument("after_seq", "applies only with request_id")
	}
	return nil
}

// CancelParams names the turn to stop: a SessionKey or a RequestID.
type CancelParams struct {
	SessionKey string
	RequestID  string
}

// Cancel stops the in-flight turn; it ends with failed{CANCELLED}. It
// reports whether a turn was cancelled.
func (c *Client) Cancel(ctx context.Context, p CancelParams) (bool, error) {
	resp, err := c.Prompts.Cancel(ctx, &pb.CancelRequest{SessionKey: p.SessionKey, RequestId: p.RequestID})
	return resp.GetCancelled(), err
}

// GetQueue returns the session's pending follow-up and queued prompts.
func (c *Client) GetQueue(ctx context.Context, sessionKey string) (*Queue, error) {
	return c.Prompts.GetQueue(ctx, &pb.GetQueueRequest{SessionKey: sessionKey})
}

type recvFunc func() (*pb.ActivityFrame, error)

// watch opens WatchActivity and adapts it to a recvFunc.
func (c *Client) watch(ctx context.Context, req *pb.WatchActivityRequest) (recvFunc, error) {
	s, err := c.Prompts.WatchActivity(ctx, req)
	if err != nil {
		return nil, err
	}
	return func() (*pb.ActivityFrame, error) { r, err := s.Recv(); return r.GetFrame(), err }, nil
}

// follow runs streams opened by open until the turn ends (perRequest), the
// caller stops, ctx ends or resuming fails for longer than the resume window.
// ownWatch: a Watch by request id the caller opened (not a Prompt).
func (c *Client) follow(ctx context.Context, open func(context.Context) (recvFunc, error),
	filter frameFilter, perRequest, ownWatch bool, yield func(*Frame, error) bool) {
	var dropped time.Time
	delay := 50 * time.Millisecond
	seen := false
	for {
		progressed, done, err := c.runAttempt(ctx, open, filter, perRequest, yield)
		if done {
			return
		}
		seen = seen || progressed
		if perRequest && errors.Is(err, io.EOF) {
			// The sidecar ends a request's stream OK only once the turn is over.
			if ownWatch && !seen {
				return // the caller's watch: nothing after its after_seq
			}
			yield(nil, &Error{Code: codes.DataLoss, Message: fmt.Sprintf("the turn is over but its frames after "+
				"seq %d are gone (deleted or past retention): the rest of the turn cannot be read", filter.point()),
				cause: ErrFramesGone})
			return
		}
		if progressed || dropped.IsZero() {
			dropped, delay = time.Now(), 50*time.Millisecond
		}
		wait := delay
		retry := retrySameRequest(err) // a feed too: it reopens from its cursor
		if retry {
			e, _ := FromError(err)
			wait = max(wait, e.RetryDelay)
		}
		if !(retry || c.resumable(ctx, err)) || time.Since(dropped) > c.resumeWindow {
			yield(nil, streamError(ctx, err))
			return
		}
		select {
		case <-ctx.Done():
			yield(nil, streamError(ctx, ctx.Err()))
			return
		case <-time.After(wait):
		}
		delay = min(delay*2, time.Second)
	}
}

// ErrFramesGone is the cause (errors.Is) of the error a Prompt or Watch by
// request id ends with when, resuming, it finds the turn over and the frames
// it had not seen yet gone (deleted or past retention). Not retryable.
var ErrFramesGone = errors.New("the turn's remaining frames are gone")

// retrySameRequest reports whether err is a sidecar refusal after which the
// same call may be made again (docs/api.md, docs/cluster.md): a request's
// stream with the same request id, a session or platform feed from its cursor;
// nothing was lost. STREAM_TOO_SLOW (which ends a stalled feed too) names
// where to resume; the stream resumes from the last frame it saw, which is
// never past that point.
func retrySameRequest(err error) bool {
	e, ok := FromError(err)
	if !ok || e.local {
		return false
	}
	switch e.Reason {
	case ReasonLaneMoved, ReasonOverloaded, ReasonStoreUnavailable, ReasonUnavailable, ReasonStreamTooSlow:
		return true
	}
	return false
}

// idleError: the stream got no frame, keepalives included, for the idle timeout.
type idleError struct{ d time.Duration }

func (e idleError) Error() string {
	return fmt.Sprintf("no frame (keepalives included) for %s", e.d)
}

// runAttempt reads one stream. done means nothing more is to be done (the
// turn ended, the caller stopped, or the final error was yielded); otherwise
// err says why the stream broke and progressed whether any frame got through.
// A stream silent for the idle timeout is cut, and the client's connections
// closed (unless another stream closed them since this one opened its call):
// a half-open connection would take the resumed call too.
func (c *Client) runAttempt(ctx context.Context, open func(context.Context) (recvFunc, error),
	filter frameFilter, perRequest bool, yield func(*Frame, error) bool) (progressed, done bool, err error) {
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	var idle atomic.Bool
	arm, disarm := func() {}, func() {}
	if c.idleTimeout > 0 {
		gen := c.conns.generation() // the connections this attempt's call can be on
		t := time.AfterFunc(c.idleTimeout, func() {
			idle.Store(true)
			cancel()
			c.conns.closeGen(gen)
		})
		defer t.Stop()
		arm, disarm = func() { t.Reset(c.idleTimeout) }, func() { t.Stop() }
	}
	recv, err := open(actx)
	if err != nil {
		if idle.Load() {
			return false, false, idleError{c.idleTimeout}
		}
		return false, false, err
	}
	for {
		f, err := recv()
		if idle.Load() {
			return progressed, false, idleError{c.idleTimeout}
		}
		if err != nil {
			return progressed, false, err
		}
		arm()
		switch filter.admit(f) {
		case skip:
			continue
		case gap:
			return progressed, false, gapError{f.GetSeq()}
		}
		progressed = true
		disarm() // the caller's time is not the stream's
		if !yield(&Frame{f}, nil) {
			return true, true, nil
		}
		arm()
		if !perRequest || !isTerminal(f) {
			continue
		}
		if fl := f.GetFailed(); fl != nil {
			yield(nil, failedError(fl, recv))
		}
		return true, true, nil
	}
}

// failedError reads the status that follows a failed frame; when it carries
// no reason (or does not come in time) the error is built from the frame.
func failedError(fl *pb.ActivityFrame_Failed, recv recvFunc) error {
	ch := make(chan error, 1)
	go func() {
		_, err := recv()
		ch <- err
	}()
	select {
	case err := <-ch:
		if e, ok := FromError(err); ok && e.Reason != "" {
			if e.Message == "" {
				e.Message = fl.GetMessage()
			}
			return e
		}
	case <-time.After(5 * time.Second):
	}
	return failedFrameError(fl.GetReason(), fl.GetMessage())
}

// resumable reports whether a broken Prompt or Watch stream should be
// resumed: resuming is on (WithResumeWindow above 0) and the connection broke.
func (c *Client) resumable(ctx context.Context, err error) bool {
	return c.resumeWindow > 0 && c.connectionBroke(ctx, err)
}

// connectionBroke reports whether a call failed because the connection broke:
// it dropped (UNAVAILABLE, INTERNAL, UNKNOWN or CANCELLED without a
// sidecar reason, an I/O error, an early end of stream, a seq gap), and
// neither ctx nor the Client has ended. These are the codes the Python
// client resumes on too (RESUMABLE_CODES). grpc-go reports an HTTP/2 stream
// reset (RST_STREAM, e.g. from a proxy) as INTERNAL without details; a
// server shutting down (the sidecar stopped with SIGTERM) cancels the calls
// in flight with CANCELLED and no details, including a Prompt that had only
// just reached it, which may never have been taken: re-sending it (same
// request id, so idempotent) or resuming with WatchActivity is safe.
// A sidecar refusal carries an ErrorInfo reason (a turn cancelled on purpose
// is CANCELLED with reason CANCELLED) and is final. So are the cancellations
// this side causes: ctx cancelled or past its deadline, the Client closed
// (grpc-go then fails calls CANCELLED "grpc: the client connection is
// closing" while ctx is alive), and the failures raised on this side (a
// message it cannot encode, an unprintable header, reported as INTERNAL),
// which streamErrors marks local: those would fail the same way every time.
// A ToolHost re-registers after it whatever the resume window.
func (c *Client) connectionBroke(ctx context.Context, err error) bool {
	if ctx.Err() != nil || c.closed() {
		return false
	}
	var g gapError
	var idle idleError
	if errors.Is(err, io.EOF) || errors.As(err, &g) || errors.As(err, &idle) {
		return true
	}
	if e, ok := FromError(err); ok {
		if e.Reason != "" || e.local {
			return false
		}
		switch e.Code {
		case codes.Unavailable, codes.Internal, codes.Unknown, codes.Canceled:
			return true
		}
		return false
	}
	return err != nil
}

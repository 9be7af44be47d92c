package sidecar

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"iter"
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
// deadline passes the error is AGENT_TIMEOUT (errors.Is(err,
// context.DeadlineExceeded) holds too); when resuming gives up it is
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
		c.follow(ctx, open, filter, true, yield)
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
// context error; AGENT_TIMEOUT when its deadline passed),
// resuming after the last cursor seen when the connection drops; failed
// frames are yielded as frames, not errors.
func (c *Client) Watch(ctx context.Context, p WatchParams) iter.Seq2[*Frame, error] {
	return func(yield func(*Frame, error) bool) {
		if err := checkUTF8(&pb.WatchActivityRequest{RequestId: p.RequestID, SessionKey: p.SessionKey, Platform: p.Platform}); err != nil {
			yield(nil, err)
			return
		}
		if p.RequestID != "" {
			filter := &seqFilter{last: p.AfterSeq}
			open := func(ctx context.Context) (recvFunc, error) {
				return c.watch(ctx, &pb.WatchActivityRequest{RequestId: p.RequestID, AfterSeq: filter.last})
			}
			c.follow(ctx, open, filter, true, yield)
			return
		}
		filter := &cursorFilter{last: p.AfterCursor}
		open := func(ctx context.Context) (recvFunc, error) {
			return c.watch(ctx, &pb.WatchActivityRequest{SessionKey: p.SessionKey, Platform: p.Platform, AfterCursor: filter.last})
		}
		c.follow(ctx, open, filter, false, yield)
	}
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
func (c *Client) follow(ctx context.Context, open func(context.Context) (recvFunc, error),
	filter frameFilter, perRequest bool, yield func(*Frame, error) bool) {
	var dropped time.Time
	delay := 50 * time.Millisecond
	for {
		progressed, done, err := runAttempt(ctx, open, filter, perRequest, yield)
		if done {
			return
		}
		if progressed || dropped.IsZero() {
			dropped, delay = time.Now(), 50*time.Millisecond
		}
		if !c.resumable(ctx, err) || time.Since(dropped) > c.resumeWindow {
			yield(nil, streamError(ctx, err))
			return
		}
		select {
		case <-ctx.Done():
			yield(nil, streamError(ctx, ctx.Err()))
			return
		case <-time.After(delay):
		}
		delay = min(delay*2, time.Second)
	}
}

// runAttempt reads one stream. done means nothing more is to be done (the
// turn ended, the caller stopped, or the final error was yielded); otherwise
// err says why the stream broke and progressed whether any frame got through.
func runAttempt(ctx context.Context, open func(context.Context) (recvFunc, error),
	filter frameFilter, perRequest bool, yield func(*Frame, error) bool) (progressed, done bool, err error) {
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	recv, err := open(actx)
	if err != nil {
		return false, false, err
	}
	for {
		f, err := recv()
		if err != nil {
			return progressed, false, err
		}
		switch filter.admit(f) {
		case skip:
			continue
		case gap:
			return progressed, false, gapError{f.GetSeq()}
		}
		progressed = true
		if !yield(&Frame{f}, nil) {
			return true, true, nil
		}
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

// resumable reports whether a broken stream should be resumed: the
// connection dropped (UNAVAILABLE, INTERNAL, UNKNOWN or CANCELLED without a
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
func (c *Client) resumable(ctx context.Context, err error) bool {
	if ctx.Err() != nil || c.resumeWindow <= 0 || c.closed() {
		return false
	}
	var g gapError
	if errors.Is(err, io.EOF) || errors.As(err, &g) {
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

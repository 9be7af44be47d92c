package sidecar

import (
	"fmt"
	"iter"

	pb "github.com/agent-sidecar/agent-sidecar/clients/go/agentsidecarv1"
)

// Frame is one activity frame of a turn. It embeds the generated message, so
// f.Seq, f.RequestId, f.GetTextDelta().GetText() and so on work directly.
type Frame struct {
	*pb.ActivityFrame
}

// Frame kinds, as returned by Frame.Kind.
const (
	KindAccepted   = "accepted"
	KindStarted    = "started"
	KindTextDelta  = "text_delta"
	KindToolCall   = "tool_call"
	KindToolResult = "tool_result"
	KindUsage      = "usage"
	KindCompleted  = "completed"
	KindFailed     = "failed"
	KindSuperseded = "superseded"
	KindKeepalive  = "keepalive"
)

// Kind names the frame's event: one of the Kind* constants, "" if unset.
func (f *Frame) Kind() string { return frameKind(f.ActivityFrame) }

// Terminal reports whether this frame ends its turn (completed, failed or superseded).
func (f *Frame) Terminal() bool { return isTerminal(f.ActivityFrame) }

func frameKind(f *pb.ActivityFrame) string {
	switch f.GetEvent().(type) {
	case *pb.ActivityFrame_Accepted_:
		return KindAccepted
	case *pb.ActivityFrame_Started_:
		return KindStarted
	case *pb.ActivityFrame_TextDelta_:
		return KindTextDelta
	case *pb.ActivityFrame_ToolCall_:
		return KindToolCall
	case *pb.ActivityFrame_ToolResult_:
		return KindToolResult
	case *pb.ActivityFrame_Usage:
		return KindUsage
	case *pb.ActivityFrame_Completed_:
		return KindCompleted
	case *pb.ActivityFrame_Failed_:
		return KindFailed
	case *pb.ActivityFrame_Superseded_:
		return KindSuperseded
	case *pb.ActivityFrame_Keepalive_:
		return KindKeepalive
	}
	return ""
}

func isTerminal(f *pb.ActivityFrame) bool {
	switch f.GetEvent().(type) {
	case *pb.ActivityFrame_Completed_, *pb.ActivityFrame_Failed_, *pb.ActivityFrame_Superseded_:
		return true
	}
	return false
}

// Collect drains a frame iterator into a slice. It returns the frames seen
// and the first error (for a failed turn: the typed *Error, after the failed
// frame has been collected).
func Collect(seq iter.Seq2[*Frame, error]) ([]*Frame, error) {
	var frames []*Frame
	for f, err := range seq {
		if err != nil {
			return frames, err
		}
		frames = append(frames, f)
	}
	return frames, nil
}

// verdict is what a filter decides about one received frame.
type verdict int

const (
	emit verdict = iota // new and in order: hand it to the caller
	skip                // keepalive or already delivered
	gap                 // frames are missing before this one: resume from the last delivered
)

// frameFilter decides which received frames reach the caller, across the
// original stream and every resumed one.
type frameFilter interface {
	admit(f *pb.ActivityFrame) verdict
	point() int64 // the resume point: the last seq or cursor admitted
}

func (s *seqFilter) point() int64    { return s.last }
func (c *cursorFilter) point() int64 { return c.last }

// seqFilter admits the frames of one request exactly once, in seq order
// (seq is per request, from 1, gapless). last is the resume point
// (WatchActivity after_seq).
type seqFilter struct {
	last int64
}

func (s *seqFilter) admit(f *pb.ActivityFrame) verdict {
	if f == nil || f.GetKeepalive() != nil {
		return skip
	}
	switch seq := f.GetSeq(); {
	case seq <= s.last:
		return skip
	case seq != s.last+1:
		return gap
	}
	s.last = f.GetSeq()
	return emit
}

// cursorFilter admits frames of a session or platform watch once, by their
// global cursor. Gaps cannot be detected there (cursors span every request).
type cursorFilter struct {
	last int64
}

func (c *cursorFilter) admit(f *pb.ActivityFrame) verdict {
	if f == nil {
		return skip
	}
	if f.GetKeepalive() != nil {
		// A watch's keepalive carries the cursor it has reached (a live watch's
		// first, the head it starts after): resume from there.
		c.last = max(c.last, f.GetCursor())
		return skip
	}
	if f.GetCursor() != 0 {
		if f.GetCursor() <= c.last {
			return skip
		}
		c.last = f.GetCursor()
	}
	return emit
}

// gapError reports frames missing from a stream; it triggers a resume.
type gapError struct{ seq int64 }

func (g gapError) Error() string {
	return fmt.Sprintf("sidecar: frames missing before seq %d", g.seq)
}

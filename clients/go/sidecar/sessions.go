package sidecar

import (
	"context"
	"iter"
	"math"
	"time"

	pb "github.com/agent-sidecar/agent-sidecar/clients/go/agentsidecarv1"
)

// Aliases of the generated messages this package's API traffics in.
type (
	// Source says where a message came from (seed 001 §1).
	Source = pb.SessionSource
	// Session is one conversation lane and its current incarnation.
	Session = pb.Session
	// Message is one transcript row.
	Message = pb.Message
	// Usage is token and cost accounting.
	Usage = pb.Usage
	// RewindResult is what RewindSession backed up.
	RewindResult = pb.RewindSessionResponse
	// SearchHit is one SearchMessages result.
	SearchHit = pb.SearchHit
)

// ConfirmClearAll is the literal ClearAllSessions requires.
const ConfirmClearAll = "DELETE ALL SESSIONS"

// SessionOption tunes GetOrCreateSession.
type SessionOption func(*pb.GetOrCreateSessionRequest)

// WithProfile names the profile a new session gets (default "main").
func WithProfile(profile string) SessionOption {
	return func(r *pb.GetOrCreateSessionRequest) { r.Profile = profile }
}

// ForceNew starts a new incarnation even when the key has a live one.
func ForceNew() SessionOption {
	return func(r *pb.GetOrCreateSessionRequest) { r.ForceNew = true }
}

// GetOrCreateSession derives the session key from source and returns its
// session, creating it if needed. Concurrent calls for one key return one
// session_id.
func (c *Client) GetOrCreateSession(ctx context.Context, source *Source, opts ...SessionOption) (*Session, error) {
	req := &pb.GetOrCreateSessionRequest{Source: source}
	for _, o := range opts {
		o(req)
	}
	resp, err := c.Sessions.GetOrCreateSession(ctx, req)
	return resp.GetSession(), err
}

// GetSession returns the session of a key; SESSION_NOT_FOUND when absent.
func (c *Client) GetSession(ctx context.Context, sessionKey string) (*Session, error) {
	resp, err := c.Sessions.GetSession(ctx, &pb.GetSessionRequest{SessionKey: sessionKey})
	return resp.GetSession(), err
}

// GetSessionByID returns one incarnation by its session_id.
func (c *Client) GetSessionByID(ctx context.Context, sessionID string) (*Session, error) {
	resp, err := c.Sessions.GetSession(ctx, &pb.GetSessionRequest{SessionId: sessionID})
	return resp.GetSession(), err
}

// ListSessions iterates over sessions, most recently updated first, fetching
// pages as needed. platform "" and activeWithin 0 mean no filter. The
// sidecar counts in whole seconds: activeWithin is rounded up (500ms is 1s,
// not "no filter"); a negative one is an INVALID_ARGUMENT error.
func (c *Client) ListSessions(ctx context.Context, platform string, activeWithin time.Duration) iter.Seq2[*Session, error] {
	return func(yield func(*Session, error) bool) {
		if activeWithin < 0 {
			yield(nil, invalidArgument("activeWithin", "must not be negative (0 means no filter), got %v", activeWithin))
			return
		}
		secs := int64(activeWithin / time.Second)
		if activeWithin%time.Second != 0 {
			secs++
		}
		req := &pb.ListSessionsRequest{Platform: platform, ActiveWithinSeconds: secs}
		for {
			resp, err := c.Sessions.ListSessions(ctx, req)
			if err != nil {
				yield(nil, err)
				return
			}
			for _, s := range resp.GetSessions() {
				if !yield(s, nil) {
					return
				}
			}
			if resp.GetNextPageToken() == "" {
				return
			}
			req.PageToken = resp.GetNextPageToken()
		}
	}
}

// ResetSession is /new and /reset: a new session_id for the key; queued
// prompts are dropped.
func (c *Client) ResetSession(ctx context.Context, sessionKey string) (*Session, error) {
	resp, err := c.Sessions.ResetSession(ctx, &pb.ResetSessionRequest{SessionKey: sessionKey})
	return resp.GetSession(), err
}

// SwitchSession is /resume: point the key at an earlier incarnation.
func (c *Client) SwitchSession(ctx context.Context, sessionKey, targetSessionID string) (*Session, error) {
	resp, err := c.Sessions.SwitchSession(ctx, &pb.SwitchSessionRequest{SessionKey: sessionKey, TargetSessionId: targetSessionID})
	return resp.GetSession(), err
}

// SuspendSession is /stop: cancel the in-flight turn; the next access gets a
// new session_id.
func (c *Client) SuspendSession(ctx context.Context, sessionKey string) (*Session, error) {
	resp, err := c.Sessions.SuspendSession(ctx, &pb.SuspendSessionRequest{SessionKey: sessionKey})
	return resp.GetSession(), err
}

// MarkResumePending flags the session for auto-resume (never overrides suspended).
func (c *Client) MarkResumePending(ctx context.Context, sessionKey, reason string) (*Session, error) {
	resp, err := c.Sessions.MarkResumePending(ctx, &pb.MarkResumePendingRequest{SessionKey: sessionKey, Reason: reason})
	return resp.GetSession(), err
}

// DeleteSession drops a key and everything under it; false when it did not exist.
func (c *Client) DeleteSession(ctx context.Context, sessionKey string) (bool, error) {
	resp, err := c.Sessions.DeleteSession(ctx, &pb.DeleteSessionRequest{SessionKey: sessionKey})
	return resp.GetDeleted(), err
}

// ClearAllSessions drops every session. confirm must equal ConfirmClearAll.
func (c *Client) ClearAllSessions(ctx context.Context, confirm string) (int64, error) {
	resp, err := c.Sessions.ClearAllSessions(ctx, &pb.ClearAllSessionsRequest{Confirm: confirm})
	return resp.GetSessionsDeleted(), err
}

// GetTranscript returns a session's whole transcript in order, following
// pages. includeRewound also returns rows hidden by rewind or rewrite.
func (c *Client) GetTranscript(ctx context.Context, sessionID string, includeRewound bool) ([]*Message, error) {
	req := &pb.GetTranscriptRequest{SessionId: sessionID, IncludeRewound: includeRewound}
	var out []*Message
	for {
		resp, err := c.Sessions.GetTranscript(ctx, req)
		if err != nil {
			return out, err
		}
		out = append(out, resp.GetMessages()...)
		if resp.GetNextPageToken() == "" {
			return out, nil
		}
		req.PageToken = resp.GetNextPageToken()
	}
}

// AppendMessages appends messages durably and returns their seq range.
func (c *Client) AppendMessages(ctx context.Context, sessionID string, msgs ...*Message) (first, last int64, err error) {
	resp, err := c.Sessions.AppendMessages(ctx, &pb.AppendMessagesRequest{SessionId: sessionID, Messages: msgs})
	return resp.GetFirstSeq(), resp.GetLastSeq(), err
}

// RewriteTranscript replaces a session's transcript (the old rows stay hidden).
func (c *Client) RewriteTranscript(ctx context.Context, sessionID string, msgs ...*Message) error {
	_, err := c.Sessions.RewriteTranscript(ctx, &pb.RewriteTranscriptRequest{SessionId: sessionID, Messages: msgs})
	return err
}

// RewindSession is /undo: back up n user turns (0 means 1). n must fit the
// API's int32; a larger one is an INVALID_ARGUMENT error (so is a negative
// one, from the sidecar).
func (c *Client) RewindSession(ctx context.Context, sessionID string, n int) (*RewindResult, error) {
	if err := checkInt32("n", n); err != nil {
		return nil, err
	}
	return c.Sessions.RewindSession(ctx, &pb.RewindSessionRequest{SessionId: sessionID, N: int32(n)})
}

// SeedSession writes a synthetic transcript for the session of source.
func (c *Client) SeedSession(ctx context.Context, source *Source, msgs ...*Message) (*Session, error) {
	resp, err := c.Sessions.SeedSession(ctx, &pb.SeedSessionRequest{Source: source, Messages: msgs})
	return resp.GetSession(), err
}

// SearchMessages runs a full-text query over live messages; sessionKey ""
// searches every session. limit 0 means the sidecar's default (20; it caps
// it at 200); a limit outside int32 is an INVALID_ARGUMENT error.
func (c *Client) SearchMessages(ctx context.Context, query, sessionKey string, limit int) ([]*SearchHit, error) {
	if err := checkInt32("limit", limit); err != nil {
		return nil, err
	}
	resp, err := c.Sessions.SearchMessages(ctx, &pb.SearchMessagesRequest{Query: query, SessionKey: sessionKey, Limit: int32(limit)})
	return resp.GetHits(), err
}

// UpdateUsage adds a token and cost delta to a session.
func (c *Client) UpdateUsage(ctx context.Context, sessionKey string, delta *Usage) (*Session, error) {
	resp, err := c.Sessions.UpdateUsage(ctx, &pb.UpdateUsageRequest{SessionKey: sessionKey, Delta: delta})
	return resp.GetSession(), err
}

// checkInt32 refuses a value an int32 field of the API cannot hold (it
// would wrap around silently).
func checkInt32(name string, v int) error {
	if v < math.MinInt32 || v > math.MaxInt32 {
		return invalidArgument(name, "is out of range (%d does not fit in an int32)", v)
	}
	return nil
}

// GetSessionContext returns the "## Current Session Context" prompt section.
func (c *Client) GetSessionContext(ctx context.Context, source *Source, profile string) (string, error) {
	resp, err := c.Sessions.GetSessionContext(ctx, &pb.GetSessionContextRequest{Source: source, Profile: profile})
	return resp.GetPromptSection(), err
}

package sidecar

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

func busyStatus(t *testing.T) error {
	t.Helper()
	st, err := status.New(codes.Aborted, "session is busy").WithDetails(
		&errdetails.ErrorInfo{Domain: ErrorDomain, Reason: ReasonAgentBusy, Metadata: map[string]string{"session_key": "k"}},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(1500 * time.Millisecond)},
	)
	if err != nil {
		t.Fatal(err)
	}
	return st.Err()
}

func TestFromErrorDecodesErrorInfo(t *testing.T) {
	raw := busyStatus(t)
	err := convertError(context.Background(), raw)

	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("errors.As(%v) failed", err)
	}
	if e.Code != codes.Aborted || e.Reason != ReasonAgentBusy || e.Message != "session is busy" {
		t.Fatalf("got %+v", e)
	}
	if e.Domain != ErrorDomain || e.Metadata["session_key"] != "k" || e.RetryDelay != 1500*time.Millisecond {
		t.Fatalf("details not decoded: %+v", e)
	}
	if !IsReason(err, ReasonAgentBusy) || IsReason(err, ReasonAgentTimeout) {
		t.Fatal("IsReason on converted error")
	}
	if !IsReason(raw, ReasonAgentBusy) {
		t.Fatal("IsReason on a raw status error")
	}
	wrapped := fmt.Errorf("sending: %w", err)
	if !errors.Is(wrapped, ErrAgentBusy) || errors.Is(wrapped, ErrCancelled) {
		t.Fatal("errors.Is with sentinels")
	}
	if status.Code(wrapped) != codes.Aborted {
		t.Fatalf("status.Code = %v", status.Code(wrapped))
	}
	if got := e.Error(); got != "sidecar: AGENT_BUSY (Aborted): session is busy" {
		t.Fatalf("Error() = %q", got)
	}
}

func TestFromErrorPrefersOwnDomainAndFieldViolations(t *testing.T) {
	st, _ := status.New(codes.InvalidArgument, "bad").WithDetails(
		&errdetails.ErrorInfo{Domain: "other.example", Reason: "NOPE"},
		&errdetails.ErrorInfo{Domain: ErrorDomain, Reason: ReasonInvalidArgument},
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "text", Description: "too long"}}},
	)
	e, ok := FromError(st.Err())
	if !ok || e.Reason != ReasonInvalidArgument || len(e.FieldViolations) != 1 || e.FieldViolations[0].Field != "text" {
		t.Fatalf("got %+v", e)
	}
}

func TestStatusWithoutDetails(t *testing.T) {
	e, ok := FromError(status.Error(codes.Unavailable, "connection reset"))
	if !ok || e.Reason != "" || e.Code != codes.Unavailable {
		t.Fatalf("got %+v", e)
	}
	if _, ok := FromError(errors.New("plain")); ok {
		t.Fatal("plain error decoded")
	}
	if _, ok := FromError(nil); ok {
		t.Fatal("nil decoded")
	}
}

func TestContextCauseIsKept(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := convertError(ctx, status.Error(codes.Canceled, "context canceled"))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("errors.Is(%v, context.Canceled) = false", err)
	}
	var e *Error
	if !errors.As(err, &e) || e.Code != codes.Canceled {
		t.Fatalf("got %v", err)
	}
}

func TestFailedFrameError(t *testing.T) {
	e := failedFrameError(ReasonToolScopeViolation, "other.x is not allowed")
	if e.Code != codes.PermissionDenied || !errors.Is(e, ErrToolScopeViolation) {
		t.Fatalf("got %+v", e)
	}
	if failedFrameError("SOMETHING_NEW", "").Code != codes.Unknown {
		t.Fatal("unknown reason should map to Unknown")
	}
}

// checkClientDeadline asserts err is the DEADLINE_EXCEEDED *Error (no reason)
// of a call whose own deadline passed.
func checkClientDeadline(t *testing.T, err error) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("not an *Error: %#v", err)
	}
	// The client's own deadline: DEADLINE_EXCEEDED without a reason (never
	// AGENT_TIMEOUT, a turn's server-side timeout), as on a unary call.
	if e.Code != codes.DeadlineExceeded || e.Reason != "" {
		t.Fatalf("got code %v reason %q (%v)", e.Code, e.Reason, err)
	}
	if errors.Is(err, ErrAgentTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("errors.Is/IsReason failed on %v", err)
	}
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("status.Code = %v", status.Code(err))
	}
}

func TestFromErrorIgnoresForeignDomain(t *testing.T) {
	st, _ := status.New(codes.Unavailable, "upstream connect error").WithDetails(
		&errdetails.ErrorInfo{Domain: "proxy.example", Reason: "UPSTREAM_RESET", Metadata: map[string]string{"k": "v"}},
	)
	for _, err := range []error{st.Err(), convertError(context.Background(), st.Err())} {
		e, ok := FromError(err)
		if !ok || e.Code != codes.Unavailable || e.Reason != "" || e.Domain != "" || e.Metadata != nil {
			t.Fatalf("got %+v", e)
		}
		if IsReason(err, "UPSTREAM_RESET") {
			t.Fatal("foreign reason taken")
		}
		// Without a sidecar reason it is a transport error: resumed.
		if !(&Client{resumeWindow: time.Second}).resumable(context.Background(), err) {
			t.Fatal("foreign-domain UNAVAILABLE not resumable")
		}
	}
}

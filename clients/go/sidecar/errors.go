package sidecar

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of every error the sidecar raises.
const ErrorDomain = "agent-sidecar"

// Reasons of the API (ErrorReason in proto/, docs/api.md). They appear in ErrorInfo.reason of a failed RPC and in
// the reason of a failed frame.
const (
	ReasonAgentBusy          = "AGENT_BUSY"           // ABORTED: REJECT_IF_BUSY and a turn is in flight
	ReasonAgentTimeout       = "AGENT_TIMEOUT"        // DEADLINE_EXCEEDED: the turn ran out of time
	ReasonLLMAPIFailure      = "LLM_API_FAILURE"      // UNAVAILABLE: the model backend failed after retries
	ReasonMaxIterations      = "MAX_ITERATIONS"       // RESOURCE_EXHAUSTED: the agent loop hit max_iterations
	ReasonToolScopeViolation = "TOOL_SCOPE_VIOLATION" // PERMISSION_DENIED: a tool outside the profile's subtrees
	ReasonToolInvokeFailed   = "TOOL_INVOKE_FAILED"   // UNAVAILABLE: the tool host failed
	ReasonCancelled          = "CANCELLED"            // CANCELLED: Cancel, SuspendSession, INTERRUPT, ResetSession
	ReasonSessionNotFound    = "SESSION_NOT_FOUND"    // NOT_FOUND: no such key or id
	ReasonInvalidArgument    = "INVALID_ARGUMENT"     // INVALID_ARGUMENT: malformed or oversized request
	ReasonUnauthenticated    = "UNAUTHENTICATED"      // UNAUTHENTICATED: missing or wrong credential
	ReasonPermissionDenied   = "PERMISSION_DENIED"    // PERMISSION_DENIED: credential used outside its platforms
	ReasonWorkerCrashed      = "WORKER_CRASHED"       // UNAVAILABLE: the worker running the turn died
	// The rest of docs/semantics.md's reason table.
	ReasonFailedPrecondition = "FAILED_PRECONDITION" // FAILED_PRECONDITION: the state forbids the request
	ReasonResourceExhausted  = "RESOURCE_EXHAUSTED"  // RESOURCE_EXHAUSTED: a limit of the turn was reached
	ReasonUnavailable        = "UNAVAILABLE"         // UNAVAILABLE: the sidecar cannot take the call now
	ReasonRequestNotFound    = "REQUEST_NOT_FOUND"   // NOT_FOUND: WatchActivity of an unknown request id
	ReasonInternal           = "INTERNAL"            // INTERNAL: a bug in the sidecar
	ReasonRestartInterrupted = "restart_interrupted" // UNAVAILABLE: the turn was in flight when the sidecar crashed
	ReasonShutdownTimeout    = "shutdown_timeout"    // UNAVAILABLE: still running when a shutdown's drain ran out
	ReasonStreamTooSlow      = "STREAM_TOO_SLOW"     // RESOURCE_EXHAUSTED: the reader stopped reading
	ReasonOverloaded         = "OVERLOADED"          // RESOURCE_EXHAUSTED: admission limits reached (RetryInfo)
	ReasonQueueFull          = "QUEUE_FULL"          // RESOURCE_EXHAUSTED: the session's queue is full
	ReasonStoreUnavailable   = "STORE_UNAVAILABLE"   // UNAVAILABLE: the store cannot write now (RetryInfo)
	ReasonLaneMoved          = "LANE_MOVED"          // UNAVAILABLE: another sidecar runs the session now
)

// reasonCodes maps each reason to the gRPC code docs/api.md pairs it with. It is
// used when a failed frame has to be turned into an error without a status.
var reasonCodes = map[string]codes.Code{
	ReasonAgentBusy:          codes.Aborted,
	ReasonAgentTimeout:       codes.DeadlineExceeded,
	ReasonLLMAPIFailure:      codes.Unavailable,
	ReasonMaxIterations:      codes.ResourceExhausted,
	ReasonToolScopeViolation: codes.PermissionDenied,
	ReasonToolInvokeFailed:   codes.Unavailable,
	ReasonCancelled:          codes.Canceled,
	ReasonSessionNotFound:    codes.NotFound,
	ReasonInvalidArgument:    codes.InvalidArgument,
	ReasonUnauthenticated:    codes.Unauthenticated,
	ReasonPermissionDenied:   codes.PermissionDenied,
	ReasonWorkerCrashed:      codes.Unavailable,
	ReasonFailedPrecondition: codes.FailedPrecondition,
	ReasonResourceExhausted:  codes.ResourceExhausted,
	ReasonUnavailable:        codes.Unavailable,
	ReasonRequestNotFound:    codes.NotFound,
	ReasonInternal:           codes.Internal,
	ReasonRestartInterrupted: codes.Unavailable,
	ReasonShutdownTimeout:    codes.Unavailable,
	ReasonStreamTooSlow:      codes.ResourceExhausted,
	ReasonOverloaded:         codes.ResourceExhausted,
	ReasonQueueFull:          codes.ResourceExhausted,
	ReasonStoreUnavailable:   codes.Unavailable,
	ReasonLaneMoved:          codes.Unavailable,
}

// Sentinels for errors.Is: errors.Is(err, sidecar.ErrAgentBusy) holds when err
// is an *Error with that reason. They match on Reason only.
var (
	ErrAgentBusy          = &Error{Code: codes.Aborted, Reason: ReasonAgentBusy}
	ErrAgentTimeout       = &Error{Code: codes.DeadlineExceeded, Reason: ReasonAgentTimeout}
	ErrLLMAPIFailure      = &Error{Code: codes.Unavailable, Reason: ReasonLLMAPIFailure}
	ErrMaxIterations      = &Error{Code: codes.ResourceExhausted, Reason: ReasonMaxIterations}
	ErrToolScopeViolation = &Error{Code: codes.PermissionDenied, Reason: ReasonToolScopeViolation}
	ErrToolInvokeFailed   = &Error{Code: codes.Unavailable, Reason: ReasonToolInvokeFailed}
	ErrCancelled          = &Error{Code: codes.Canceled, Reason: ReasonCancelled}
	ErrSessionNotFound    = &Error{Code: codes.NotFound, Reason: ReasonSessionNotFound}
	ErrInvalidArgument    = &Error{Code: codes.InvalidArgument, Reason: ReasonInvalidArgument}
	ErrUnauthenticated    = &Error{Code: codes.Unauthenticated, Reason: ReasonUnauthenticated}
	ErrPermissionDenied   = &Error{Code: codes.PermissionDenied, Reason: ReasonPermissionDenied}
	ErrWorkerCrashed      = &Error{Code: codes.Unavailable, Reason: ReasonWorkerCrashed}
)

// FieldViolation names a request field a server rejected (google.rpc.BadRequest).
type FieldViolation struct {
	Field       string
	Description string
}

// Error is every error the sidecar returns: a gRPC status plus, when the
// sidecar sent one, the reason from its google.rpc.ErrorInfo detail. Every
// call of this package returns gRPC failures as *Error; read it with
// errors.As, or test a reason with IsReason.
type Error struct {
	Code     codes.Code // the gRPC status code
	Reason   string     // ErrorInfo.reason (one of the Reason* constants); "" when absent
	Message  string     // the status message, or the failed frame's message
	Domain   string     // ErrorDomain when Reason is set, else ""
	Metadata map[string]string
	// RetryDelay is the google.rpc.RetryInfo delay (AGENT_BUSY carries one); 0 when absent.
	RetryDelay time.Duration
	// FieldViolations lists the fields of a google.rpc.BadRequest detail.
	FieldViolations []FieldViolation

	status *status.Status
	cause  error // context error when the call ended because its context did, or the broken stream's error
	local  bool  // raised by this client before the request left (encoding, metadata): never resumed
}

// Error formats the error as "sidecar: REASON (Code): message".
func (e *Error) Error() string {
	if e.Reason != "" {
		return fmt.Sprintf("sidecar: %s (%s): %s", e.Reason, e.Code, e.Message)
	}
	return fmt.Sprintf("sidecar: %s: %s", e.Code, e.Message)
}

// GRPCStatus lets status.FromError and status.Code read the original status.
func (e *Error) GRPCStatus() *status.Status {
	if e.status != nil {
		return e.status
	}
	return status.New(e.Code, e.Message)
}

// Is reports whether target is an *Error with the same non-empty Reason, so
// the Err* sentinels work with errors.Is.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Reason != "" && t.Reason == e.Reason
}

// Unwrap returns context.Canceled or context.DeadlineExceeded when the call
// failed because its own context ended; for a stream given up after a
// transport failure it may return that failure; else nil.
func (e *Error) Unwrap() error { return e.cause }

// IsReason reports whether err is (or wraps) a sidecar error with the given
// reason, e.g. IsReason(err, ReasonAgentBusy). It also understands raw gRPC
// status errors that did not pass through this package.
func IsReason(err error, reason string) bool {
	e, ok := FromError(err)
	return ok && e.Reason == reason
}

// FromError returns err as an *Error: the *Error it wraps, or one decoded from
// a gRPC status error and its details. ok is false for errors that carry no
// gRPC status (nil, io.EOF, plain errors).
func FromError(err error) (e *Error, ok bool) {
	if err == nil {
		return nil, false
	}
	if errors.As(err, &e) {
		return e, true
	}
	st, ok := status.FromError(err)
	if !ok {
		return nil, false
	}
	return fromStatus(st), true
}

// fromStatus decodes a status and its ErrorInfo, RetryInfo and BadRequest
// details. Only an ErrorInfo of ErrorDomain gives the reason: one from another
// domain (a proxy, a load balancer) is ignored, so the error stays a
// transport error without a reason.
func fromStatus(st *status.Status) *Error {
	e := &Error{Code: st.Code(), Message: st.Message(), status: st}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() == ErrorDomain {
				e.Reason, e.Domain, e.Metadata = d.GetReason(), d.GetDomain(), d.GetMetadata()
			}
		case *errdetails.RetryInfo:
			e.RetryDelay = d.GetRetryDelay().AsDuration()
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				e.FieldViolations = append(e.FieldViolations, FieldViolation{v.GetField(), v.GetDescription()})
			}
		}
	}
	return e
}

// convertError turns a gRPC error into *Error, remembering the context error
// when the call ended because ctx did. nil and non-status errors pass through.
func convertError(ctx context.Context, err error) error {
	e, ok := FromError(err)
	if !ok {
		return err
	}
	if e.cause != nil || e.Reason != "" {
		return e
	}
	var cause error
	_, hasDeadline := ctx.Deadline()
	switch {
	case ctx.Err() != nil && (e.Code == codes.Canceled || e.Code == codes.DeadlineExceeded):
		cause = ctx.Err()
	case e.Code == codes.DeadlineExceeded && hasDeadline:
		// The server saw the call's deadline pass (gRPC sends it along) before
		// this side's timer fired: the call's own deadline all the same.
		cause = context.DeadlineExceeded
	default:
		return e
	}
	c := *e
	c.cause = cause
	return &c
}

// streamError is the error a Prompt or Watch iterator ends with, always an
// *Error. The call's own deadline (or a DEADLINE_EXCEEDED without a sidecar
// reason) is DEADLINE_EXCEEDED without a reason, as for a unary call (never
// AGENT_TIMEOUT: that is a turn's server-side timeout); a stream given up on
// after a seq gap or an I/O error is UNAVAILABLE without a reason.
func streamError(ctx context.Context, err error) *Error {
	e, ok := FromError(convertError(ctx, err))
	var g gapError
	switch {
	case ok:
	case errors.Is(err, io.EOF):
		// io.EOF is not kept as the cause: callers read it as a clean end.
		e = &Error{Code: codes.Unavailable, Message: "stream ended before the turn's terminal frame"}
	case errors.As(err, &g):
		e = &Error{Code: codes.Unavailable, Message: g.Error(), cause: g}
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		// The context ended while no stream was open (waiting to reconnect).
		e = &Error{Code: status.FromContextError(ctx.Err()).Code(), Message: ctx.Err().Error(), cause: ctx.Err()}
	default:
		e = &Error{Code: codes.Unavailable, Message: err.Error(), cause: err}
	}
	deadline := errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(e.cause, context.DeadlineExceeded)
	switch {
	case e.Reason == "" && (deadline || e.Code == codes.DeadlineExceeded):
		t := *e
		t.Code, t.status = codes.DeadlineExceeded, nil
		if deadline {
			t.cause = context.DeadlineExceeded
		}
		e = &t
	case e.Reason == ReasonAgentTimeout && deadline && e.cause == nil:
		t := *e
		t.cause = context.DeadlineExceeded
		e = &t
	}
	return e
}

// invalidArgument is an error this client raises for a bad argument before
// sending anything: INVALID_ARGUMENT, as the sidecar would answer, naming the
// field (also in FieldViolations).
func invalidArgument(field, format string, args ...any) *Error {
	desc := fmt.Sprintf(format, args...)
	return &Error{Code: codes.InvalidArgument, Reason: ReasonInvalidArgument, Domain: ErrorDomain,
		Message: field + ": " + desc, FieldViolations: []FieldViolation{{field, desc}}, local: true}
}

// checkUTF8 returns an INVALID_ARGUMENT error naming the first string field of
// m that is not valid UTF-8 (protobuf cannot encode it), or nil. Fields are
// named by their proto path: "text", "source.chat_id", "messages[2].content".
func checkUTF8(m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return nil
	}
	if field, at := invalidUTF8(pm.ProtoReflect()); field != "" {
		return invalidArgument(field, "is not valid UTF-8 (bad byte at offset %d)", at)
	}
	return nil
}

// invalidUTF8 finds the first string field of m that is not valid UTF-8: its
// path and the offset of the first bad byte; "" when there is none.
func invalidUTF8(m protoreflect.Message) (field string, at int) {
	fields := m.Descriptor().Fields()
	for i := 0; i < fields.Len() && field == ""; i++ {
		fd := fields.Get(i) // in declaration order, so the first bad field is named
		if !m.Has(fd) {
			continue
		}
		v, name := m.Get(fd), string(fd.Name())
		switch {
		case fd.IsList():
			l := v.List()
			for j := 0; j < l.Len() && field == ""; j++ {
				if sub, off, bad := invalidUTF8Value(fd, l.Get(j)); bad {
					field, at = fmt.Sprintf("%s[%d]%s", name, j, sub), off
				}
			}
		case fd.IsMap():
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				if _, off, bad := invalidUTF8Value(fd.MapKey(), k.Value()); bad {
					field, at = name+" (a key)", off
				} else if sub, off, bad := invalidUTF8Value(fd.MapValue(), mv); bad {
					field, at = fmt.Sprintf("%s[%q]%s", name, k.String(), sub), off
				}
				return field == ""
			})
		default:
			if sub, off, bad := invalidUTF8Value(fd, v); bad {
				field, at = name+sub, off
			}
		}
	}
	return field, at
}

// invalidUTF8Value checks one value of field fd: a string, or a message
// (walked; sub is then ".path" inside it).
func invalidUTF8Value(fd protoreflect.FieldDescriptor, v protoreflect.Value) (sub string, at int, bad bool) {
	switch fd.Kind() {
	case protoreflect.StringKind:
		s := v.String()
		if utf8.ValidString(s) {
			return "", 0, false
		}
		for at < len(s) {
			r, n := utf8.DecodeRuneInString(s[at:])
			if r == utf8.RuneError && n <= 1 {
				break
			}
			at += n
		}
		return "", at, true
	case protoreflect.MessageKind, protoreflect.GroupKind:
		if field, at := invalidUTF8(v.Message()); field != "" {
			return "." + field, at, true
		}
	}
	return "", 0, false
}

// failedFrameError builds the error for a failed frame when the RPC's status
// did not carry one (for example a WatchActivity replay that ended with OK).
func failedFrameError(reason, message string) *Error {
	code, ok := reasonCodes[reason]
	if !ok {
		code = codes.Unknown
	}
	return &Error{Code: code, Reason: reason, Message: message, Domain: ErrorDomain}
}

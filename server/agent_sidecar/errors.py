"""Failure reasons of the API (docs/api.md, "Error reasons"), raised by domain
code that knows nothing of gRPC.

The API layer (api/errors.py) turns a ``SidecarError`` into a gRPC status with a
google.rpc.ErrorInfo; the same reason strings appear in ``failed`` frames. A new
reason goes here, in api/errors.py's CODE_FOR_REASON and, as
``ERROR_REASON_<NAME>`` with its gRPC status, in
proto/agent_sidecar/v1/error_reason.proto (tests/api/test_error_reasons.py checks).
"""

from __future__ import annotations

AGENT_BUSY = "AGENT_BUSY"
AGENT_TIMEOUT = "AGENT_TIMEOUT"
LLM_API_FAILURE = "LLM_API_FAILURE"
MAX_ITERATIONS = "MAX_ITERATIONS"
TOOL_SCOPE_VIOLATION = "TOOL_SCOPE_VIOLATION"
TOOL_INVOKE_FAILED = "TOOL_INVOKE_FAILED"
CANCELLED = "CANCELLED"
SESSION_NOT_FOUND = "SESSION_NOT_FOUND"
INVALID_ARGUMENT = "INVALID_ARGUMENT"
UNAUTHENTICATED = "UNAUTHENTICATED"
PERMISSION_DENIED = "PERMISSION_DENIED"
WORKER_CRASHED = "WORKER_CRASHED"
# Beyond the contract's first table, also declared in ErrorReason: a failed precondition (ClearAll's confirm
# string) and resource limits (queue cap) with their own reasons.
FAILED_PRECONDITION = "FAILED_PRECONDITION"
RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
UNAVAILABLE = "UNAVAILABLE"
REQUEST_NOT_FOUND = "REQUEST_NOT_FOUND"  # WatchActivity for a request id never seen
INTERNAL = "INTERNAL"
# Load limits (issue 14), all RESOURCE_EXHAUSTED with RetryInfo: a stream whose
# client stopped reading past its buffer bound (it resumes with WatchActivity from
# the cursor or seq its message names), the sidecar's admission limits on prompts
# in flight, a session's queue cap.
STREAM_TOO_SLOW = "STREAM_TOO_SLOW"
OVERLOADED = "OVERLOADED"
QUEUE_FULL = "QUEUE_FULL"
# The store cannot write right now (disk full, I/O error, read-only, its writer
# gone): nothing can be made durable, so nothing is acknowledged; retryable
# (UNAVAILABLE with RetryInfo). See store/faults.py.
STORE_UNAVAILABLE = "STORE_UNAVAILABLE"
# A cluster (several sidecars on one PostgreSQL): the session's lane moved to
# another sidecar (this one lost its lease) or its holder cannot be reached;
# nothing was acknowledged by this call, retry (docs/cluster.md).
LANE_MOVED = "LANE_MOVED"

DOMAIN = "agent-sidecar"


class SidecarError(Exception):
    """An error with a reason of docs/api.md. ``field`` names the offending request
    field for INVALID_ARGUMENT; ``metadata`` goes into its ErrorInfo (what a
    client acts on, e.g. where a STREAM_TOO_SLOW stream resumes)."""

    def __init__(self, reason: str, message: str, *, field: str | None = None,
                 retry_after_s: float | None = None, metadata: dict[str, str] | None = None):
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.field = field
        self.retry_after_s = retry_after_s
        self.metadata = metadata

    def __repr__(self) -> str:
        return f"SidecarError({self.reason!r}, {self.message!r})"

    def __reduce__(self):
        # Raised in the store's writer process, re-raised in the parent: the
        # keyword-only fields must survive pickling.
        return (_rebuild, (type(self), self.reason, self.message, self.field, self.retry_after_s,
                           self.metadata))


def _rebuild(cls, reason, message, field, retry_after_s, metadata=None):
    return cls(reason, message, field=field, retry_after_s=retry_after_s, metadata=metadata)


def invalid(field: str, message: str) -> SidecarError:
    return SidecarError(INVALID_ARGUMENT, f"{field}: {message}", field=field)


def not_found(what: str) -> SidecarError:
    return SidecarError(SESSION_NOT_FOUND, f"no such session: {excerpt(what)}")


# Error messages quote what the caller sent only as a short excerpt: a status's
# message travels in the trailers, which gRPC clients cap at 8-16 KiB.
EXCERPT_CHARS = 64


def excerpt(value: str, limit: int = EXCERPT_CHARS) -> str:
    """``value`` quoted (repr), cut to its first ``limit`` characters plus "…"
    when longer: the only way an error message should echo input."""
    if len(value) <= limit:
        return repr(value)
    return repr(value[:limit]) + "…"

"""Typed errors, one class per reason of the API (docs/api.md, "Error reasons").

Why a class per reason: an adapter wants ``except AgentBusy:`` (retry later)
rather than string-matching status details. Every non-OK status from the
sidecar carries a ``google.rpc.Status`` in the ``grpc-status-details-bin``
trailer with an ``ErrorInfo`` (domain ``agent-sidecar``); its ``reason`` picks
the class. The same reason appears in ``failed`` frames, so a turn that fails
mid-stream raises the same class as one refused up front.

A reason is only ever the sidecar's: a status without an ErrorInfo of that
domain (a proxy, gRPC itself; a foreign domain's ErrorInfo is ignored) is a
``SidecarError`` with ``reason == ""`` -- except DEADLINE_EXCEEDED, the call's
own deadline, which is ``DeadlineExceeded`` (reason "" too: never
AGENT_TIMEOUT, which is a turn's server-side timeout).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

import grpc
from google.protobuf import any_pb2, message
from google.rpc import error_details_pb2, status_pb2

from agent_sidecar_client._connect import explain

DOMAIN = "agent-sidecar"
_DETAILS_KEY = "grpc-status-details-bin"


class SidecarError(Exception):
    """Base of every error the client raises for a sidecar call.

    ``code`` is a ``grpc.StatusCode``, ``reason`` the ErrorInfo reason (or the
    class default when inferred), ``message`` the human-readable text,
    ``metadata`` the ErrorInfo metadata map, ``retry_delay`` seconds from a
    RetryInfo detail (None when absent), ``field_violations`` a list of
    ``(field, description)`` from a BadRequest detail.
    """

    default_reason = ""
    default_code = grpc.StatusCode.UNKNOWN

    def __init__(
        self,
        code: grpc.StatusCode | None = None,
        reason: str | None = None,
        message: str = "",
        *,
        metadata: dict[str, str] | None = None,
        retry_delay: float | None = None,
        field_violations: list[tuple[str, str]] | None = None,
    ) -> None:
        self.code = code if code is not None else self.default_code
        self.reason = reason if reason is not None else self.default_reason
        self.message = message
        self.metadata = dict(metadata or {})
        self.retry_delay = retry_delay
        self.field_violations = list(field_violations or [])
        super().__init__(message)

    def __str__(self) -> str:
        label = self.reason or self.code.name
        return f"{label}: {self.message}" if self.message else label

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code.name}, reason={self.reason!r}, message={self.message!r})"


class AgentBusy(SidecarError):
    """REJECT_IF_BUSY and a turn is in flight; see ``retry_delay``."""

    default_reason = "AGENT_BUSY"
    default_code = grpc.StatusCode.ABORTED


class AgentTimeout(SidecarError):
    """The turn exceeded its server-side timeout (``agent.gateway_timeout``)."""

    default_reason = "AGENT_TIMEOUT"
    default_code = grpc.StatusCode.DEADLINE_EXCEEDED


class LlmApiFailure(SidecarError):
    """The model backend failed after its retries."""

    default_reason = "LLM_API_FAILURE"
    default_code = grpc.StatusCode.UNAVAILABLE


class MaxIterations(SidecarError):
    """The agent loop reached max_iterations."""

    default_reason = "MAX_ITERATIONS"
    default_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class ToolScopeViolation(SidecarError):
    """The model called a tool outside the session's allowed subtrees."""

    default_reason = "TOOL_SCOPE_VIOLATION"
    default_code = grpc.StatusCode.PERMISSION_DENIED


class ToolInvokeFailed(SidecarError):
    """A tool host failed and the turn could not go on."""

    default_reason = "TOOL_INVOKE_FAILED"
    default_code = grpc.StatusCode.UNAVAILABLE


class Cancelled(SidecarError):
    """The turn was cancelled (Cancel, SuspendSession, INTERRUPT, ResetSession)."""

    default_reason = "CANCELLED"
    default_code = grpc.StatusCode.CANCELLED


class SessionNotFound(SidecarError):
    """No such session key or id."""

    default_reason = "SESSION_NOT_FOUND"
    default_code = grpc.StatusCode.NOT_FOUND


class InvalidArgument(SidecarError):
    """A malformed or oversized request; ``field_violations`` names the fields."""

    default_reason = "INVALID_ARGUMENT"
    default_code = grpc.StatusCode.INVALID_ARGUMENT


class Unauthenticated(SidecarError):
    """Missing or wrong credential."""

    default_reason = "UNAUTHENTICATED"
    default_code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(SidecarError):
    """A credential used outside its platforms (or an admin-only call without admin)."""

    default_reason = "PERMISSION_DENIED"
    default_code = grpc.StatusCode.PERMISSION_DENIED


class WorkerCrashed(SidecarError):
    """The worker running the turn died; the session is marked resume_pending."""

    default_reason = "WORKER_CRASHED"
    default_code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(SidecarError):
    """The call's own deadline passed (``call_timeout``, ``prompt(timeout=)``):
    a client-side deadline, no reason of the sidecar's."""

    default_reason = ""
    default_code = grpc.StatusCode.DEADLINE_EXCEEDED


class TurnFramesGone(SidecarError):
    """A stream being resumed found its turn over but the frames it had not
    seen yet gone (deleted or past retention): the rest of the turn cannot be
    read. Not retryable; read the transcript instead."""

    default_reason = ""
    default_code = grpc.StatusCode.DATA_LOSS


# The other reasons of docs/semantics.md's reason table, each with its code.


class FailedPrecondition(SidecarError):
    """The request is well formed but the state forbids it."""

    default_reason = "FAILED_PRECONDITION"
    default_code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(SidecarError):
    """A limit of the turn was reached (max_frames_per_turn, max_reply_chars)."""

    default_reason = "RESOURCE_EXHAUSTED"
    default_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(SidecarError):
    """The sidecar cannot take the call now (shutting down); safe to retry."""

    default_reason = "UNAVAILABLE"
    default_code = grpc.StatusCode.UNAVAILABLE


class RequestNotFound(SidecarError):
    """WatchActivity named a request id the sidecar has never seen (or past retention)."""

    default_reason = "REQUEST_NOT_FOUND"
    default_code = grpc.StatusCode.NOT_FOUND


class Internal(SidecarError):
    """A bug in the sidecar."""

    default_reason = "INTERNAL"
    default_code = grpc.StatusCode.INTERNAL


class RestartInterrupted(SidecarError):
    """The turn was in flight when the sidecar crashed; its session auto-resumes."""

    default_reason = "restart_interrupted"
    default_code = grpc.StatusCode.UNAVAILABLE


class ShutdownTimeout(SidecarError):
    """The turn was still running when a graceful shutdown's drain_timeout ran out."""

    default_reason = "shutdown_timeout"
    default_code = grpc.StatusCode.UNAVAILABLE


class StreamTooSlow(SidecarError):
    """A stream whose reader stopped reading was ended; streams resume from it by themselves."""

    default_reason = "STREAM_TOO_SLOW"
    default_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Overloaded(SidecarError):
    """The sidecar's admission limits are reached; retry after ``retry_delay``."""

    default_reason = "OVERLOADED"
    default_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class QueueFull(SidecarError):
    """The session already has queue_cap prompts waiting."""

    default_reason = "QUEUE_FULL"
    default_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class StoreUnavailable(SidecarError):
    """The store cannot write right now; retry with the same request id is safe."""

    default_reason = "STORE_UNAVAILABLE"
    default_code = grpc.StatusCode.UNAVAILABLE


class LaneMoved(SidecarError):
    """Another sidecar of the cluster runs the session now; retry with the same request id."""

    default_reason = "LANE_MOVED"
    default_code = grpc.StatusCode.UNAVAILABLE


# Reasons after which a Prompt (or a watch by request id) carries on by itself
# with the same request id once the RetryInfo delay has passed: nothing of the
# request was lost (docs/api.md, docs/cluster.md).
RETRY_SAME_REQUEST_REASONS = frozenset({"LANE_MOVED", "OVERLOADED", "STORE_UNAVAILABLE", "UNAVAILABLE",
                                        "STREAM_TOO_SLOW"})


BY_REASON: dict[str, type[SidecarError]] = {
    cls.default_reason: cls
    for cls in (AgentBusy, AgentTimeout, LlmApiFailure, MaxIterations, ToolScopeViolation,
                ToolInvokeFailed, Cancelled, SessionNotFound, InvalidArgument, Unauthenticated,
                PermissionDenied, WorkerCrashed, FailedPrecondition, ResourceExhausted, Unavailable,
                RequestNotFound, Internal, RestartInterrupted, ShutdownTimeout, StreamTooSlow, Overloaded,
                QueueFull, StoreUnavailable, LaneMoved)
}

# Without an ErrorInfo only the call's own deadline has a class of its own.
_BY_CODE: dict[grpc.StatusCode, type[SidecarError]] = {
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
}

_CODE_BY_VALUE = {c.value[0]: c for c in grpc.StatusCode}


def code_from_int(value: int) -> grpc.StatusCode:
    """Map a numeric gRPC code (as in google.rpc.Status.code) to the enum."""
    return _CODE_BY_VALUE.get(value, grpc.StatusCode.UNKNOWN)


def status_from_trailers(trailers: Iterable[Any] | None) -> status_pb2.Status | None:
    """Find and parse the ``grpc-status-details-bin`` trailer.

    Accepts grpc.aio.Metadata (yields ``(key, value)``) and the sync API's
    tuple of ``_Metadatum`` alike. Returns None when absent or unparsable.
    """
    for item in trailers or ():
        key, value = (item.key, item.value) if hasattr(item, "key") else item
        if key == _DETAILS_KEY and isinstance(value, (bytes, bytearray)):
            try:
                return status_pb2.Status.FromString(bytes(value))
            except Exception:  # noqa: BLE001 - a garbled trailer must not mask the RPC error
                return None
    return None


_M = TypeVar("_M", bound=message.Message)


def _unpack(detail: any_pb2.Any, cls: type[_M]) -> _M | None:
    msg = cls()
    return msg if detail.Unpack(msg) else None


def from_status(status: status_pb2.Status, code: grpc.StatusCode | None = None) -> SidecarError:
    """Build the typed error for a ``google.rpc.Status`` (details unpacked)."""
    code = code or code_from_int(status.code)
    reason, metadata, retry_delay = None, {}, None
    violations: list[tuple[str, str]] = []
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = _unpack(detail, error_details_pb2.ErrorInfo)
            # Only the sidecar's domain names a reason; another domain's (a
            # proxy's, say) is not one of the API's reasons and is ignored.
            if info is not None and info.domain == DOMAIN and reason is None:
                reason, metadata = info.reason, dict(info.metadata)
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = _unpack(detail, error_details_pb2.RetryInfo)
            if info is not None:
                retry_delay = info.retry_delay.seconds + info.retry_delay.nanos / 1e9
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            info = _unpack(detail, error_details_pb2.BadRequest)
            if info is not None:
                violations.extend((v.field, v.description) for v in info.field_violations)
    return make_error(code, reason, status.message, metadata=metadata,
                      retry_delay=retry_delay, field_violations=violations)


def make_error(code: grpc.StatusCode, reason: str | None, message: str, **extra: Any) -> SidecarError:
    """Pick the class by reason, else (no reason) by code, else the base class.
    A reason is only ever the sidecar's: without one it stays ""."""
    cls = BY_REASON.get(reason or "") or (None if reason else _BY_CODE.get(code)) or SidecarError
    return cls(code, reason or "", message, **extra)


def from_rpc_error(error: grpc.RpcError) -> SidecarError:
    """Convert a grpc error (sync or aio) into the typed error it carries."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = explain((error.details() if hasattr(error, "details") else None) or "")
    trailers = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    status = status_from_trailers(trailers)
    if status is not None:
        err = from_status(status, code)
        err.message = err.message or details
        err.args = (err.message,)
    else:
        err = make_error(code, None, details)
    err.__cause__ = error
    return err


def has_error_info(error: grpc.RpcError) -> bool:
    """True when the status carries a sidecar ErrorInfo (domain ``agent-sidecar``):
    a real, final answer from the sidecar rather than a transport failure worth
    resuming. An ErrorInfo of another domain does not count."""
    status = status_from_trailers(error.trailing_metadata() if hasattr(error, "trailing_metadata") else None)
    if status is None:
        return False
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = _unpack(detail, error_details_pb2.ErrorInfo)
            if info is not None and info.domain == DOMAIN:
                return True
    return False


def client_closed() -> SidecarError:
    """What every call of a closed client raises, the calls in flight when it
    was closed included: CANCELLED without a reason (the sidecar said nothing),
    "the client was closed", as in the Node and Go clients."""
    return SidecarError(grpc.StatusCode.CANCELLED, "", "the client was closed")


def from_failed_frame(reason: str, message: str) -> SidecarError:
    """The typed error for a ``failed{reason, message}`` frame, used when the
    RPC's own status is lost (e.g. the stream was cut right after the frame)."""
    cls = BY_REASON.get(reason, SidecarError)
    return cls(None if cls is not SidecarError else grpc.StatusCode.UNKNOWN, reason, message)

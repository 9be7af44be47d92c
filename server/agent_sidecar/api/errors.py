"""From ``SidecarError`` to a gRPC status carrying google.rpc.ErrorInfo.

Every non-OK status the sidecar sends has an ErrorInfo (domain
``agent-sidecar``, reason of docs/api.md); INVALID_ARGUMENT adds a BadRequest field
violation naming the field; AGENT_BUSY and STORE_UNAVAILABLE add RetryInfo.
"""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from .. import errors as E

CODE_FOR_REASON: dict[str, grpc.StatusCode] = {
    E.AGENT_BUSY: grpc.StatusCode.ABORTED,
    E.AGENT_TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    E.LLM_API_FAILURE: grpc.StatusCode.UNAVAILABLE,
    E.MAX_ITERATIONS: grpc.StatusCode.RESOURCE_EXHAUSTED,
    E.TOOL_SCOPE_VIOLATION: grpc.StatusCode.PERMISSION_DENIED,
    E.TOOL_INVOKE_FAILED: grpc.StatusCode.UNAVAILABLE,
    E.CANCELLED: grpc.StatusCode.CANCELLED,
    E.SESSION_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    E.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    E.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    E.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    E.WORKER_CRASHED: grpc.StatusCode.UNAVAILABLE,
    E.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    E.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    E.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    E.REQUEST_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    E.INTERNAL: grpc.StatusCode.INTERNAL,
    E.STREAM_TOO_SLOW: grpc.StatusCode.RESOURCE_EXHAUSTED,
    E.OVERLOADED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    E.QUEUE_FULL: grpc.StatusCode.RESOURCE_EXHAUSTED,
    "restart_interrupted": grpc.StatusCode.UNAVAILABLE,
    "shutdown_timeout": grpc.StatusCode.UNAVAILABLE,
    E.STORE_UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    E.LANE_MOVED: grpc.StatusCode.UNAVAILABLE,
}

# RetryInfo for reasons that are always worth retrying, when the error does not
# name its own delay (a turn's ``failed`` frame re-raised on its Prompt stream).
DEFAULT_RETRY_S: dict[str, float] = {
    E.STORE_UNAVAILABLE: 1.0,
    E.LANE_MOVED: 0.2,
}


# A status message travels in the trailers, which clients cap (8-16 KiB): one
# that quotes too much input would reach the caller as a transport error instead.
# Messages quote input through errors.excerpt; this is the backstop.
MAX_MESSAGE_CHARS = 1024


def _bounded(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE_CHARS else message[:MAX_MESSAGE_CHARS] + "…"


def _pack(msg) -> any_pb2.Any:
    a = any_pb2.Any()
    a.Pack(msg)
    return a


def to_grpc_status(err: E.SidecarError) -> grpc.Status:
    code = CODE_FOR_REASON.get(err.reason, grpc.StatusCode.INTERNAL)
    details = [_pack(error_details_pb2.ErrorInfo(reason=err.reason, domain=E.DOMAIN, metadata=err.metadata))]
    if err.field:
        details.append(_pack(error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=_bounded(err.field),
                                                        description=_bounded(err.message))
        ])))
    retry_after_s = err.retry_after_s
    if retry_after_s is None:
        retry_after_s = DEFAULT_RETRY_S.get(err.reason)
    if retry_after_s is not None:
        d = duration_pb2.Duration()
        d.FromMilliseconds(int(retry_after_s * 1000))
        details.append(_pack(error_details_pb2.RetryInfo(retry_delay=d)))
    st = status_pb2.Status(code=code.value[0], message=_bounded(err.message), details=details)
    return rpc_status.to_status(st)


async def abort(context: grpc.aio.ServicerContext, err: E.SidecarError) -> None:
    """End the call with ``err``'s status and details once the handler returns.

    It sets the status and returns, where ``context.abort`` raises an
    ``AbortError``: the call's state keeps that exception, whose traceback keeps
    the handler's frames and so the request alive, and they keep the call's
    state: a reference cycle that only the cyclic GC frees, which runs rarely
    in this process (children.tune_gc). Callers return right after it.

    For the same reason ``err`` loses its traceback (and so do the errors
    it was raised from): nothing reads it after this (a bug was logged with
    it already), and a frame that holds ``err`` in a local would otherwise
    be a cycle through that traceback, keeping the request alive with it."""
    _forget_frames(err)
    st = to_grpc_status(err)
    context.set_code(st.code)
    context.set_details(st.details)
    context.set_trailing_metadata(st.trailing_metadata)


def _forget_frames(err: BaseException) -> None:
    """Drop the tracebacks of ``err`` and of every error it was raised from."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [err]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        todo += [e.__cause__, e.__context__]

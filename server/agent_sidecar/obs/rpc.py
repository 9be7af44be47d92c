"""Every RPC observed: its span (tracing on) and its access-log line (debug).

A grpc.aio server interceptor wraps each call's handler: the span is current
while the handler runs, so a turn the call accepts becomes its child; the
access-log line (``rpc``: method, peer, code, duration_ms) is logged when the
call ends, at debug level. Health and reflection calls get the line but no
span (probes every few seconds would bury the traces that matter).

Neither on: ``interceptors()`` is empty and gRPC calls the handlers directly,
as before. The status code is what the handler ended with: the one it
aborted with (``context.code()``), CANCELLED for a call cancelled under it,
UNKNOWN for an exception that escaped, else OK.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time

import grpc

from . import tracing

log = logging.getLogger("agent_sidecar.api")
_UNTRACED = ("/grpc.health.v1.", "/grpc.reflection.")


def interceptors() -> list[grpc.aio.ServerInterceptor]:
    """The server's interceptors: one when tracing or access logging is on."""
    if tracing.ACTIVE is None and not log.isEnabledFor(logging.DEBUG):
        return []
    return [Observer()]


def _code(context, error: BaseException | None) -> grpc.StatusCode:
    if isinstance(error, (asyncio.CancelledError, GeneratorExit)):  # the call went away
        return grpc.StatusCode.CANCELLED
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    if isinstance(code, int):
        return next((c for c in grpc.StatusCode if c.value[0] == code), grpc.StatusCode.UNKNOWN)
    if error is not None and not isinstance(error, grpc.aio.AbortError):
        return grpc.StatusCode.UNKNOWN
    return grpc.StatusCode.OK


class _Call:
    """One call's observation, from the handler's start to its end."""

    __slots__ = ("method", "context", "peer", "started", "span", "token")

    def __init__(self, method: str, context):
        self.method, self.context, self.started = method, context, time.perf_counter()
        # Read now: after a cancelled call's end its context's C call is gone,
        # and peer() then crashes the process (grpcio 1.85, a segfault).
        self.peer = context.peer() if log.isEnabledFor(logging.DEBUG) else ""
        self.span = self.token = None
        if tracing.ACTIVE is not None and not method.startswith(_UNTRACED):
            self.span, self.token = tracing.ACTIVE.rpc_begin(method, context.invocation_metadata())

    def end(self, error: BaseException | None) -> None:
        code = _code(self.context, error)
        if self.span is not None:
            tracing.ACTIVE.rpc_end(self.span, self.token, code)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("rpc", extra={"method": self.method, "peer": self.peer, "code": code.name,
                                    "duration_ms": round((time.perf_counter() - self.started) * 1e3, 3)})


def _observed(method: str, behavior):
    """``behavior`` (a coroutine function or an async generator function of
    ``(request, context)``) with the call observed around it."""
    if inspect.isasyncgenfunction(behavior):
        async def stream(request, context):
            call, error = _Call(method, context), None
            try:
                async for item in behavior(request, context):
                    yield item
            except BaseException as e:
                error = e
                raise
            finally:
                call.end(error)
        return stream

    async def unary(request, context):
        call, error = _Call(method, context), None
        try:
            return await behavior(request, context)
        except BaseException as e:
            error = e
            raise
        finally:
            call.end(error)
    return unary


_BUILD = {(False, False): ("unary_unary", grpc.unary_unary_rpc_method_handler),
          (False, True): ("unary_stream", grpc.unary_stream_rpc_method_handler),
          (True, False): ("stream_unary", grpc.stream_unary_rpc_method_handler),
          (True, True): ("stream_stream", grpc.stream_stream_rpc_method_handler)}


class Observer(grpc.aio.ServerInterceptor):
    """Wraps each method's handler once (they do not change while serving)."""

    def __init__(self) -> None:
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(self, continuation, details):
        wrapped = self._wrapped.get(details.method)
        if wrapped is not None:
            return wrapped
        handler = await continuation(details)
        if handler is None:
            return None
        attr, build = _BUILD[(handler.request_streaming, handler.response_streaming)]
        wrapped = self._wrapped[details.method] = build(
            _observed(details.method, getattr(handler, attr)),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)
        return wrapped

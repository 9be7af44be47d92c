"""The edge every call of our three services crosses before its handler runs.

In order, each step refused with a status carrying ErrorInfo:

1. who is calling (api/auth.py), before the request is read: an
   unauthenticated TCP caller costs no more than its headers, whatever it sends;
2. how large the request is, before it is parsed: at most what a request of
   that RPC within every field cap can take (api/caps.py); INVALID_ARGUMENT
   naming the largest field (api/wire.py). A large unary request also takes
   its size from the parent's budget for large requests, and is refused
   OVERLOADED while that is spent (api/request_budget.py);
3. whether it parses: bytes protobuf refuses (invalid UTF-8 in a string,
   a corrupt wire format) are INVALID_ARGUMENT naming the field, and one short
   log line instead of gRPC's UNKNOWN and traceback;
4. whether every field is within its cap, before any handler looks it up;
5. for a response stream, whether its credential may open one more
   (api/auth.py ``StreamQuota``): OVERLOADED past
   ``limits.max_streams_per_credential``.

Then the handler runs with ``(request, context, principal)``: the principal is
computed once, here. The standard services (health, reflection: api/server.py
``GenericOnly``) get step 3 only (``parsed_only``): they need no credential,
and a caller without one may hold only so many of their streams open
(api/auth.py ``AnonymousStreams``).

How: the generated ``add_*Servicer_to_server`` functions register their method
handlers on a ``Boundary`` standing in for the server, which wraps each one.
A unary request is declared to gRPC as a stream of requests, so that gRPC does
not read and parse it before any of our code runs (it does so for a unary
request before the handler is called); the wrapper authenticates, then reads
the one message as raw bytes itself. On the wire nothing changes: a unary call
is a stream with one message. A server interceptor, gRPC's usual place for
authentication, sees the method and metadata but not the peer, so it cannot
tell the trusted Unix socket from TCP.

When every listener is a Unix socket (``trusted_only``) there is no caller to
refuse before its request is read, so a unary request is read by gRPC as
usual, through the same checks (``_Reader.parse_or_refusal`` as its
deserializer): one read operation per call fewer. The refusals and their
statuses are the same either way.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging

import grpc
from google.protobuf.message import DecodeError

from ..errors import SidecarError, invalid
from ..heap import LARGE_BYTES, Trimmer
from . import wire
from .auth import StreamQuota
from .caps import Caps
from .errors import abort
from .request_budget import Held, RequestBudget

log = logging.getLogger("agent_sidecar.api")


class Boundary:
    """Takes the place of the grpc.aio server in the generated
    ``add_*Servicer_to_server(servicer, server)``: every method handler they
    register reaches the real server wrapped. They register each service twice
    (generic and registered handlers, the same dict); the wrapped handlers,
    built from the registered call, reach the server as generic handlers only
    (why: ``GenericOnly`` in api/server.py)."""

    def __init__(self, server: grpc.aio.Server, auth, caps: Caps, budget: RequestBudget,
                 trusted_only: bool = False):
        self.server, self.auth, self.caps, self.budget = server, auth, caps, budget
        self.streams = StreamQuota(caps.limits.max_streams_per_credential)
        self.trusted_only = trusted_only  # every listener is a Unix socket (see the module docstring)
        self.trimmer = Trimmer()

    def add_generic_rpc_handlers(self, handlers) -> None:
        pass  # the same handlers follow in add_registered_method_handlers

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        wrapped = {name: self.wrap(service, name, h) for name, h in handlers.items()}
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, wrapped),))

    def wrap(self, service: str, name: str, h: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        # The generated Request.FromString, bound to its class (the stubs type it as an optional plain callable).
        cls = h.request_deserializer.__self__  # type: ignore[union-attr]
        limit = self.caps.request_limit(cls.DESCRIPTOR)
        self.caps.plan(cls.DESCRIPTOR)  # a field without a cap fails here, at startup
        reader = _Reader(cls, limit, self.caps, f"/{service}/{name}", self.trimmer,
                         None if h.request_streaming else self.budget)
        auth = self.auth
        if not h.request_streaming:
            behavior = h.unary_stream if h.response_streaming else h.unary_unary
            if h.response_streaming and not inspect.isasyncgenfunction(behavior):
                raise TypeError(f"{name}: a response stream must be an async generator")
            wrapper = functools.partial(_unary_stream, self.streams) if h.response_streaming \
                else _unary_unary
            if self.trusted_only:  # gRPC reads the request, through our checks
                make = grpc.unary_stream_rpc_method_handler if h.response_streaming \
                    else grpc.unary_unary_rpc_method_handler
                return make(wrapper(functools.partial(_admit_read, auth), behavior),
                            request_deserializer=reader.parse_or_refusal,
                            response_serializer=_bytes_as_is(h.response_serializer))
            make = grpc.stream_stream_rpc_method_handler if h.response_streaming \
                else grpc.stream_unary_rpc_method_handler
            return make(wrapper(functools.partial(_admit, auth, reader), behavior),
                        response_serializer=_bytes_as_is(h.response_serializer))
        if not h.response_streaming or not inspect.iscoroutinefunction(h.stream_stream):
            raise TypeError(f"{name}: a request stream must be a reader/writer coroutine")
        return grpc.stream_stream_rpc_method_handler(
            _stream_stream(auth, self.streams, h.stream_stream), request_deserializer=reader.parse,
            response_serializer=_bytes_as_is(h.response_serializer))


def _decoded(cls, raw: bytes, method: str):
    """``cls`` parsed from ``raw``; bytes protobuf refuses are INVALID_ARGUMENT
    naming the field (step 3), with one short log line."""
    try:
        return cls.FromString(raw)
    except DecodeError:
        field, problem = wire.undecodable(cls.DESCRIPTOR, raw)
        log.warning("undecodable request", extra={"rpc": method, "field": field,
                                                  "problem": problem, "bytes": len(raw)})
        raise invalid(field, problem) from None


class _Reader:
    """Size check, parse and caps of one RPC's request messages; with a
    ``budget`` (a unary request), a large one's share of it as well."""

    def __init__(self, cls, limit: int, caps: Caps, method: str, trimmer: Trimmer,
                 budget: RequestBudget | None = None):
        self.cls, self.limit, self.caps, self.method = cls, limit, caps, method
        self.trimmer, self.budget = trimmer, budget

    def parse(self, raw: bytes):
        """The request of ``raw``, or SidecarError: INVALID_ARGUMENT naming a field."""
        desc = self.cls.DESCRIPTOR
        if len(raw) >= LARGE_BYTES:
            self.trimmer.after_large()
        if len(raw) > self.limit:
            raise invalid(wire.largest(desc, raw),
                          f"too large: the request has {len(raw)} bytes, a {desc.name}"
                          f" at most {self.limit}")
        request = _decoded(self.cls, raw, self.method)
        self.caps.check(request, len(raw))
        return request

    def parse_held(self, raw: bytes) -> tuple[object, Held | None]:
        """``parse`` of a unary request, after taking its share of the budget
        (SidecarError OVERLOADED when spent): (request, its share or None)."""
        held = self.budget.take(len(raw)) if self.budget is not None and len(raw) <= self.limit else None
        try:
            return self.parse(raw), held
        except BaseException:
            if held is not None:
                held.release()
            raise

    def parse_or_refusal(self, raw: bytes):
        """``parse_held`` as gRPC's deserializer: a refusal is returned, not
        raised (raised, gRPC would end the call with its own status)."""
        try:
            return self.parse_held(raw)
        except SidecarError as e:
            return e

    async def read(self, context) -> tuple[object, Held | None]:
        """The call's one request message, read only now (``parse_held``)."""
        raw = await context.read()
        if raw is grpc.aio.EOF:
            raise invalid("request", "no request message was sent")
        return self.parse_held(raw)


_REFUSED = (None, None, None)


async def _admit(auth, reader: _Reader, requests, context):
    """(request, principal, its share of the budget), or ``_REFUSED`` with the
    call's error status set; the request is read only once its caller is
    authenticated."""
    try:
        principal = auth.authenticate(context)
    except SidecarError as e:
        reader.trimmer.after_large()  # what gRPC buffered of its request, unread
        await abort(context, e)
        return _REFUSED
    try:
        request, held = await reader.read(context)
        return request, principal, held
    except SidecarError as e:
        await abort(context, e)
        return _REFUSED


async def _admit_read(auth, parsed, context):
    """``_admit`` for a request gRPC read already (``trusted_only``): ``parsed``
    is what ``_Reader.parse_or_refusal`` returned, (request, share) or a refusal."""
    try:
        if isinstance(parsed, SidecarError):
            raise parsed
        request, held = parsed
        try:
            return request, auth.authenticate(context), held
        except SidecarError:
            if held is not None:
                held.release()
            raise
    except SidecarError as e:
        await abort(context, e)
        return _REFUSED


def parsed_only(service: str, name: str, h: grpc.RpcMethodHandler,
                gate=None) -> grpc.RpcMethodHandler:
    """A standard service's handler (health, reflection) with step 3 only:
    bytes that are no valid request end the call INVALID_ARGUMENT naming the
    field, with ErrorInfo and one short log line, as for our services; gRPC
    itself answers UNKNOWN and logs a traceback, per call, for a caller that
    needs no credential (a health probe). No authentication and no caps: their
    requests are bounded by the server's largest message. A response stream
    (health's Watch, reflection) is open only while ``gate`` (auth.py
    ``AnonymousStreams``) admits it: a caller without a credential may not
    hold them open without bound."""
    cls = h.request_deserializer.__self__  # type: ignore[union-attr]  # the generated FromString
    method = f"/{service}/{name}"

    def parse(raw: bytes):
        try:
            return _decoded(cls, raw, method)
        except SidecarError as e:  # returned, not raised (gRPC would end the call its own way)
            return e

    if not h.request_streaming and not h.response_streaming:
        return grpc.unary_unary_rpc_method_handler(_refusing_unary(h.unary_unary), parse,
                                                   h.response_serializer)
    if not h.request_streaming:
        return grpc.unary_stream_rpc_method_handler(_refusing_unary_stream(h.unary_stream, gate), parse,
                                                    h.response_serializer)
    if not inspect.isasyncgenfunction(h.stream_stream):
        raise TypeError(f"{name}: a standard request stream handler must be an async generator")
    return grpc.stream_stream_rpc_method_handler(_refusing_streams(h.stream_stream, gate), parse,
                                                 h.response_serializer)


def _refusing_unary(behavior):
    async def unary_unary(request, context):
        if isinstance(request, SidecarError):
            await abort(context, request)
            return None
        return await behavior(request, context)
    return unary_unary


@contextlib.contextmanager
def _admitted(gate, context):
    """While a standard service's stream is open: counted by ``gate`` (when
    it counts this caller), or SidecarError OVERLOADED before it starts."""
    counted = gate is not None and gate.enter(context)
    try:
        yield
    finally:
        if counted:
            gate.leave()


def _refusing_unary_stream(behavior, gate=None):
    """Of the same kind as ``behavior``, which gRPC tells apart: an async
    generator (reflection's) or a coroutine that writes through its context
    (health's Watch)."""
    if inspect.isasyncgenfunction(behavior):
        async def unary_stream(request, context):
            try:
                if isinstance(request, SidecarError):
                    raise request
                with _admitted(gate, context):
                    async for item in behavior(request, context):
                        yield item
            except SidecarError as e:
                await abort(context, e)
        return unary_stream

    async def writing(request, context):
        try:
            if isinstance(request, SidecarError):
                raise request
            with _admitted(gate, context):
                await behavior(request, context)
        except SidecarError as e:
            await abort(context, e)
    return writing


def _refusing_streams(behavior, gate=None):
    """A request that does not parse ends the call where the handler reads it."""
    async def raising(requests):
        async for request in requests:
            if isinstance(request, SidecarError):
                raise request
            yield request

    async def stream_stream(requests, context):
        try:
            with _admitted(gate, context):
                async for item in behavior(raising(requests), context):
                    yield item
        except SidecarError as e:
            await abort(context, e)
    return stream_stream


def _bytes_as_is(serialize):
    """The handler's response serializer, except that bytes go out as they
    are: a stream of frames yields each response already encoded, once for
    all the streams that carry it (turns/subscriber.py StreamedFrame)."""
    def serializer(response) -> bytes:
        return response if type(response) is bytes else serialize(response)
    return serializer


def _unary_unary(admit, behavior):
    """``admit(first, context)``: ``_admit`` or ``_admit_read``, bound; ``first``
    is what gRPC passes the handler (the request stream, or the request)."""
    async def unary_unary(first, context):
        request, principal, held = await admit(first, context)
        if request is None:
            return None
        try:
            return await behavior(request, context, principal)
        finally:
            if held is not None:
                held.release()
    return unary_unary


def _unary_stream(streams: StreamQuota, admit, behavior):
    """As ``_unary_unary``, for a response stream, open only while ``streams``
    admits one more for its credential."""
    async def unary_stream(first, context):
        request, principal, held = await admit(first, context)
        if request is None:
            return
        try:
            streams.enter(principal)
        except SidecarError as e:
            if held is not None:
                held.release()
            await abort(context, e)
            return
        try:
            async for item in behavior(request, context, principal):
                if held is not None:  # answered: a Prompt's bytes count in turns/admission.py from here
                    held.release()
                yield item
        finally:
            streams.leave(principal)
            if held is not None:
                held.release()
    return unary_stream


def _stream_stream(auth, streams: StreamQuota, behavior):
    """A reader/writer handler: it reads each message through ``_Reader.parse``
    (the handler's deserializer), which raises its refusals from ``context.read()``.

    The response headers go out before the handler runs. A handler that writes
    from a task of its own (ServeTools' sender) may have that task cancelled
    while a write is in flight; gRPC then never learns that the write sent the
    headers, puts them into the final status batch again, and that batch fails
    (GRPC_CALL_ERROR_TOO_MANY_OPERATIONS): the caller never gets a status."""
    async def stream_stream(requests, context):
        try:
            principal = auth.authenticate(context)
            streams.enter(principal)
        except SidecarError as e:
            await abort(context, e)
            return
        try:
            await context.send_initial_metadata(())
            await behavior(requests, context, principal)
        finally:
            streams.leave(principal)
    return stream_stream

"""Decorators every handler wears: run, and turn a ``SidecarError`` into a
rich gRPC status. Anything else is a bug: it is logged with the RPC name and
surfaces as INTERNAL, and the server keeps serving. Except gRPC's own failure
to send a status on a call that has ended (a relayed error that came after the
caller's deadline): nobody is left to tell, and gRPC drops it. The caller was
authenticated, and the request read and checked, by api/boundary.py, which
passes the principal in.

In a cluster a handler may find the lane it needs run by another node
(``LaneElsewhere``, turns/leasing.py): the call is then made again on that
node by the service's ``forward`` (cluster/forward.py) and its answer relayed."""

from __future__ import annotations

import functools
import logging

import grpc
from grpc._cython.cygrpc import ExecuteBatchError  # type: ignore[import-not-found]  # sending on an ended call

from ..cluster.forward import forwarded, moved
from ..errors import INTERNAL, SidecarError
from ..turns.leasing import LaneElsewhere
from .errors import abort

log = logging.getLogger("agent_sidecar.api")


def unary(fn):
    @functools.wraps(fn)
    async def wrapper(self, request, context, principal):
        try:
            try:
                return await fn(self, request, context, principal)
            except LaneElsewhere as e:
                return await _forwarder(self, e, context).unary(
                    e, type(self).__name__, fn.__name__, request, context)
        except Exception as e:
            await _fail(context, fn.__name__, e)
    return wrapper


def _forwarder(service, e: LaneElsewhere, context):
    """The service's forwarder, unless this call was forwarded here already."""
    forward = getattr(service, "forward", None)
    if forward is None or forwarded(context):
        raise moved(e, "not this sidecar")
    return forward


async def _fail(context, name: str, e: Exception) -> None:
    """The one mapping from what a handler raised to the call's status."""
    if isinstance(e, (grpc.aio.AbortError, grpc.aio.UsageError)):
        raise e  # gRPC's own: the status is already set
    if isinstance(e, ExecuteBatchError) and context.done():
        raise e  # a status sent after the call ended (its deadline, its caller gone): gRPC ignores it
    if not isinstance(e, SidecarError):
        log.error("rpc failed", extra={"method": name}, exc_info=e)
        e = _internal(name)
    await abort(context, e)


def _internal(name: str) -> SidecarError:
    # Still a google.rpc.Status with ErrorInfo, as docs/semantics.md promises for every
    # non-OK status; the details are in the sidecar's log.
    return SidecarError(INTERNAL, f"internal error in {name} (see the sidecar log)")


def streaming(fn):
    """A stream handler raises LaneElsewhere before its first item, if at all."""
    @functools.wraps(fn)
    async def wrapper(self, request, context, principal):
        try:
            try:
                async for item in fn(self, request, context, principal):
                    yield item
            except LaneElsewhere as e:
                async for item in _forwarder(self, e, context).stream(
                        e, type(self).__name__, fn.__name__, request, context):
                    yield item
        except Exception as e:
            await _fail(context, fn.__name__, e)
    return wrapper

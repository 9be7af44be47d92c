"""Decorators every handler wears: run, and turn a ``SidecarError`` into a
rich gRPC status. Anything else is a bug: it is logged with the RPC name and
surfaces as INTERNAL, and the server keeps serving. The caller was
authenticated, and the request read and checked, by api/boundary.py, which
passes the principal in."""

from __future__ import annotations

import functools
import logging

import grpc

from ..errors import INTERNAL, SidecarError
from .errors import abort

log = logging.getLogger("agent_sidecar.api")


def unary(fn):
    @functools.wraps(fn)
    async def wrapper(self, request, context, principal):
        try:
            return await fn(self, request, context, principal)
        except Exception as e:
            await _fail(context, fn.__name__, e)
    return wrapper


async def _fail(context, name: str, e: Exception) -> None:
    """The one mapping from what a handler raised to the call's status."""
    if isinstance(e, (grpc.aio.AbortError, grpc.aio.UsageError)):
        raise e  # gRPC's own: the status is already set
    if not isinstance(e, SidecarError):
        log.error("rpc %s failed", name, exc_info=e)
        e = _internal(name)
    await abort(context, e)


def _internal(name: str) -> SidecarError:
    # Still a google.rpc.Status with ErrorInfo, as docs/semantics.md promises for every
    # non-OK status; the details are in the sidecar's log.
    return SidecarError(INTERNAL, f"internal error in {name} (see the sidecar log)")


def streaming(fn):
    @functools.wraps(fn)
    async def wrapper(self, request, context, principal):
        try:
            async for item in fn(self, request, context, principal):
                yield item
        except Exception as e:
            await _fail(context, fn.__name__, e)
    return wrapper

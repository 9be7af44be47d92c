"""Decorators every handler wears: authenticate, run, and turn a
``SidecarError`` into a rich gRPC status. Anything else is a bug: it is logged
with the RPC name and surfaces as INTERNAL, and the server keeps serving."""

from __future__ import annotations

import functools
import logging

import grpc

from ..errors import INTERNAL, SidecarError
from .errors import abort

log = logging.getLogger("agent_sidecar.api")


def unary(fn):
    @functools.wraps(fn)
    async def wrapper(self, request, context):
        try:
            principal = self.auth.authenticate(context)
            return await fn(self, request, context, principal)
        except SidecarError as e:
            await abort(context, e)
        except (grpc.aio.AbortError, grpc.aio.UsageError):
            raise
        except Exception:
            log.exception("rpc %s failed", fn.__name__)
            await abort(context, _internal(fn.__name__))
    return wrapper


def _internal(name: str) -> SidecarError:
    # Still a google.rpc.Status with ErrorInfo, as API.md promises for every
    # non-OK status; the details are in the sidecar's log.
    return SidecarError(INTERNAL, f"internal error in {name} (see the sidecar log)")


def streaming(fn):
    @functools.wraps(fn)
    async def wrapper(self, request, context):
        try:
            principal = self.auth.authenticate(context)
            async for item in fn(self, request, context, principal):
                yield item
        except SidecarError as e:
            await abort(context, e)
        except (grpc.aio.AbortError, grpc.aio.UsageError):
            raise
        except Exception:
            log.exception("rpc %s failed", fn.__name__)
            await abort(context, _internal(fn.__name__))
    return wrapper

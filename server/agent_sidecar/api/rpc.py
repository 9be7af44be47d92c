"""Decorators every handler wears: authenticate, run, and turn a
``SidecarError`` into a rich gRPC status. Anything else is a bug: it is logged
with the RPC name and surfaces as INTERNAL, and the server keeps serving."""

from __future__ import annotations

import functools
import logging

import grpc

from ..errors import SidecarError
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
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error in {fn.__name__}")
    return wrapper


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
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error in {fn.__name__}")
    return wrapper

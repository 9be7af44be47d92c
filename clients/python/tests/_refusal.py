"""What a call refuses before it sends anything: made on a client of a socket
nobody listens on (a call that refuses first never dials it)."""

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

import pytest

import agent_sidecar_client as asc


def client() -> asc.SidecarClient:
    return asc.SidecarClient("unix:/nonexistent/agent-sidecar-test.sock", call_timeout=1)


def refusal(call: Callable[[asc.SidecarClient], Any]) -> asc.InvalidArgument:
    """The InvalidArgument ``call(client)`` raises, at the call (prompt, watch)
    or when awaited (the unary calls)."""
    async def body() -> asc.InvalidArgument:
        async with client() as c:
            with pytest.raises(asc.InvalidArgument) as info:
                out = call(c)
                if inspect.isawaitable(out):
                    await out
            return info.value

    return asyncio.run(body())

"""The bench's own tool host (``--tools``): ``<platform>.echo`` and
``<platform>.sleep``, for a profile whose model calls them, counting the
invocations it answers (the JSON's ``tool_invocations``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the client is the bench extra's: imported where used
    from agent_sidecar_client import ToolHost


@dataclass
class BenchTools:
    """The bench's own tool host and the invocations it has answered."""
    host: ToolHost
    invocations: int = 0


def tool_host(namespace: str) -> BenchTools:
    """The bench's own tool host: ``<ns>.echo(text)`` and ``<ns>.sleep(ms)``,
    counting the invocations it answers (``.invocations``)."""
    from agent_sidecar_client import ToolHost

    tools = BenchTools(ToolHost(namespace))

    @tools.host.tool(description="Return the text it is given.")
    async def echo(text: str = "") -> str:
        tools.invocations += 1
        return text

    @tools.host.tool(description="Wait ms milliseconds, then return them.")
    async def sleep(ms: int = 0) -> int:
        tools.invocations += 1
        await asyncio.sleep(max(0, ms) / 1000)
        return ms

    return tools

"""The model backend interface: one small protocol every backend implements.

A backend turns a model input (OpenAI-style chat messages plus tool specs) into a
stream of events. The agent loop (turns/agent.py) owns everything else: iterations,
tool execution, timeouts, transcript bookkeeping. Backends run inside worker
processes, so they must not import grpc.

Third parties add a backend through the ``agent_sidecar.models`` entry point group;
the entry point names the class, which is constructed with the profile's
``model_options`` table.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(slots=True)
class ModelRequest:
    """One model call's input.

    ``messages`` are OpenAI chat-completions messages (dicts with ``role``,
    ``content`` and, where relevant, ``tool_calls``, ``tool_call_id``, ``name``);
    the first is the system prompt. ``tools`` are ``{"name", "description",
    "parameters"}`` dicts (parameters is a JSON-schema dict). ``iteration``
    counts model calls within the turn, from 0.
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    iteration: int = 0
    session_key: str = ""
    request_id: str = ""
    # W3C traceparent for this call's outgoing requests ("" when not traced):
    # a backend that calls over HTTP sends it as the ``traceparent`` header.
    traceparent: str = ""


@dataclass(slots=True)
class TextDelta:
    text: str


# A call id is some 30 characters, a tool name at most 64 for OpenAI (the
# sidecar's own at most limits.max_id_length): a longer one is a runaway, and
# would make frames no client can read. The agent loop refuses it from any
# backend (turns/agent.py), the openai backend as it streams in.
MAX_CALL_ID_CHARS = MAX_TOOL_NAME_CHARS = 256


@dataclass(slots=True)
class ToolCallRequest:
    """The model asks for one tool call. ``arguments_json`` is a JSON object
    text; ``call_id`` and ``name`` at most MAX_CALL_ID_CHARS and
    MAX_TOOL_NAME_CHARS."""

    call_id: str
    name: str
    arguments_json: str


@dataclass(slots=True)
class UsageReport:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float = 0.0


ModelEvent = TextDelta | ToolCallRequest | UsageReport


class ModelError(Exception):
    """The backend failed for good (after its own retries): the turn fails with
    LLM_API_FAILURE."""


class ModelBackend(Protocol):
    """What the agent loop calls. ``stream`` yields events for one model call; a
    call that yields any ToolCallRequest asks the loop to run those tools and call
    again; a call that yields none is the final answer (its text is the reply)."""

    def __init__(self, options: dict[str, Any]) -> None: ...

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]: ...

    async def aclose(self) -> None: ...

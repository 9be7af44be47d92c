"""The agent loop, run inside a worker: model call, tool calls, repeat.

One turn: build the model input (system prompt + session context + transcript +
the user's message), call the model, run the tools it asks for, call it again,
until it answers without tool calls — at most ``max_iterations`` model calls.
Everything observable goes out through ``TurnIO``: frames (text deltas, tool
calls and results, usage) and transcript messages, which the parent persists.
Timeouts and cancellation are the caller's (worker.py); this module only loops.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from .. import errors as E
from ..models.base import (
    MAX_CALL_ID_CHARS,
    MAX_TOOL_NAME_CHARS,
    ModelError,
    ModelRequest,
    TextDelta,
    ToolCallRequest,
    UsageReport,
)
from ..tools.scope import in_scope


class TurnFailed(Exception):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason, self.message = reason, message


class ToolRefused(Exception):
    """A tool call the parent refused before any host saw it (the host's
    credential does not cover the session's platform). ``result_json`` is the
    error result the model gets for it."""

    def __init__(self, reason: str, result_json: str):
        super().__init__(result_json)
        self.reason, self.result_json = reason, result_json


class TurnIO(Protocol):
    def frame(self, kind: str, body: dict[str, Any]) -> None: ...
    def message(self, msg: dict[str, Any]) -> None: ...
    async def invoke_tool(self, call_id: str, name: str, arguments_json: str) -> tuple[bool, str]: ...
    def take_steered(self) -> list[str]: ...
    def close_steering(self) -> None: ...
    def model_called(self, seconds: float, ok: bool) -> None:
        """One model call ended (for the metrics), on its own or with an error."""

    def tool_refused(self, call_id: str, name: str, reason: str) -> None:
        """A tool call refused here (outside the profile's tools), never run:
        the parent is told, which counts, logs and traces it as a failed call."""


@dataclass
class Agent:
    """A warm session: its transcript in model shape, as the store has it.

    ``next_seq`` and ``rev`` say which store state the cached transcript matches;
    ``unpersisted`` counts messages sent to the parent but not yet acknowledged
    as committed (the cache never sheds such an agent)."""

    session_key: str
    session_id: str
    rev: int
    next_seq: int
    messages: list[dict[str, Any]]
    last_used: float = 0.0
    in_turn: bool = False
    unpersisted: int = 0
    approx_bytes: int = 0

    def add(self, msg: dict[str, Any]) -> None:
        self.messages.append(msg)
        self.next_seq += 1
        self.approx_bytes += len(msg.get("content") or "") + 64


def _tool_message(call_id: str, name: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


# The result a model reads for a tool call its transcript holds no result of.
NO_RESULT = orjson.dumps({"error": "no result of this tool call was recorded"}).decode()


def paired_calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` (a transcript in model shape, as the store holds it) with
    every tool call answered before the next other message, as a model
    backend requires: a call without a result gets ``NO_RESULT``, and a tool
    message answering no open call is left out. The sidecar's own turns never
    write such a transcript, and the transcript RPCs refuse one, but an
    adapter may still end a transcript on calls it never answered (an
    assistant message with tool calls, then a Prompt), and a store written
    before those RPCs checked may hold either: sent as it is, an
    OpenAI-compatible backend refused every later turn of the session. The
    store keeps what was written; only the model's input is mended. Returns
    ``messages`` itself when nothing needs mending (the usual case)."""
    out: list[dict[str, Any]] | None = None  # the mended copy, once it differs
    pending: dict[str, str] = {}  # the calls still open: id -> tool name
    for i, m in enumerate(messages):
        if m.get("role") == "tool":
            if m.get("tool_call_id") in pending:
                del pending[m["tool_call_id"]]
                if out is not None:
                    out.append(m)
            elif out is None:  # answers no open call: left out
                out = messages[:i]
            continue
        if pending:
            out = messages[:i] if out is None else out
            out.extend(_tool_message(cid, name, NO_RESULT) for cid, name in pending.items())
        pending = _calls_of(m)
        if out is not None:
            out.append(m)
    if pending:
        out = list(messages) if out is None else out
        out.extend(_tool_message(cid, name, NO_RESULT) for cid, name in pending.items())
    return out if out is not None else messages


def _calls_of(m: dict[str, Any]) -> dict[str, str]:
    """An assistant message's tool calls, id -> tool name (none for any other)."""
    calls = m.get("tool_calls") if m.get("role") == "assistant" else None
    if not isinstance(calls, list):
        return {}
    named = {}
    for c in calls:
        if isinstance(c, dict) and isinstance(c.get("id"), str):
            fn = c.get("function")
            named[c["id"]] = str(fn.get("name", "")) if isinstance(fn, dict) else ""
    return named


def _assistant_with_calls(text: str, calls: list[ToolCallRequest]) -> dict[str, Any]:
    return {"role": "assistant", "content": text, "tool_calls": [
        {"id": c.call_id, "type": "function",
         "function": {"name": c.name, "arguments": c.arguments_json}} for c in calls]}


@dataclass
class TurnSpec:
    system_prompt: str
    tools: list[dict[str, Any]] = field(default_factory=list)  # specs offered to the model
    scopes: list[str] = field(default_factory=list)
    max_iterations: int = 25
    request_id: str = ""
    # Consecutive failed tool calls after which the turn cannot usefully go on.
    max_tool_failures: int = 3
    # The longest reply of one model call (limits.max_reply_chars, given by
    # the parent): it travels whole in the `completed` frame and in GetTranscript.
    max_reply_chars: int = field(kw_only=True)


def _keep(agent: Agent, io: TurnIO, msg: dict[str, Any]) -> None:
    """A message of the turn: into the cached transcript and to the store."""
    agent.add(msg)
    io.message(msg)


def _close_calls(agent: Agent, io: TurnIO, calls: list[ToolCallRequest], error: str) -> None:
    """Calls that will not run still get a result each, so the transcript
    stays valid for the next model call."""
    for c in calls:
        _keep(agent, io, _tool_message(c.call_id, c.name, orjson.dumps({"error": error}).decode()))


def _refuse(agent: Agent, io: TurnIO, calls: list[ToolCallRequest], result_json: str | None) -> None:
    """The turn ends at ``calls[0]``, which the model may not make: every call
    left still gets a result, and the refused one a TOOL_SCOPE_VIOLATION
    ``tool_result`` frame. ``result_json``: the refusal's own error result for
    ``calls[0]``; None for a name outside the profile's scope."""
    if result_json is None:
        for c in calls:
            _close_calls(agent, io, [c], f"tool {c.name!r} is outside this session's allowed tools")
    else:
        _keep(agent, io, _tool_message(calls[0].call_id, calls[0].name, result_json))
        _close_calls(agent, io, calls[1:], "not run: an earlier tool call was refused")
    io.frame("tool_result", {"call_id": calls[0].call_id, "ok": False,
                             "result_json": orjson.dumps({"error": "TOOL_SCOPE_VIOLATION"}).decode()})


# A backend's events are checked here, in the worker, before anything of them
# reaches a frame or the transcript: a third-party backend is code we do not
# control, and a field of the wrong type (an int for a text) left the turn
# hanging until the watchdog killed its worker. The turn fails LLM_API_FAILURE
# naming the field instead.
_COUNTS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")


def _wrong_type(field: str, value: Any, expected: str) -> str:
    return f"the model backend gave {field} as {type(value).__name__} ({value!r:.60}), expected {expected}"


def _within_reply(chars: int, spec: TurnSpec) -> int:
    """``chars`` of one model call's text and tool call arguments so far,
    refused past ``spec.max_reply_chars``: each travels whole in a frame
    (the text again in ``completed``) and in the transcript."""
    if chars > spec.max_reply_chars:
        raise TurnFailed(E.RESOURCE_EXHAUSTED, f"the model's reply passed limits.max_reply_chars "
                                               f"({spec.max_reply_chars} characters)")
    return chars


def _checked_call(ev: ToolCallRequest) -> ToolCallRequest:
    for name in ("call_id", "name", "arguments_json"):
        value = getattr(ev, name)
        if type(value) is not str:
            raise ModelError(_wrong_type(f"ToolCallRequest.{name}", value, "str"))
    for name, cap in (("call_id", MAX_CALL_ID_CHARS), ("name", MAX_TOOL_NAME_CHARS)):
        if not getattr(ev, name) or len(getattr(ev, name)) > cap:
            raise ModelError(f"ToolCallRequest.{name} must be 1 to {cap} characters, got "
                             f"{len(getattr(ev, name))}: {getattr(ev, name)[:60]!r}")
    return ev


def _usage_body(ev: UsageReport) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for name in _COUNTS:
        value = getattr(ev, name)
        if type(value) is not int or not 0 <= value < 2**63:
            raise ModelError(_wrong_type(f"UsageReport.{name}", value, "an int from 0 to 2**63"))
        body[name] = value
    cost = ev.cost_usd
    if type(cost) not in (int, float) or not 0 <= cost < 1e15:  # NaN fails both comparisons
        raise ModelError(_wrong_type("UsageReport.cost_usd", cost, "a finite number >= 0"))
    body["cost_usd"] = float(cost)
    return body


async def _model_call(agent: Agent, backend, spec: TurnSpec, io: TurnIO,
                      iteration: int) -> tuple[str, list[ToolCallRequest]]:
    """One model call, streamed out as frames: its text and its tool calls.
    Cut off mid-answer (the model failed, cancel, INTERRUPT, timeout), what the
    user already saw streamed stays in the transcript."""
    request = ModelRequest(messages=[{"role": "system", "content": spec.system_prompt}]
                           + agent.messages, tools=spec.tools, iteration=iteration,
                           session_key=agent.session_key, request_id=spec.request_id)
    parts: list[str] = []
    calls: list[ToolCallRequest] = []
    chars, t0 = 0, time.monotonic()
    try:
        async for ev in backend.stream(request):
            if type(ev) is TextDelta:
                if type(ev.text) is not str:
                    raise ModelError(_wrong_type("TextDelta.text", ev.text, "str"))
                chars = _within_reply(chars + len(ev.text), spec)
                parts.append(ev.text)
                io.frame("text_delta", {"text": ev.text})
            elif type(ev) is ToolCallRequest:
                calls.append(_checked_call(ev))
                chars = _within_reply(chars + len(ev.call_id) + len(ev.name) + len(ev.arguments_json), spec)
            elif type(ev) is UsageReport:
                io.frame("usage", _usage_body(ev))
    except BaseException as e:
        if isinstance(e, Exception):  # not a cancel or the turn's timeout: the call failed
            io.model_called(time.monotonic() - t0, False)
        if parts:
            _keep(agent, io, {"role": "assistant", "content": "".join(parts)})
        if isinstance(e, ModelError):
            raise TurnFailed(E.LLM_API_FAILURE, str(e)) from None
        raise
    io.model_called(time.monotonic() - t0, True)
    return "".join(parts), calls


async def _run_calls(agent: Agent, spec: TurnSpec, io: TurnIO, calls: list[ToolCallRequest],
                     failures: int) -> int:
    """Run one model answer's tool calls in order; returns the count of calls
    failed in a row. The model sees every error and may recover; a run of
    ``max_tool_failures`` means the host is gone for good: TOOL_INVOKE_FAILED."""
    for i, call in enumerate(calls):
        io.frame("tool_call", {"call_id": call.call_id, "name": call.name,
                               "arguments_json": call.arguments_json})
        if not in_scope(call.name, spec.scopes):
            io.tool_refused(call.call_id, call.name, E.TOOL_SCOPE_VIOLATION)
            _refuse(agent, io, calls[i:], None)
            raise TurnFailed(E.TOOL_SCOPE_VIOLATION,
                             f"the model called {call.name!r}, outside the allowed tools {spec.scopes}")
        try:
            ok, result_json = await io.invoke_tool(call.call_id, call.name, call.arguments_json)
        except ToolRefused as e:
            _refuse(agent, io, calls[i:], e.result_json)
            raise TurnFailed(e.reason, f"the call of {call.name!r} was refused: {e.result_json}") from None
        except BaseException:  # cancelled or timed out while waiting
            _close_calls(agent, io, calls[i:], "the turn ended before this tool call finished")
            raise
        io.frame("tool_result", {"call_id": call.call_id, "ok": ok, "result_json": result_json})
        _keep(agent, io, _tool_message(call.call_id, call.name, result_json))
        failures = 0 if ok else failures + 1
        if failures >= spec.max_tool_failures:
            _close_calls(agent, io, calls[i + 1:], "not run: earlier tool calls failed")
            raise TurnFailed(E.TOOL_INVOKE_FAILED,
                             f"{failures} tool calls failed in a row (last: {call.name}: {result_json[:200]})")
    return failures


async def run_turn(agent: Agent, backend, spec: TurnSpec, io: TurnIO) -> str:
    """Run the loop to its final text; raise TurnFailed on a policy failure.
    The turn's user messages are already the last entries of ``agent.messages``."""
    iteration = failures = 0
    while True:
        for text in io.take_steered():
            _keep(agent, io, {"role": "user", "content": text})
        if iteration >= spec.max_iterations:
            raise TurnFailed(E.MAX_ITERATIONS,
                             f"the agent loop reached max_iterations ({spec.max_iterations})")
        if iteration + 1 == spec.max_iterations:
            # The last model call this turn may make: a steer arriving during it
            # could not get a call of its own, so it becomes a follow-up instead.
            io.close_steering()
        text, calls = await _model_call(agent, backend, spec, io, iteration)
        iteration += 1
        if calls:
            _keep(agent, io, _assistant_with_calls(text, calls))
            failures = await _run_calls(agent, spec, io, calls, failures)
            continue
        _keep(agent, io, {"role": "assistant", "content": text})
        # A steer that arrived during this last call still gets its model call.
        steered = io.take_steered()
        if not steered:
            io.close_steering()
            return text
        for t in steered:
            _keep(agent, io, {"role": "user", "content": t})

"""The OpenAI chat-completions wire format: pure functions, no I/O.

Split from openai.py so the HTTP/retry logic stays short and this part -- name
mapping, message conversion, SSE chunk parsing, tool-call fragment assembly --
can be tested without a server.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import re
import time
from typing import Any

from agent_sidecar.models.base import ModelError, ModelEvent, TextDelta, ToolCallRequest, UsageReport

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def safe_tool_name(name: str) -> str:
    """The OpenAI-safe form of a dotted tool name: '.' -> '__', other characters
    outside ``[A-Za-z0-9_-]`` -> '_'. One to one: a name that already holds
    '__' or an unsafe character (so that two names could map alike, as
    ``t.a__b`` and ``t.a.b`` would) gets a short hash of itself appended."""
    safe = _UNSAFE.sub("_", name.replace(".", "__"))
    if "__" in name or _UNSAFE.search(name.replace(".", "")):
        safe += "_" + hashlib.sha1(name.encode()).hexdigest()[:8]
    return safe


def excerpt(body: bytes, limit: int = 500) -> str:
    """The start of an error body, for a ModelError message a human can act on."""
    text = body.decode("utf-8", "replace").strip()
    return text if len(text) <= limit else text[:limit] + "..."


def retry_after_s(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


class Retryable(Exception):
    """A failure worth another attempt (if nothing was yielded yet)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def loads_chunk(raw: bytes | str) -> dict[str, Any]:
    """Parse one JSON object from the server; an ``error`` object (some servers
    report failures mid-stream this way) becomes a ModelError."""
    try:
        data = json.loads(raw)
    except ValueError:
        body = raw if isinstance(raw, bytes) else raw.encode()
        raise ModelError(f"openai backend: invalid JSON from server: {excerpt(body)}") from None
    if not isinstance(data, dict):
        raise ModelError("openai backend: server sent a non-object JSON value")
    if data.get("error"):
        raise ModelError(f"openai backend: server error: {json.dumps(data['error'])[:500]}")
    return data


def convert_message(message: dict[str, Any], safe: Any) -> dict[str, Any]:
    """Map tool names inside a message to the safe form; copy only when needed."""
    role = message.get("role")
    if role == "assistant" and message.get("tool_calls"):
        calls = message["tool_calls"]
        if isinstance(calls, str):
            calls = json.loads(calls)
        out = dict(message)
        out["tool_calls"] = [
            {**c, "function": {**c.get("function", {}), "name": safe(c.get("function", {}).get("name", ""))}}
            for c in calls
        ]
        return out
    if role == "tool" and message.get("name"):
        return {**message, "name": safe(message["name"])}
    return message


def usage_report(usage: dict[str, Any]) -> UsageReport:
    """OpenAI usage -> UsageReport. OpenAI's prompt_tokens includes the cached
    part; the session's counters are disjoint (seed 001: input, output, cache
    read, cache write, and total = their sum), so input_tokens is the uncached
    rest."""
    details = usage.get("prompt_tokens_details") or {}
    prompt = int(usage.get("prompt_tokens") or 0)
    cached = min(int(details.get("cached_tokens") or 0), prompt)
    return UsageReport(
        input_tokens=prompt - cached,
        output_tokens=int(usage.get("completion_tokens") or 0),
        cache_read_tokens=cached,
        cost_usd=float(usage.get("cost") or 0.0),  # OpenRouter-style cost, when sent
    )


def call_tag(request_id: str, iteration: int) -> str:
    """What makes a fallback call id (for servers that send none) unique in a
    transcript: a short hash of the turn's request id, and the model call."""
    return f"{hashlib.sha1(request_id.encode()).hexdigest()[:8]}_{iteration}"


def tool_call(call_id: str | None, name: str, args: str, tag: str, n: int, names: dict[str, str]) -> ToolCallRequest:
    """A ToolCallRequest with the original (dotted) name restored; a name not
    in this request's map falls back to reversing the '__' substitution."""
    return ToolCallRequest(
        call_id=call_id or f"call_{tag}_{n}",
        name=names.get(name) or name.replace("__", "."),
        arguments_json=args or "{}",
    )


def events_from_message(data: dict[str, Any], tag: str, names: dict[str, str]) -> list[ModelEvent]:
    """Events from a non-streamed chat.completion reply."""
    events: list[ModelEvent] = []
    choices = data.get("choices") or [{}]
    message = choices[0].get("message") or {}
    if message.get("content"):
        events.append(TextDelta(message["content"]))
    for n, call in enumerate(message.get("tool_calls") or ()):
        fn = call.get("function") or {}
        events.append(tool_call(call.get("id"), fn.get("name", ""), fn.get("arguments", ""), tag, n, names))
    if data.get("usage"):
        events.append(usage_report(data["usage"]))
    return events


class StreamParser:
    """Turns SSE lines into events. Each ``data:`` line holds one JSON chunk (true
    of every OpenAI-compatible server in practice); ``data: [DONE]`` ends it."""

    def __init__(self, tag: str, names: dict[str, str]) -> None:
        self.tag = tag
        self.names = names
        self.calls: dict[int, dict[str, Any]] = {}
        self.usage: dict[str, Any] | None = None
        self.done = False
        self.finished = False  # a finish_reason was seen

    def feed(self, line: str) -> list[ModelEvent]:
        if not line.startswith("data:"):
            return []  # blank separators, comments (":"), event:/id: fields
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = True
            return []
        chunk = loads_chunk(data)
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        events: list[ModelEvent] = []
        for choice in chunk.get("choices") or ():
            if choice.get("finish_reason"):
                self.finished = True
            delta = choice.get("delta") or {}
            if delta.get("content"):
                events.append(TextDelta(delta["content"]))
            for frag in delta.get("tool_calls") or ():
                self._merge(frag)
        return events

    def _merge(self, frag: dict[str, Any]) -> None:
        index = frag.get("index")
        if index is None:  # servers that omit index: a new id starts a new call
            index = len(self.calls) if frag.get("id") or not self.calls else max(self.calls)
        call = self.calls.setdefault(index, {"id": None, "name": "", "args": []})
        if frag.get("id"):
            call["id"] = frag["id"]
        fn = frag.get("function") or {}
        if fn.get("name"):
            call["name"] += fn["name"]
        if fn.get("arguments"):
            call["args"].append(fn["arguments"])

    def finish(self) -> list[ModelEvent]:
        if not (self.done or self.finished):
            raise Retryable("stream ended before [DONE] or a finish_reason")
        events: list[ModelEvent] = [
            tool_call(c["id"], c["name"], "".join(c["args"]), self.tag, n, self.names)
            for n, (_, c) in enumerate(sorted(self.calls.items()))
        ]
        if self.usage:
            events.append(usage_report(self.usage))
        return events

"""The OpenAI chat-completions wire format: pure functions, no I/O.

Split from openai.py so the HTTP/retry logic stays short and this part -- name
mapping, message conversion, SSE chunk parsing, tool-call fragment assembly --
can be tested without a server.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import math
import re
import time
from typing import Any

from agent_sidecar.models.base import (
    MAX_CALL_ID_CHARS,
    MAX_TOOL_NAME_CHARS,
    ModelError,
    ModelEvent,
    TextDelta,
    ToolCallRequest,
    UsageReport,
)

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")

# Bounds on one answer, whatever the server sends (see openai_body). A real
# answer is at most a few MB: output is capped at some 100k tokens (well under
# 1 MB of text), tool-call arguments are of the same order, and one SSE event
# holds a delta of it. 16 MiB leaves room for the largest while an endless or
# inflated answer stops within a bounded amount of memory.
ANSWER_CAP = 16 * 2**20  # bytes of a non-streamed reply; characters of a streamed answer
# One SSE event holds a delta: a few KB, or a whole tool call's arguments from a
# server that sends them at once. Past this a line is a runaway, and parsing
# it (JSON inflates many times in memory) would cost the worker far more.
LINE_CAP = 4 * 2**20
# Bytes in a row that hold nothing of the answer (keepalive comments, chunks
# with no choices): a server that sends only that spends the worker's CPU
# for the whole turn, every other session on the worker with it.
IDLE_CAP = 2**20
# Parallel tool calls in one answer are a handful in practice; each one runs
# as its own tool invocation, so thousands would be a runaway, not a plan.
MAX_TOOL_CALLS = 256
_INT64 = 2**63
_SURROGATE = re.compile("[\ud800-\udfff]")


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
    text = body[:limit * 4].decode("utf-8", "replace").strip()
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


def loads_chunk(raw: bytes | str, what: str = "server") -> dict[str, Any]:
    """Parse one JSON object from the server (``what``: where it came from, for
    the message); an ``error`` object (some servers report failures mid-stream
    this way) becomes a ModelError."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):  # UnicodeDecodeError, too-long integers, nesting too deep
        body = raw if isinstance(raw, bytes) else raw.encode()
        raise ModelError(f"openai backend: invalid JSON from {what}: {excerpt(body)}") from None
    if not isinstance(data, dict):
        raise ModelError(f"openai backend: {what} sent a JSON {_JSON_NAMES.get(type(data), '?')}, not an object: "
                         f"{excerpt(json.dumps(data).encode(), 200)}")
    if data.get("error"):
        raise ModelError(f"openai backend: server error: {json.dumps(data['error'])[:500]}")
    return data


_JSON_NAMES = {str: "string", list: "array", dict: "object", int: "integer", float: "number", bool: "boolean"}


def _malformed(path: str, value: Any, kind: type | tuple[type, ...]) -> ModelError:
    expected = "number" if kind == (int, float) else _JSON_NAMES[kind]  # type: ignore[index]
    shown = excerpt(json.dumps(value).encode(), 100)
    return ModelError(f"openai backend: malformed reply: {path} is a JSON {_JSON_NAMES.get(type(value), '?')} "
                      f"({shown}), expected {expected}")


def field(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """``obj[key]`` when it is a ``kind`` (None when absent or null). Anything
    else is a ModelError naming the field and what came, so a server's wrong
    shape fails the call with a message rather than a TypeError deep inside
    (or, for a call id or a text that is not a string, a frame the sidecar
    cannot send)."""
    value = obj.get(key)
    if isinstance(value, str) and _SURROGATE.search(value):  # JSON's \ud800 escapes: not Unicode text
        raise ModelError(f"openai backend: malformed reply: {where}.{key} holds a lone UTF-16 surrogate "
                         f"(not valid Unicode): {excerpt(json.dumps(value).encode(), 100)}")
    if value is None or (isinstance(value, kind) and not isinstance(value, bool)):
        return value
    raise _malformed(f"{where}.{key}", value, kind)


def items(obj: dict[str, Any], key: str, kind: type, where: str) -> list[Any]:
    """``obj[key]`` as a list of ``kind`` items ([] when absent), each checked."""
    values = field(obj, key, list, where) or []
    for n, value in enumerate(values):
        if not isinstance(value, kind):
            raise _malformed(f"{where}.{key}[{n}]", value, kind)
    return values


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
    details = field(usage, "prompt_tokens_details", dict, "usage") or {}
    prompt = _count(usage, "prompt_tokens", "usage")
    cached = min(_count(details, "cached_tokens", "usage.prompt_tokens_details"), prompt)
    return UsageReport(
        input_tokens=prompt - cached,
        output_tokens=_count(usage, "completion_tokens", "usage"),
        cache_read_tokens=cached,
        cost_usd=float(_count(usage, "cost", "usage", float)),  # OpenRouter-style cost, when sent
    )


def _count(obj: dict[str, Any], key: str, where: str, kind: type = int) -> Any:
    """A usage number (0 when absent): finite, >= 0 and within int64, as the
    session's counters are -- a NaN cost or a 10**30 count would poison them."""
    value = field(obj, key, (int, float), where)
    if value is None:
        return kind(0)
    if not (math.isfinite(value) and 0 <= value < _INT64):
        raise ModelError(f"openai backend: malformed reply: {where}.{key} is {value!r}, "
                         f"expected a number from 0 to 2**63")
    return kind(value)


def call_tag(request_id: str, iteration: int) -> str:
    """What makes a fallback call id (for servers that send none) unique in a
    transcript: a short hash of the turn's request id, and the model call."""
    return f"{hashlib.sha1(request_id.encode()).hexdigest()[:8]}_{iteration}"


def tool_call(call_id: str | None, name: str, args: str, tag: str, n: int, names: dict[str, str]) -> ToolCallRequest:
    """A ToolCallRequest with the original (dotted) name restored; a name not
    in this request's map falls back to reversing the '__' substitution. A
    call with no name, or an id or a name past its cap, is a malformed reply."""
    check_call(call_id, name, n)
    if not name:
        raise ModelError(f"openai backend: malformed reply: tool call {n} has no name")
    return ToolCallRequest(
        call_id=call_id or f"call_{tag}_{n}",
        name=names.get(name) or name.replace("__", "."),
        arguments_json=args or "{}",
    )


def check_call(call_id: str | None, name: str, n: int) -> None:
    """A tool call's id and name within their caps (``n``: its place in the answer)."""
    for what, value, cap in (("id", call_id or "", MAX_CALL_ID_CHARS), ("name", name, MAX_TOOL_NAME_CHARS)):
        if len(value) > cap:
            raise ModelError(f"openai backend: malformed reply: tool call {n}'s {what} is longer than {cap} "
                             f"characters: {value[:60]!r}...")


def with_unique_ids(calls: list[ToolCallRequest]) -> list[ToolCallRequest]:
    """One answer's calls, an id that repeats an earlier one's made unique
    (``_2``, ``_3``...): each call gets its own result in the transcript, and
    a transcript with two results for one id is refused by stricter APIs."""
    seen: set[str] = set()
    for call in calls:
        base, k = call.call_id, 1
        while call.call_id in seen:
            k += 1
            call.call_id = f"{base}_{k}"
        seen.add(call.call_id)
    return calls


def _too_many_calls(count: int) -> ModelError:
    return ModelError(f"openai backend: the answer holds more than {MAX_TOOL_CALLS} tool calls "
                      f"(the cap on one answer; {count} so far)")


def events_from_message(data: dict[str, Any], tag: str, names: dict[str, str]) -> list[ModelEvent]:
    """Events from a non-streamed chat.completion reply (its size is bounded
    by the body's read; its shape is checked here)."""
    events: list[ModelEvent] = []
    choices = items(data, "choices", dict, "reply") or [{}]
    message = field(choices[0], "message", dict, "reply.choices[0]") or {}
    where = "reply.choices[0].message"
    content = field(message, "content", str, where)
    if content:
        events.append(TextDelta(content))
    calls = items(message, "tool_calls", dict, where)
    if len(calls) > MAX_TOOL_CALLS:
        raise _too_many_calls(len(calls))
    requests = []
    for n, call in enumerate(calls):
        fn = field(call, "function", dict, f"{where}.tool_calls[{n}]") or {}
        wfn = f"{where}.tool_calls[{n}].function"
        requests.append(tool_call(field(call, "id", str, f"{where}.tool_calls[{n}]"),
                                  field(fn, "name", str, wfn) or "", field(fn, "arguments", str, wfn) or "",
                                  tag, n, names))
    events += with_unique_ids(requests)
    usage = field(data, "usage", dict, "reply")
    if usage:
        events.append(usage_report(usage))
    return events


class StreamParser:
    """Turns SSE lines into events. Each ``data:`` line holds one JSON chunk (true
    of every OpenAI-compatible server in practice); ``data: [DONE]`` ends it.

    Every field is checked for its JSON type as it is read (a ModelError names
    the one that is wrong), and what the answer holds is bounded: its text and
    tool-call names and arguments together to ANSWER_CAP characters, its tool
    calls to MAX_TOOL_CALLS, a call's id and name to their caps, and the bytes
    in a row that hold nothing of it to IDLE_CAP -- so a stream that never
    stops growing, or never stops saying nothing, fails the call there instead
    of holding the worker until the turn's timeout."""

    def __init__(self, tag: str, names: dict[str, str]) -> None:
        self.tag = tag
        self.names = names
        self.calls: dict[int, dict[str, Any]] = {}
        self.usage: dict[str, Any] | None = None
        self.size = 0  # characters of text, names and arguments so far
        self.idle = 0  # bytes read since the last line that held something of the answer
        self.done = False
        self.finished = False  # a finish_reason was seen

    def _grow(self, text: str) -> None:
        self.size += len(text)
        if self.size > ANSWER_CAP:
            raise ModelError(f"openai backend: the streamed answer is longer than {ANSWER_CAP} characters "
                             f"(the cap on one answer, text and tool-call arguments together)")

    def feed(self, line: str) -> list[ModelEvent]:
        events, progress = self._read(line)
        if progress:
            self.idle = 0
            return events
        self.idle += len(line) + 1
        if self.idle > IDLE_CAP:
            raise ModelError(f"openai backend: the stream sent more than {IDLE_CAP} bytes in a row with "
                             f"nothing of the answer in them (keepalives, empty chunks)")
        return events

    def _read(self, line: str) -> tuple[list[ModelEvent], bool]:
        """A line's events, and whether it held anything of the answer."""
        if not line.startswith("data:"):
            return [], False  # blank separators, comments (":"), event:/id: fields
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = True
            return [], True
        chunk = loads_chunk(data)
        usage = field(chunk, "usage", dict, "chunk")
        if usage:
            self.usage = usage
        events: list[ModelEvent] = []
        progress = bool(usage)
        for n, choice in enumerate(items(chunk, "choices", dict, "chunk")):
            if choice.get("finish_reason"):
                self.finished = progress = True
            where = f"chunk.choices[{n}]"
            delta = field(choice, "delta", dict, where) or {}
            content = field(delta, "content", str, f"{where}.delta")
            if content:
                self._grow(content)
                events.append(TextDelta(content))
            for k, frag in enumerate(items(delta, "tool_calls", dict, f"{where}.delta")):
                progress = self._merge(frag, f"{where}.delta.tool_calls[{k}]") or progress
        return events, progress or bool(events)

    def _merge(self, frag: dict[str, Any], where: str) -> bool:
        """One fragment into its call; whether it held anything."""
        index = field(frag, "index", int, where)
        call_id = field(frag, "id", str, where)
        fn = field(frag, "function", dict, where) or {}
        name = field(fn, "name", str, f"{where}.function")
        args = field(fn, "arguments", str, f"{where}.function")
        if index is None:
            index = self._index_of(call_id)
        if index not in self.calls and len(self.calls) >= MAX_TOOL_CALLS:
            raise _too_many_calls(len(self.calls) + 1)
        call = self.calls.setdefault(index, {"id": None, "name": "", "args": []})
        if call_id:
            call["id"] = call_id
        if name:
            self._grow(name)
            call["name"] += name  # at most MAX_TOOL_NAME_CHARS (checked next): no quadratic growth
        check_call(call["id"], call["name"], index)
        if args:
            self._grow(args)
            call["args"].append(args)
        return bool(call_id or name or args)

    def _index_of(self, call_id: str | None) -> int:
        """For a server that omits index: a new id starts a new call; no id,
        or the last call's id again (sent with every fragment), goes on with it."""
        if not self.calls:
            return 0
        last = max(self.calls)
        return last if not call_id or self.calls[last]["id"] == call_id else len(self.calls)

    def finish(self) -> list[ModelEvent]:
        if not (self.done or self.finished):
            raise Retryable("stream ended before [DONE] or a finish_reason")
        events: list[ModelEvent] = list(with_unique_ids([
            tool_call(c["id"], c["name"], "".join(c["args"]), self.tag, n, self.names)
            for n, (_, c) in enumerate(sorted(self.calls.items()))
        ]))
        if self.usage:
            events.append(usage_report(self.usage))
        return events

"""The parent↔worker wire: typed messages, length-prefixed orjson over a
socketpair (children.Channel on both ends).

Every message is a dict with a ``type`` key naming one of the TypedDicts
below; both sides build them with the constructors here and read them with
``match msg["type"]``, so a message's fields are declared in one place. They
stay dicts on the wire (orjson writes and reads them without a class in
between: a busy sidecar sends tens of thousands a second).

Parent → worker: run, cancel, trust, steer, tool_result, ack, evict, clear, stop.
Worker → parent: hello, frame, message, tool_call, tool_refused, steered, done, evicted, log,
model_call.

Pure (no grpc): the worker imports it. ``encode``/``read_message``/
``open_stream`` let tests drive a real worker over its pipe.
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any, Literal, NotRequired, TypedDict

import orjson

from ..children import frame

# -- parent → worker ----------------------------------------------------------------------------

class Run(TypedDict):
    type: Literal["run"]
    request_id: str
    session_key: str
    session_id: str
    rev: int  # the incarnation revision the transcript rows are of
    base_seq: int  # the seq of the turn's first user message
    texts: list[str]  # the turn's user messages, oldest first
    profile: dict[str, Any]
    system_prompt: str
    tools: list[dict[str, Any]]
    timeout_s: float
    # Tracing on: the turn span's W3C traceparent; each model call's HTTP
    # request carries one naming a child span, reported back as a ModelCall.
    traceparent: NotRequired[str]
    # A cluster node: the time.monotonic() (one clock for every process of
    # the host) at which the worker stops the turn by itself, LANE_MOVED, its
    # lane's lease no longer trusted and its parent not stopping it (stalled).
    stop_at: NotRequired[float]


class Cancel(TypedDict):
    type: Literal["cancel"]
    request_id: str
    reason: str


class Trust(TypedDict):
    """The lanes' leases were renewed: these turns (request id -> stop_at, as
    Run's) may run on until then."""
    type: Literal["trust"]
    stop_at: dict[str, float]


class Steer(TypedDict):
    type: Literal["steer"]
    request_id: str  # the running turn
    steer_id: str  # the steering prompt's request id
    text: str
    expires: float  # time.monotonic() past which the worker refuses it (placement.steer)


class ToolResult(TypedDict):
    type: Literal["tool_result"]
    request_id: str
    call_id: str
    ok: bool
    result: str
    refused: NotRequired[str]  # a reason the call was refused before its host heard of it


class Ack(TypedDict):
    """``n`` messages of the session reached the store."""
    type: Literal["ack"]
    session_key: str
    n: int


class Evict(TypedDict):
    type: Literal["evict"]
    session_key: str


def run(request_id: str, session_key: str, session_id: str, rev: int, base_seq: int,
        texts: list[str], profile: dict[str, Any], system_prompt: str, tools: list[dict[str, Any]],
        timeout_s: float) -> Run:
    return {"type": "run", "request_id": request_id, "session_key": session_key,
            "session_id": session_id, "rev": rev, "base_seq": base_seq, "texts": texts,
            "profile": profile, "system_prompt": system_prompt, "tools": tools,
            "timeout_s": timeout_s}


def cancel(request_id: str, reason: str) -> Cancel:
    return {"type": "cancel", "request_id": request_id, "reason": reason}


def trust(stop_at: dict[str, float]) -> Trust:
    return {"type": "trust", "stop_at": stop_at}


def steer(request_id: str, steer_id: str, text: str, expires: float) -> Steer:
    return {"type": "steer", "request_id": request_id, "steer_id": steer_id, "text": text,
            "expires": expires}


def tool_result(request_id: str, call_id: str, ok: bool, result: str, refused: str = "") -> ToolResult:
    out: ToolResult = {"type": "tool_result", "request_id": request_id, "call_id": call_id, "ok": ok,
                       "result": result}
    if refused:
        out["refused"] = refused
    return out


def ack(session_key: str, n: int = 1) -> Ack:
    return {"type": "ack", "session_key": session_key, "n": n}


def evict(session_key: str) -> Evict:
    return {"type": "evict", "session_key": session_key}


CLEAR: dict = {"type": "clear"}
STOP: dict = {"type": "stop"}


# -- worker → parent ----------------------------------------------------------------------------

class Hello(TypedDict):
    type: Literal["hello"]
    pid: int
    index: int
    grpc_loaded: bool


class Frame(TypedDict):
    """An activity frame the turn produced (text_delta, tool_call, tool_result, usage)."""
    type: Literal["frame"]
    request_id: str
    kind: str
    body: dict[str, Any]


class Message(TypedDict):
    """A transcript message in the model's chat shape."""
    type: Literal["message"]
    request_id: str
    message: dict[str, Any]


class ToolCall(TypedDict):
    type: Literal["tool_call"]
    request_id: str
    call_id: str
    name: str
    arguments: str


class ToolRefused(TypedDict):
    """A tool call the worker refused itself (a name outside the profile's
    tools), so the parent never ran it: the parent counts it, logs it and
    traces it as it does a call it refuses (turns/worker_events.py)."""
    type: Literal["tool_refused"]
    request_id: str
    call_id: str
    name: str
    reason: str


class Steered(TypedDict):
    type: Literal["steered"]
    request_id: str
    steer_id: str
    ok: bool


class TurnReport(TypedDict):
    """What the worker measured of one turn, for the parent's metrics
    (turns/stats.py): each model call as ``[seconds, ok]`` (a call cut off by
    a cancel or the timeout is left out), whether the session's agent was
    warm, and how many agents the cache evicted (LRU) to make room for it."""
    backend: str
    model_calls: list[tuple[float, bool]]
    cache_hit: bool
    evicted: int


class Done(TypedDict):
    type: Literal["done"]
    request_id: str
    ok: bool
    final_text: NotRequired[str]
    reason: NotRequired[str]
    message: NotRequired[str]
    report: NotRequired[TurnReport]


class Evicted(TypedDict):
    """The worker's housekeeping shed warm agents (``why``: ttl or pressure)."""
    type: Literal["evicted"]
    why: str
    count: int
    keys: list[str]  # the first few, for the log


class Log(TypedDict):
    """A line the worker logged (built by logs.forward's handler, logged by
    the parent with logs.relog): its level (a logging level number), logger
    and message; the record's fields follow as keys of their own."""
    type: Literal["log"]
    msg: str
    level: int
    logger: str


class ModelCall(TypedDict):
    """One model call of a traced turn, reported when it is over: the span
    id its traceparent named and its wall-clock start and end (ns)."""
    type: Literal["model_call"]
    request_id: str
    span_id: str  # 16 hex digits
    start_ns: int
    end_ns: int
    iteration: int
    backend: str  # the profile's model backend (openai, echo, ...)
    model: str  # its model_options.model, when it has one
    input_tokens: int
    output_tokens: int
    error: str  # why it failed; "" when it did not


def hello(pid: int, index: int, grpc_loaded: bool) -> Hello:
    return {"type": "hello", "pid": pid, "index": index, "grpc_loaded": grpc_loaded}


def frame_msg(request_id: str, kind: str, body: dict[str, Any]) -> Frame:
    return {"type": "frame", "request_id": request_id, "kind": kind, "body": body}


def message(request_id: str, msg: dict[str, Any]) -> Message:
    return {"type": "message", "request_id": request_id, "message": msg}


def tool_call(request_id: str, call_id: str, name: str, arguments: str) -> ToolCall:
    return {"type": "tool_call", "request_id": request_id, "call_id": call_id, "name": name,
            "arguments": arguments}


def steered(request_id: str, steer_id: str, ok: bool) -> Steered:
    return {"type": "steered", "request_id": request_id, "steer_id": steer_id, "ok": ok}


def completed(request_id: str, final_text: str, report: TurnReport | None = None) -> Done:
    out: Done = {"type": "done", "request_id": request_id, "ok": True, "final_text": final_text}
    if report is not None:
        out["report"] = report
    return out


def failed(request_id: str, reason: str, message_text: str, report: TurnReport | None = None) -> Done:
    out: Done = {"type": "done", "request_id": request_id, "ok": False, "reason": reason,
                 "message": message_text}
    if report is not None:
        out["report"] = report
    return out


def tool_refused(request_id: str, call_id: str, name: str, reason: str) -> ToolRefused:
    return {"type": "tool_refused", "request_id": request_id, "call_id": call_id, "name": name,
            "reason": reason}


def turn_report(backend: str, model_calls: list[tuple[float, bool]], cache_hit: bool,
                evicted: int) -> TurnReport:
    return {"backend": backend, "model_calls": model_calls, "cache_hit": cache_hit, "evicted": evicted}


def evicted(why: str, count: int, keys: list[str]) -> Evicted:
    return {"type": "evicted", "why": why, "count": count, "keys": keys}


def model_call(request_id: str, span_id: str, start_ns: int, end_ns: int, iteration: int,
               backend: str, model: str, input_tokens: int, output_tokens: int, error: str) -> ModelCall:
    return {"type": "model_call", "request_id": request_id, "span_id": span_id, "start_ns": start_ns,
            "end_ns": end_ns, "iteration": iteration, "backend": backend, "model": model,
            "input_tokens": input_tokens, "output_tokens": output_tokens, "error": error}


# -- for tests: a real worker over its pipe -----------------------------------------------------

def encode(msg: dict) -> bytes:
    return frame(orjson.dumps(msg))


async def read_message(reader: asyncio.StreamReader) -> dict:
    header = await reader.readexactly(4)
    return orjson.loads(await reader.readexactly(int.from_bytes(header, "big")))


async def open_stream(fileno: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Wrap one end of a multiprocessing Pipe (a Unix socketpair) in asyncio streams."""
    sock = socket.socket(fileno=os.dup(fileno))
    sock.setblocking(False)
    return await asyncio.open_unix_connection(sock=sock, limit=64 * 1024 * 1024)

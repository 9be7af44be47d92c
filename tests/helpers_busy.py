"""Helpers for the busy-session, tool, cache and worker-crash tests (issue 4):
a Prompt stream read on a thread, a tool host living in the test process,
TOML profile snippets and JSON-log readers. Plain functions and classes, no fixtures."""

from __future__ import annotations

import itertools
import json
import os
import queue
import threading
import time
from typing import Any, Callable

import grpc

from agent_sidecar.v1 import common_pb2 as c
from agent_sidecar.v1 import prompt_service_pb2 as ppb
from agent_sidecar.v1 import session_service_pb2 as spb
from agent_sidecar.v1 import tool_service_pb2 as tpb
from sidecar_proc import error_info

D = ppb.DeliveryMode
_ids = itertools.count(1)


def rid(prefix: str = "r") -> str:
    return f"{prefix}-{os.getpid()}-{next(_ids)}-{time.monotonic_ns()}"


def chat() -> str:
    return f"chat{os.getpid()}x{next(_ids)}"


def source(chat_id: str | None = None, platform: str = "telegram") -> c.SessionSource:
    return c.SessionSource(platform=platform, chat_id=chat_id or chat())


# -- TOML --------------------------------------------------------------------------------

def toml_value(v: Any) -> str:
    """A Python value as a TOML (inline) value."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(type(v))


def profile(name: str, model: str = "echo", options: dict | None = None, **extra: Any) -> str:
    lines = [f"[profiles.{name}]", f"model = {toml_value(model)}"]
    if options:
        lines.append(f"model_options = {toml_value(options)}")
    lines += [f"{k} = {toml_value(v)}" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


def slow_echo(name: str = "main", latency_ms: int = 100, **extra: Any) -> str:
    return profile(name, "echo", {"token_latency_ms": latency_ms}, **extra)


def scripted(name: str, steps: list, **extra: Any) -> str:
    return profile(name, "scripted", {"steps": steps}, **extra)


def words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


# -- a Prompt stream on a thread -----------------------------------------------------------

class PromptRun:
    """One Prompt RPC, read on a background thread; frames collected as they come."""

    def __init__(self, stub, *, text: str, src: c.SessionSource | None = None, key: str = "",
                 delivery: int = 0, profile: str = "", request_id: str | None = None,
                 timeout: float = 60):
        self.request_id = request_id or rid()
        req = ppb.PromptRequest(request_id=self.request_id, text=text, delivery=delivery,
                                profile=profile)
        if src is not None:
            req.source.CopyFrom(src)
        else:
            req.session_key = key
        self.frames: list = []
        self.error: grpc.RpcError | None = None
        self.done = False
        self._cv = threading.Condition()
        self.call = stub.Prompt(req, timeout=timeout)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for r in self.call:
                if r.frame.WhichOneof("event") == "keepalive":
                    continue
                with self._cv:
                    self.frames.append(r.frame)
                    self._cv.notify_all()
        except grpc.RpcError as e:
            self.error = e
        finally:
            with self._cv:
                self.done = True
                self._cv.notify_all()

    def kinds(self) -> list[str]:
        with self._cv:
            return [f.WhichOneof("event") for f in self.frames]

    def frame(self, kind: str):
        with self._cv:
            for f in self.frames:
                if f.WhichOneof("event") == kind:
                    return f
        return None

    def wait_for(self, kind: str, timeout: float = 15):
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                for f in self.frames:
                    if f.WhichOneof("event") == kind:
                        return f
                left = deadline - time.monotonic()
                if self.done or left <= 0:
                    raise AssertionError(f"no {kind!r} frame for {self.request_id}: {self.kinds_unlocked()}"
                                         f" error={self.error and self.error.details()}")
                self._cv.wait(left)

    def kinds_unlocked(self) -> list[str]:
        return [f.WhichOneof("event") for f in self.frames]

    def result(self, timeout: float = 30) -> "PromptRun":
        deadline = time.monotonic() + timeout
        with self._cv:
            while not self.done:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{self.request_id} did not end: {self.kinds_unlocked()}")
                self._cv.wait(left)
        return self

    @property
    def terminal(self):
        return self.frames[-1] if self.frames else None

    @property
    def end(self) -> str:
        """completed / failed / superseded (after result())."""
        ends = [k for k in self.kinds() if k in ("completed", "failed", "superseded")]
        assert len(ends) == 1, (self.request_id, self.kinds())
        return ends[0]

    @property
    def reason(self) -> str | None:
        return error_info(self.error)[0] if self.error is not None else None

    @property
    def key(self) -> str:
        return self.frames[0].session_key

    @property
    def session_id(self) -> str:
        return self.frames[0].session_id

    @property
    def position(self) -> int:
        return self.frame("accepted").accepted.queue_position

    @property
    def final_text(self) -> str:
        f = self.frame("completed")
        return f.completed.final_text if f else None


def run(stub, **kw) -> PromptRun:
    """Start a prompt and wait for its accepted frame (so submission order is fixed)."""
    p = PromptRun(stub, **kw)
    p.wait_for("accepted")
    return p


def get_queue(stub, key: str):
    return stub.GetQueue(ppb.GetQueueRequest(session_key=key), timeout=10)


def transcript(sessions, session_id: str, include_rewound: bool = False) -> list:
    out, token = [], ""
    while True:
        r = sessions.GetTranscript(spb.GetTranscriptRequest(
            session_id=session_id, include_rewound=include_rewound, page_token=token), timeout=10)
        out += list(r.messages)
        token = r.next_page_token
        if not token:
            return out


def get_session(sessions, key: str):
    return sessions.GetSession(spb.GetSessionRequest(session_key=key), timeout=10).session


def tool_calls_answered(msgs) -> tuple[list[str], set[str]]:
    """(every assistant tool call id, the ids answered by a tool message)."""
    calls = []
    for m in msgs:
        if m.role == "assistant" and m.tool_calls_json:
            calls += [tc["id"] for tc in json.loads(m.tool_calls_json)]
    answered = {m.tool_call_id for m in msgs if m.role == "tool"}
    return calls, answered


def unanswered_calls(msgs) -> list[str]:
    """Tool call ids not answered by the tool messages right after their assistant
    message (what an OpenAI-style API requires of the next model input)."""
    out = []
    for i, m in enumerate(msgs):
        if m.role == "assistant" and m.tool_calls_json:
            ids = [tc["id"] for tc in json.loads(m.tool_calls_json)]
            after = set()
            for n in msgs[i + 1:]:
                if n.role != "tool":
                    break
                after.add(n.tool_call_id)
            out += [x for x in ids if x not in after]
    return out


def wait_until(pred: Callable[[], Any], timeout: float = 10, interval: float = 0.05, what: str = ""):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or pred}")
        time.sleep(interval)


# -- JSON log ------------------------------------------------------------------------------

def log_lines(sc, msg: str | None = None) -> list[dict]:
    out = []
    try:
        text = sc.log_path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict) and (msg is None or d.get("msg") == msg):
            out.append(d)
    return out


# -- a tool host in the test process ------------------------------------------------------

class ToolHost:
    """A ServeTools stream. ``handler(invocation)`` returns (ok, result_json, error), or
    None to leave the invocation unanswered. ``on_invocation`` is set for each one."""

    def __init__(self, stub, namespace: str, tools: list[tuple[str, str, dict]],
                 handler: Callable | None = None, register: bool = True):
        self._out: queue.Queue = queue.Queue()
        self.handler = handler
        self.invocations: list = []
        self.registered = threading.Event()
        self.on_invocation = threading.Event()
        self.error: grpc.RpcError | None = None
        self.ended = threading.Event()
        self.registered_msg = None
        self.call = stub.ServeTools(iter(self._out.get, None), timeout=60)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        if register:
            self.send_register(namespace, tools)

    def send_register(self, namespace: str, tools) -> None:
        self._out.put(tpb.ServeToolsRequest(register=tpb.RegisterTools(namespace=namespace, tools=[
            tpb.ToolSpec(name=n, description=d, parameters_json_schema=json.dumps(s))
            for n, d, s in tools])))

    def _read(self) -> None:
        try:
            for r in self.call:
                which = r.WhichOneof("message")
                if which == "registered":
                    self.registered_msg = r.registered
                    self.registered.set()
                elif which == "invocation":
                    inv = r.invocation
                    self.invocations.append(inv)
                    self.on_invocation.set()
                    answer = self.handler(inv) if self.handler else None
                    if answer is not None:
                        ok, result, err = answer
                        self._out.put(tpb.ServeToolsRequest(result=tpb.ToolInvocationResult(
                            invocation_id=inv.invocation_id, ok=ok, result_json=result, error=err)))
        except grpc.RpcError as e:
            self.error = e
        finally:
            self.ended.set()

    def wait_registered(self, timeout: float = 10) -> None:
        assert self.registered.wait(timeout), f"not registered: {self.error}"

    def close(self) -> None:
        """Half-close our side: the sidecar sees the host go."""
        self._out.put(None)

    def cancel(self) -> None:
        self._out.put(None)
        self.call.cancel()

"""Helpers for the busy-session, tool, cache and worker-crash tests (issue 4):
a Prompt stream read on a thread, a tool host living in the test process,
TOML profile snippets and JSON-log readers. Plain functions and classes, no fixtures."""

from __future__ import annotations

import json
import queue
import threading
from typing import Any, Callable

import grpc

from agent_sidecar.v1 import prompt_service_pb2 as ppb
from agent_sidecar.v1 import session_service_pb2 as spb
from agent_sidecar.v1 import tool_service_pb2 as tpb
from helpers_common import PromptRun, chat, rid, source, toml_value, wait_until  # noqa: F401

D = ppb.DeliveryMode


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

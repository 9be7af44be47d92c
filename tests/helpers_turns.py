"""Helpers shared by the gRPC-level turn tests (test_turns*.py): build a config,
run a prompt and collect its frames, watch activity, host tools. Plain
functions and small classes, no fixtures."""

from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import grpc

from agent_sidecar.v1 import common_pb2 as c
from agent_sidecar.v1 import prompt_service_pb2 as ppb
from agent_sidecar.v1 import session_service_pb2 as spb
from agent_sidecar.v1 import tool_service_pb2 as tpb
from helpers_sessions import transcript, uniq
from helpers_common import toml_value
from sidecar_proc import error_info

TERMINAL = ("completed", "failed", "superseded")

# -- config -------------------------------------------------------------------------


def config(profiles: dict[str, dict[str, Any]], gateway_timeout: float | None = None) -> str:
    """TOML text: one ``[profiles.NAME]`` table per entry."""
    out = []
    if gateway_timeout is not None:
        out += ["[agent]", f"gateway_timeout = {gateway_timeout!r}", ""]
    for name, table in profiles.items():
        out.append(f"[profiles.{name}]")
        out += [f"{k} = {toml_value(v)}" for k, v in table.items()]
        out.append("")
    return "\n".join(out)


def scripted(steps: list, **extra) -> dict[str, Any]:
    return {"model": "scripted", "model_options": {"steps": steps}, **extra}


# -- frames ---------------------------------------------------------------------------


def kind_of(frame) -> str:
    return frame.WhichOneof("event")


def body_of(frame) -> dict[str, Any]:
    sub = getattr(frame, kind_of(frame))
    return {f.name: getattr(sub, f.name) for f in sub.DESCRIPTOR.fields}


def triple(frame) -> tuple[int, str, dict[str, Any]]:
    return frame.seq, kind_of(frame), body_of(frame)


@dataclass
class Outcome:
    """A finished stream: its frames (keepalives dropped) and how it ended."""
    raw: list = field(default_factory=list)
    code: grpc.StatusCode = grpc.StatusCode.OK
    reason: str | None = None
    field: str | None = None
    details: str = ""

    @property
    def frames(self) -> list[tuple[int, str, dict[str, Any]]]:
        return [triple(f) for f in self.raw]

    @property
    def kinds(self) -> list[str]:
        return [kind_of(f) for f in self.raw]

    @property
    def last(self):
        return self.raw[-1]

    def count(self, kind: str) -> int:
        return self.kinds.count(kind)

    def text(self) -> str:
        return "".join(f.text_delta.text for f in self.raw if kind_of(f) == "text_delta")

    def usage(self) -> tuple[int, int]:
        us = [f.usage for f in self.raw if kind_of(f) == "usage"]
        return sum(u.input_tokens for u in us), sum(u.output_tokens for u in us)


def collect(stream, outcome: Outcome | None = None, stop: Callable | None = None) -> Outcome:
    """Drain a response stream (Prompt or WatchActivity) into an Outcome.
    ``stop(frame)`` true ends the reading early (the call is then cancelled)."""
    out = outcome or Outcome()
    try:
        for resp in stream:
            f = resp.frame
            if kind_of(f) == "keepalive":
                continue
            out.raw.append(f)
            if stop is not None and stop(f):
                stream.cancel()
                break
    except grpc.RpcError as e:
        out.code, out.details = e.code(), e.details() or ""
        out.reason, out.field = error_info(e)
    return out


def prompt_req(rid: str | None = None, text: str = "hello", source=None, session_key: str = "",
               profile: str = "", **kw) -> ppb.PromptRequest:
    if source is None and not session_key:
        source = c.SessionSource(platform="telegram", chat_id=uniq("t"))
    return ppb.PromptRequest(request_id=rid if rid is not None else uniq("r"), text=text,
                             source=source, session_key=session_key, profile=profile, **kw)


def run(stub, req: ppb.PromptRequest, timeout: float = 30) -> Outcome:
    return collect(stub.Prompt(req, timeout=timeout))


def watch(stub, timeout: float = 30, **kw) -> Outcome:
    """WatchActivity by request id (ends after the terminal frame)."""
    return collect(stub.WatchActivity(ppb.WatchActivityRequest(**kw), timeout=timeout))


def assert_well_formed(out: Outcome, terminal: str = "completed") -> None:
    """accepted, started, …, exactly one terminal (the last); seq 1..N gapless;
    one request id throughout."""
    seqs = [s for s, _, _ in out.frames]
    assert seqs == list(range(1, len(seqs) + 1)), seqs
    kinds = out.kinds
    assert kinds[0] == "accepted", kinds
    if terminal != "superseded":
        assert kinds[1] == "started", kinds
    assert kinds[-1] == terminal, (kinds, out.details)
    assert sum(k in TERMINAL for k in kinds) == 1, kinds
    assert len({f.request_id for f in out.raw}) == 1
    assert len({f.session_key for f in out.raw}) == 1


def assert_failed(out: Outcome, reason: str, code: grpc.StatusCode) -> None:
    assert_well_formed(out, "failed")
    assert out.last.failed.reason == reason, body_of(out.last)
    assert out.code == code, (out.code, out.details)
    assert out.reason == reason, (out.reason, out.details)


def session(sc, key: str):
    return sc.sessions().GetSession(spb.GetSessionRequest(session_key=key), timeout=10).session


def messages(sc, sid: str) -> list:
    return transcript(sc.sessions(), sid)


def wait_until(pred: Callable[[], Any], timeout: float = 10, every: float = 0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(every)
    raise AssertionError("condition not met in time")


# -- a tool host -------------------------------------------------------------------------


class ToolHost:
    """Opens ToolService.ServeTools from the test process, registers tools and
    answers each invocation with ``handlers[name](args) -> result`` (JSON)."""

    def __init__(self, sc, namespace: str, handlers: dict[str, Callable[[dict], Any]]):
        self.sc, self.namespace, self.handlers = sc, namespace, handlers
        self.outbox: queue.Queue = queue.Queue()
        self.invocations: list = []
        self.registered = threading.Event()
        self.call = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _requests(self):
        while True:
            item = self.outbox.get()
            if item is None:
                return
            yield item

    def _run(self) -> None:
        try:
            for resp in self.call:
                which = resp.WhichOneof("message")
                if which == "registered":
                    self.registered.set()
                elif which == "invocation":
                    inv = resp.invocation
                    self.invocations.append(inv)
                    result = self.handlers[inv.tool_name](json.loads(inv.arguments_json or "{}"))
                    self.outbox.put(tpb.ServeToolsRequest(result=tpb.ToolInvocationResult(
                        invocation_id=inv.invocation_id, ok=True, result_json=json.dumps(result))))
        except grpc.RpcError:
            pass

    def __enter__(self) -> "ToolHost":
        specs = [tpb.ToolSpec(name=n, description=n, parameters_json_schema=json.dumps(
            {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}))
            for n in self.handlers]
        self.outbox.put(tpb.ServeToolsRequest(register=tpb.RegisterTools(
            namespace=self.namespace, tools=specs)))
        self.call = self.sc.tools().ServeTools(self._requests())
        self.thread.start()
        assert self.registered.wait(10), "tool host not registered"
        return self

    def __exit__(self, *exc) -> None:
        self.outbox.put(None)
        self.call.cancel()
        self.thread.join(5)


class Watcher:
    """A never-ending WatchActivity (by session key or platform) read in a
    thread; ``frames_of(rid)`` waits for that request's terminal frame."""

    def __init__(self, stub, **kw):
        self.frames: list = []
        self.call = stub.WatchActivity(ppb.WatchActivityRequest(**kw), timeout=60)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for resp in self.call:
                if kind_of(resp.frame) != "keepalive":
                    self.frames.append(resp.frame)
        except grpc.RpcError:
            pass

    def frames_of(self, rid: str, timeout: float = 10) -> list:
        def done():
            fs = [f for f in self.frames if f.request_id == rid]
            return fs if fs and kind_of(fs[-1]) in TERMINAL else None
        return wait_until(done, timeout)

    def close(self) -> None:
        self.call.cancel()
        self.thread.join(5)

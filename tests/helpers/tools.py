"""A tool host in the test process: a real ServeTools stream that registers
tools and answers (or never answers) their invocations."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable
from typing import Any

import grpc

from agent_sidecar.v1 import tool_service_pb2 as tpb

# The schema of tools that take two numbers, ``a`` and ``b``.
AB_SCHEMA = {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}


def answers(fns: dict[str, Callable[[dict], Any]]) -> Callable:
    """A handler answering tool NAME with ``fns[NAME](arguments)`` as its JSON result."""
    def handle(inv):
        result = fns[inv.tool_name](json.loads(inv.arguments_json or "{}"))
        return True, json.dumps(result), ""
    return handle


class ToolHost:
    """A ServeTools stream. ``tools`` are (name, description, JSON schema) triples.
    ``handler(invocation)`` returns (ok, result_json, error), or None to leave the
    invocation unanswered (no handler: none is answered). ``with ToolHost(...)``
    waits for the registration and cancels the stream at the end."""

    def __init__(self, stub, namespace: str, tools: list[tuple[str, str, dict]],
                 handler: Callable | None = None, register: bool = True, timeout: float = 120):
        self._out: queue.Queue = queue.Queue()
        self.handler = handler
        self.invocations: list = []
        self.registered = threading.Event()
        self.on_invocation = threading.Event()
        self.error: grpc.RpcError | None = None
        self.ended = threading.Event()
        self.registered_msg = None
        self.call = stub.ServeTools(iter(self._out.get, None), timeout=timeout)
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

    def answer(self, inv, ok: bool, result: str, error: str = "") -> None:
        """Answer an invocation the handler left unanswered, now."""
        self._out.put(tpb.ServeToolsRequest(result=tpb.ToolInvocationResult(
            invocation_id=inv.invocation_id, ok=ok, result_json=result, error=error)))

    def wait_registered(self, timeout: float = 10) -> ToolHost:
        assert self.registered.wait(timeout), f"not registered: {self.error}"
        return self

    def close(self) -> None:
        """Half-close our side: the sidecar sees the host go."""
        self._out.put(None)

    def cancel(self) -> None:
        self._out.put(None)
        self.call.cancel()

    def __enter__(self) -> ToolHost:
        return self.wait_registered()

    def __exit__(self, *exc) -> None:
        self.cancel()
        self._thread.join(5)


def call_ids(m) -> list[str]:
    """The ids of the tool calls a transcript message makes (none for most)."""
    return [tc["id"] for tc in json.loads(m.tool_calls_json)] if m.tool_calls_json else []


def tool_calls_answered(msgs) -> tuple[list[str], set[str]]:
    """(every assistant tool call id, the ids answered by a tool message)."""
    calls = []
    for m in msgs:
        if m.role == "assistant":
            calls += call_ids(m)
    answered = {m.tool_call_id for m in msgs if m.role == "tool"}
    return calls, answered


def unanswered_calls(msgs) -> list[str]:
    """Tool call ids not answered by the tool messages right after their assistant
    message (what an OpenAI-style API requires of the next model input)."""
    out = []
    for i, m in enumerate(msgs):
        ids = call_ids(m) if m.role == "assistant" else []
        if ids:
            after = set()
            for n in msgs[i + 1:]:
                if n.role != "tool":
                    break
                after.add(n.tool_call_id)
            out += [x for x in ids if x not in after]
    return out

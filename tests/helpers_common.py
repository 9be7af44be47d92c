"""Helpers every gRPC-level test module shares: ids, sources, TOML values,
polling, and a Prompt stream read on a background thread."""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from typing import Any, Callable

import grpc

from agent_sidecar.v1 import common_pb2 as c
from agent_sidecar.v1 import prompt_service_pb2 as ppb
from sidecar_proc import error_info

_ids = itertools.count(1)


def rid(prefix: str = "r") -> str:
    return f"{prefix}-{os.getpid()}-{next(_ids)}-{time.monotonic_ns()}"


def chat() -> str:
    return f"chat{os.getpid()}x{next(_ids)}"


def source(chat_id: str | None = None, platform: str = "telegram") -> c.SessionSource:
    return c.SessionSource(platform=platform, chat_id=chat_id or chat())


def toml_value(v: Any) -> str:
    """A Python value as one inline TOML value (arrays, inline tables)."""
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


def wait_until(pred: Callable[[], Any], timeout: float = 10, interval: float = 0.05, what: str = ""):
    """Poll ``pred`` until it returns something truthy (returned) or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or pred}")
        time.sleep(interval)


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
        self.done = threading.Event()
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
                self.done.set()
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
                if self.done.is_set() or left <= 0:
                    raise AssertionError(f"no {kind!r} frame for {self.request_id}: {self.kinds_unlocked()}"
                                         f" error={self.error and self.error.details()}")
                self._cv.wait(left)

    def kinds_unlocked(self) -> list[str]:
        return [f.WhichOneof("event") for f in self.frames]

    def result(self, timeout: float = 30) -> "PromptRun":
        deadline = time.monotonic() + timeout
        with self._cv:
            while not self.done.is_set():
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
    def code(self):
        return self.error.code() if self.error is not None else grpc.StatusCode.OK

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

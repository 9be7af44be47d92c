"""The one result type of a Prompt or WatchActivity call: ``Stream``, its
frames (keepalives dropped) collected as they come and how the call ended.

* ``PromptRun(stub, req | text=..., source=...)``: a Prompt read on a background thread;
* ``start(stub, ...)``: the same, once its ``accepted`` frame is in (so the
  order of submissions is fixed);
* ``run(stub, req | ...)``: a Prompt read to its end;
* ``watch(stub, request_id=...)``: a WatchActivity read to its end;
* ``collect(call, stop=...)``: any response stream read to its end (or until ``stop(frame)``);
* ``Watcher(stub, platform=... | session_key=...)``: a never-ending WatchActivity on a thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
from sidecar_proc import error_info, retry_delay

from agent_sidecar.v1 import common_pb2 as c
from agent_sidecar.v1 import prompt_service_pb2 as ppb

from .ids import rid
from .ids import source as new_source
from .waiting import wait_until

D = ppb.DeliveryMode
QUEUE = D.Value("DELIVERY_MODE_QUEUE")
TERMINAL = ("completed", "failed", "superseded")


def kind_of(frame) -> str:
    return frame.WhichOneof("event")


def body_of(frame) -> dict[str, Any]:
    sub = getattr(frame, kind_of(frame))
    return {f.name: getattr(sub, f.name) for f in sub.DESCRIPTOR.fields}


class Stream:
    """A response stream's frames, read inline (``collect``) or on a thread.
    ``stop(frame)`` true ends the reading early (the call is then cancelled)."""

    def __init__(self, call, *, request_id: str = "", stop: Callable | None = None,
                 background: bool = True):
        self.call = call
        self.request_id = request_id
        self.frames: list = []
        self.error: grpc.RpcError | None = None
        self.done = threading.Event()
        self._stop = stop
        self._cv = threading.Condition()
        if background:
            threading.Thread(target=self._read, daemon=True).start()
        else:
            self._read()

    def _read(self) -> None:
        try:
            for r in self.call:
                if kind_of(r.frame) == "keepalive":
                    continue
                with self._cv:
                    self.frames.append(r.frame)
                    self._cv.notify_all()
                if self._stop is not None and self._stop(r.frame):
                    self.call.cancel()
                    break
        except grpc.RpcError as e:
            self.error = e
        finally:
            with self._cv:
                self.done.set()
                self._cv.notify_all()

    # -- waiting -------------------------------------------------------------------------

    def wait_for(self, kind: str, timeout: float = 15):
        """The first frame of this kind, once it has arrived."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                for f in self.frames:
                    if kind_of(f) == kind:
                        return f
                left = deadline - time.monotonic()
                if self.done.is_set() or left <= 0:
                    raise AssertionError(f"no {kind!r} frame for {self.request_id}: {self._kinds()}"
                                         f" error={self.error and self.error.details()}")
                self._cv.wait(left)

    def result(self, timeout: float = 30) -> Stream:
        """This stream, once the call has ended."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while not self.done.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{self.request_id} did not end: {self._kinds()}")
                self._cv.wait(left)
        return self

    # -- what came -----------------------------------------------------------------------

    def _kinds(self) -> list[str]:
        return [kind_of(f) for f in self.frames]

    def kinds(self) -> list[str]:
        with self._cv:
            return self._kinds()

    def count(self, kind: str) -> int:
        return self.kinds().count(kind)

    def frame(self, kind: str):
        """The first frame of this kind so far, or None."""
        with self._cv:
            for f in self.frames:
                if kind_of(f) == kind:
                    return f
        return None

    def triples(self) -> list[tuple[int, str, dict[str, Any]]]:
        """(seq, kind, body as a dict) per frame."""
        return [(f.seq, kind_of(f), body_of(f)) for f in self.frames]

    @property
    def last(self):
        return self.frames[-1] if self.frames else None

    @property
    def end(self) -> str:
        """completed / failed / superseded (after result())."""
        ends = [k for k in self.kinds() if k in TERMINAL]
        assert len(ends) == 1, (self.request_id, self.kinds())
        return ends[0]

    def text(self) -> str:
        return "".join(f.text_delta.text for f in self.frames if kind_of(f) == "text_delta")

    def usage(self) -> tuple[int, int]:
        us = [f.usage for f in self.frames if kind_of(f) == "usage"]
        return sum(u.input_tokens for u in us), sum(u.output_tokens for u in us)

    @property
    def final_text(self) -> str | None:
        f = self.frame("completed")
        return f.completed.final_text if f else None

    @property
    def key(self) -> str:
        return self.frames[0].session_key

    @property
    def session_id(self) -> str:
        return self.frames[0].session_id

    @property
    def position(self) -> int:
        return self.frame("accepted").accepted.queue_position

    # -- how the call ended --------------------------------------------------------------

    @property
    def code(self) -> grpc.StatusCode:
        return self.error.code() if self.error is not None else grpc.StatusCode.OK

    @property
    def reason(self) -> str | None:
        """The ErrorInfo reason of the call's error."""
        return error_info(self.error)[0] if self.error is not None else None

    @property
    def field(self) -> str | None:
        """The BadRequest field of the call's error."""
        return error_info(self.error)[1] if self.error is not None else None

    @property
    def details(self) -> str:
        return (self.error.details() or "") if self.error is not None else ""


def prompt_req(request_id: str | None = None, text: str = "hello", source: c.SessionSource | None = None,
               session_key: str = "", **kw) -> ppb.PromptRequest:
    """A PromptRequest; a new telegram chat when neither a source nor a key is given."""
    if source is None and not session_key:
        source = new_source()
    return ppb.PromptRequest(request_id=rid() if request_id is None else request_id, text=text, source=source,
                             session_key=session_key, **kw)


class PromptRun(Stream):
    """A Prompt call: ``PromptRun(stub, req)`` or ``PromptRun(stub, text=..., src=...
    | key=..., delivery=..., profile=..., request_id=...)``. With ``src`` None the
    key is used as it is (an empty key is the caller's bad request)."""

    def __init__(self, stub, req: ppb.PromptRequest | None = None, *, text: str = "",
                 src: c.SessionSource | None = None, key: str = "", delivery: int = 0,
                 profile: str = "", request_id: str | None = None, timeout: float = 60,
                 stop: Callable | None = None, background: bool = True):
        if req is None:
            req = ppb.PromptRequest(request_id=request_id or rid(), text=text, delivery=delivery,
                                    profile=profile)
            if src is not None:
                req.source.CopyFrom(src)
            else:
                req.session_key = key
        super().__init__(stub.Prompt(req, timeout=timeout), request_id=req.request_id, stop=stop,
                         background=background)


def start(stub, req: ppb.PromptRequest | None = None, **kw) -> PromptRun:
    """A Prompt on a thread, returned once accepted (so submission order is fixed)."""
    p = PromptRun(stub, req, **kw)
    p.wait_for("accepted")
    return p


def run(stub, req: ppb.PromptRequest | None = None, timeout: float = 30, **kw) -> PromptRun:
    """A Prompt read to its end (in this thread; a deadline is the call's outcome)."""
    return PromptRun(stub, req, timeout=timeout, background=False, **kw)


def run_retrying(stub, attempts: int = 5, timeout: float = 60, **kw) -> PromptRun:
    """A Prompt read to its end, sent again after the delay a STORE_UNAVAILABLE
    refusal gives (as an adapter does while the store recovers)."""
    for _ in range(attempts):
        r = PromptRun(stub, timeout=timeout, background=False, **kw)
        if r.frames or r.reason != "STORE_UNAVAILABLE":
            return r
        time.sleep(retry_delay(r.error) or 0.2)
    return r


def collect(call, stop: Callable | None = None) -> Stream:
    """Any response stream (Prompt, WatchActivity) read to its end in this thread."""
    return Stream(call, stop=stop, background=False)


def watch(stub, timeout: float = 30, **kw) -> Stream:
    """WatchActivity(request_id=...) read to its end: the persisted frames, then
    live ones up to the terminal frame."""
    return Stream(stub.WatchActivity(ppb.WatchActivityRequest(**kw), timeout=timeout),
                  request_id=kw.get("request_id", ""), background=False)


def get_queue(stub, key: str):
    return stub.GetQueue(ppb.GetQueueRequest(session_key=key), timeout=10)


def assert_well_formed(out: Stream, terminal: str = "completed") -> None:
    """accepted, started, …, exactly one terminal (the last); seq 1..N gapless;
    one request id and one session key throughout."""
    seqs = [f.seq for f in out.frames]
    assert seqs == list(range(1, len(seqs) + 1)), seqs
    kinds = out.kinds()
    assert kinds[0] == "accepted", kinds
    if terminal != "superseded":
        assert kinds[1] == "started", kinds
    assert kinds[-1] == terminal, (kinds, out.details)
    assert sum(k in TERMINAL for k in kinds) == 1, kinds
    assert len({f.request_id for f in out.frames}) == 1
    assert len({f.session_key for f in out.frames}) == 1


def assert_failed(out: Stream, reason: str, code: grpc.StatusCode) -> None:
    assert_well_formed(out, "failed")
    assert out.last.failed.reason == reason, body_of(out.last)
    assert out.code == code, (out.code, out.details)
    assert out.reason == reason, (out.reason, out.details)


class Watcher:
    """A never-ending WatchActivity (by session key or platform) read in a thread."""

    def __init__(self, stub, timeout: float = 120, **kw):
        self.frames: list = []
        self.call = stub.WatchActivity(ppb.WatchActivityRequest(**kw), timeout=timeout)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for resp in self.call:
                if kind_of(resp.frame) != "keepalive":
                    self.frames.append(resp.frame)
        except grpc.RpcError:
            pass

    def frames_of(self, request_id: str, timeout: float = 10) -> list:
        """That request's frames, once its terminal frame has come."""
        def done():
            fs = [f for f in list(self.frames) if f.request_id == request_id]
            return fs if fs and kind_of(fs[-1]) in TERMINAL else None
        return wait_until(done, timeout, what=f"the terminal frame of {request_id}")

    def request_ids(self, prefix: str = "") -> list[str]:
        """The request ids seen, in order of their first frame."""
        return list(dict.fromkeys(f.request_id for f in list(self.frames)
                                  if f.request_id.startswith(prefix)))

    def close(self) -> None:
        self.call.cancel()
        self.thread.join(5)

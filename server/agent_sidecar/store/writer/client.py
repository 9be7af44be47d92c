"""The parent's side of the writer process (see process.py).

``write(job, *args)`` pickles the job at once — so a lambda or a closure fails
at the call site, not later on the other side — and returns a future. Jobs
written during one event-loop iteration travel as one pipe message (``flush``
sends what is queued at once, for a caller that gathered a loop iteration's
writes itself); the writer answers each group commit with one message, and
the futures resolve in commit order, only then, i.e. once the write is
durable.

If the writer process dies, every pending and later write fails with
``StoreClosed`` and ``on_lost`` is called: the sidecar cannot acknowledge
anything without its store, so it stops (and its supervisor restarts it).

An answer that carries a store fault arrives as ``StoreUnavailable`` (the
writer process maps its driver's errors) and puts the store in its failing
state (``faults``), in which new jobs are refused at once and only retry jobs
(``retry=True``) are sent.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import time
from collections.abc import Callable
from typing import Any

from ...children import Channel, ChildProcess, spawn
from ...meters import BATCH_JOBS, COMMIT_SECONDS, Histogram
from ..faults import FaultMonitor, StoreClosed, StoreUnavailable, probe
from ..interface import StoreOpenError
from .process import CLOSE

log = logging.getLogger("agent_sidecar.store")


class CommitStats:
    """The writer's commits as the parent hears of them, for the metrics
    endpoint: each group's time (measured in the writer process, from its
    first job to its COMMIT) and size in jobs, and the jobs not answered yet."""

    def __init__(self, writer: GroupCommitWriter):
        self._writer = writer
        self.seconds = Histogram(COMMIT_SECONDS)
        self.jobs = Histogram(BATCH_JOBS)
        self.last_seconds = 0.0

    @property
    def backlog(self) -> int:
        """Jobs submitted whose commit has not been answered (queued or in the writer)."""
        return len(self._writer._pending)

    @property
    def stalled_seconds(self) -> float:
        """How long jobs have waited with no answer from the writer: since the
        first of them was submitted, or since its last answer if later; 0 when
        none waits. A writer (or its disk, or its database) that stopped
        answering shows here while health still says SERVING: a failing
        commit is an answer (health NOT_SERVING), a hung one is not."""
        w = self._writer
        return time.monotonic() - w._answered_at if w._pending else 0.0

    @property
    def pid(self) -> int:
        return self._writer.pid


class GroupCommitWriter:
    """``backend`` is what the writer process opens (``("module:function",
    args)``, see process.writer_main); ``preload`` the modules jobs live in."""

    def __init__(self, backend: tuple, preload: tuple[str, ...] = (), log_format: str = "json",
                 log_level: str = "info", library_log_level: str = "warning",
                 on_lost: Callable[[], None] | None = None):
        self.backend, self.preload = backend, preload
        self.log = (log_format, log_level, library_log_level)  # logs.setup's, in the writer process
        self.on_lost = on_lost
        self.pid = 0
        self.info: dict[str, Any] = {}
        self.commits = 0
        self.jobs = 0
        self._process: ChildProcess | None = None
        self._channel: Channel | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._answered_at = 0.0  # monotonic: the last answer, or the first job submitted after none waited
        self._outbox: list = []  # (job id, blob), or [job, job ids, args] for a run of a @batched job
        self._scheduled = False
        self._next_id = 0
        self._closed = False
        self._done: asyncio.Future | None = None
        self.faults = FaultMonitor(self._retry_probe)
        self.stats = CommitStats(self)

    @property
    def closed(self) -> bool:
        """Closed, or its process gone: every job is refused with StoreClosed."""
        return self._closed

    async def start(self, timeout: float = 60.0) -> None:
        self._done = asyncio.get_running_loop().create_future()
        self._process, self._channel, self.info = await spawn(
            "agent_sidecar.store.writer.process:writer_main",
            (self.backend, os.getpid(), self.log, self.preload),
            "agent-sidecar-store-writer", self._on_message, self._on_lost, timeout,
            loads=pickle.loads, dumps=_dumps)
        if "error" in self.info:  # it could not open the store, and has ended
            self._closed = True
            raise StoreOpenError(f"the store writer cannot open the store: {self.info['error']}")
        self.pid = self.info["pid"]
        log.info("store writer ready", extra={"pid": self.pid, "grpc_loaded": self.info["grpc_loaded"]})

    # -- submitting -------------------------------------------------------

    def write(self, fn: Callable[..., Any], *args: Any, retry: bool = False) -> asyncio.Future:
        """Queue ``fn(uow, *args)`` (``fn`` module-level, args picklable) for
        the pipe message that leaves at the end of this loop iteration (or at
        ``flush``); the future resolves with its result. ``retry``: taken even
        while the store is failing (faults.py)."""
        if self._closed:
            raise StoreClosed("the store is closed")
        if self._channel is None:
            # Not started, or its start has not finished (a start that failed
            # elsewhere, a worker's, is being undone): the job would go
            # nowhere and its caller wait for ever (stop()'s last write hung
            # the sidecar after "cannot start").
            raise StoreClosed("the store writer is not running")
        if not retry:
            self.faults.refuse()
        loop = asyncio.get_running_loop()
        out = self._outbox
        run: list[Any] | None = None
        blob = b""
        if getattr(fn, "many", None) is not None:  # joins a run of its kind: one pickle for all
            run = out[-1] if out and type(out[-1]) is list and out[-1][0] is fn else None
            if run is None:
                run = [fn, [], []]
                out.append(run)
        else:
            blob = _dumps((fn, args))
        fut = loop.create_future()
        if not self._pending:
            self._answered_at = time.monotonic()
        jid = self._next_id = self._next_id + 1
        self._pending[jid] = fut
        if run is not None:
            run[1].append(jid)
            run[2].append(args)
        else:
            out.append((jid, blob))
        if retry:
            self.faults.sent(jid)
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._send)
        return fut

    def flush(self) -> None:
        """Send what is queued now: for a caller that gathered one loop
        iteration's writes itself (the frame bus), one event-loop hop earlier."""
        self._send()

    def _retry_probe(self) -> asyncio.Future:
        """The fault monitor's probe of a retry round (faults.probe)."""
        fut = self.write(probe, retry=True)
        self._send()
        return fut

    def _send(self) -> None:
        self._scheduled = False
        jobs, self._outbox = self._outbox, []
        if jobs and self._channel is not None:
            self._channel.send([self._packed(j) if type(j) is list else j for j in jobs], now=True)

    def _packed(self, run: list) -> tuple:
        """A run of one @batched job as it travels: its job ids, then one blob
        of (job, [args of each call]). Arguments that will not pickle fail
        their callers here."""
        fn, jids, args = run
        try:
            return tuple(jids), _dumps((fn, args))
        except Exception as e:
            for jid in jids:
                self._answer(jid, False, e)
            return (), _dumps((fn, []))

    # -- answers ----------------------------------------------------------

    def _on_message(self, msg) -> None:
        if msg == CLOSE:
            if self._done is not None and not self._done.done():
                self._done.set_result(None)
            return
        seconds, results = msg
        self._answered_at = time.monotonic()
        self.commits += 1
        self.jobs += len(results)
        stats = self.stats
        stats.seconds.observe(seconds)
        stats.jobs.observe(len(results))
        stats.last_seconds = seconds
        for jid, ok, value in results:
            fault = value if not ok and isinstance(value, StoreUnavailable) else None
            self.faults.answered(jid, ok, fault)  # failing first: a caller's retry waits for a round
            self._answer(jid, ok, value)

    def _answer(self, jid: int, ok: bool, value: Any) -> None:
        fut = self._pending.pop(jid, None)
        if fut is None or fut.done():
            return
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)

    def _on_lost(self) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_result(None)
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(StoreClosed("the store writer process exited"))
        was_closing = self._closed or not self.pid  # not started: start() raises, saying why
        self._closed = True
        self._channel = None
        self.faults.closed()
        if not was_closing:
            ending: dict = {}
            if self._process is not None:  # its pipe closed as it died: reaped in a moment (blocking
                self._process.join(1.0)  # the loop, which only stops now), so its exit status is known
                ending = self._process.ending()
            log.critical("the store writer process died", extra={"pid": self.pid, **ending})
            if self.on_lost is not None:
                self.on_lost()

    # -- closing ----------------------------------------------------------

    async def close(self, timeout: float = 30.0) -> None:
        """Commit everything queued, checkpoint and truncate the WAL, stop."""
        if self._closed:
            return
        self._closed = True
        self.faults.closed()
        if self._process is None:  # never started (its start failed or was undone): nothing to close
            return
        log.info("store writer closing", extra={"commits": self.commits, "jobs": self.jobs})
        self._send()  # anything submitted in this loop iteration goes first
        if self._channel is not None:
            self._channel.send(CLOSE, now=True)
            assert self._done is not None  # set by start(), which opened the channel
            try:
                async with asyncio.timeout(timeout):
                    await asyncio.shield(self._done)
            except TimeoutError:
                log.warning("the store writer did not confirm its close")
            if self._channel is not None:
                self._channel.close()
        if self._process is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._process.join, 5)
            if self._process.is_alive():
                self._process.kill()


def _dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)

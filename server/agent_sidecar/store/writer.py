"""The parent's side of the writer process (see writer_process.py).

``submit(fn, *args)`` pickles the job at once — so a lambda or a closure fails
at the call site, not later on the other side — and returns a future. Jobs
submitted during one event-loop iteration travel as one pipe message; the
writer answers each group commit with one message, and the futures resolve
only then, i.e. once the write is durable.

If the writer process dies, every pending and later write fails with
``StoreClosed`` and ``on_lost`` is called: the sidecar cannot acknowledge
anything without its store, so it stops (and its supervisor restarts it).

Every answer that carries a store fault (a full disk, an I/O error; see
faults.py) reaches its caller as ``StoreUnavailable`` and puts the store in
its failing state (``faults``), in which new jobs are refused at once and only
retry jobs (``retry=True``) are sent.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import multiprocessing as mp
import os
import pickle
from typing import Any, Callable

from ..children import Channel, spawn
from .faults import FaultMonitor, StoreUnavailable, is_store_fault, unavailable
from .writer_process import CLOSE, writer_main

log = logging.getLogger("agent_sidecar.store")


class StoreClosed(StoreUnavailable):
    """The store was closed (or its writer died); no more writes are accepted.
    For a client the same as any store that cannot write: UNAVAILABLE,
    STORE_UNAVAILABLE, retry (the next sidecar will take it)."""


def _call(on_done: Callable[[bool, Any], None], ok: bool, value: Any) -> None:
    try:
        on_done(ok, value)
    except Exception:
        log.exception("a store write callback failed")


class GroupCommitWriter:
    def __init__(self, path: str, synchronous: str, log_format: str = "json",
                 log_level: str = "info", on_lost: Callable[[], None] | None = None):
        self.path, self.synchronous = path, synchronous
        self.log_format, self.log_level = log_format, log_level
        self.on_lost = on_lost
        self.pid = 0
        self.info: dict[str, Any] = {}
        self.commits = 0
        self.jobs = 0
        self._process: mp.process.BaseProcess | None = None
        self._channel: Channel | None = None
        self._pending: dict[int, asyncio.Future | Callable[[bool, Any], None]] = {}
        self._outbox: list[tuple[int, bytes]] = []
        self._scheduled = False
        self._next_id = 0
        self._closed = False
        self._done: asyncio.Future | None = None
        self.faults = FaultMonitor(functools.partial(self.send_now, retry=True))

    @property
    def closed(self) -> bool:
        """Closed, or its process gone: every job is refused with StoreClosed."""
        return self._closed

    async def start(self, timeout: float = 60.0) -> None:
        self._done = asyncio.get_running_loop().create_future()
        self._process, self._channel, self.info = await spawn(
            writer_main, (self.path, self.synchronous, os.getpid(), self.log_format, self.log_level),
            "agent-sidecar-store-writer", self._on_message, self._on_lost, timeout,
            loads=pickle.loads, dumps=_dumps)
        self.pid = self.info["pid"]
        log.info("store writer ready", extra={"pid": self.pid, "grpc_loaded": self.info["grpc_loaded"]})

    # -- submitting -------------------------------------------------------

    def submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future:
        """Queue ``fn(conn, *args)`` (``fn`` module-level, args picklable);
        await the returned future for its result."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._enqueue(fn, args, fut)
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._send)
        return fut

    def send_now(self, fn: Callable[..., Any], args: tuple,
                 on_done: Callable[[bool, Any], None], retry: bool = False) -> None:
        """For callers that already gathered one loop iteration's writes (the
        frame bus, batchers): the job leaves at once instead of on the next
        iteration, and ``on_done(ok, result or exception)`` runs as soon as
        the answer arrives — two event-loop hops fewer than ``submit``.
        ``retry``: sent even while the store is failing (faults.py)."""
        self._enqueue(fn, args, on_done, retry)
        self._send()

    def _enqueue(self, fn: Callable[..., Any], args: tuple,
                 waiter: asyncio.Future | Callable[[bool, Any], None], retry: bool = False) -> None:
        """Pickle the job now (an unpicklable one fails at the call site) and
        queue it for the next pipe message; ``waiter`` gets its answer. While
        the store is failing only a retry job is taken; others raise
        StoreUnavailable here, before anything is queued."""
        if self._closed:
            raise StoreClosed("the store is closed")
        if not retry:
            self.faults.refuse()
        blob = _dumps((fn, args))
        jid = self._next_id = self._next_id + 1
        self._pending[jid] = waiter
        self._outbox.append((jid, blob))
        if retry:
            self.faults.sent(jid)

    def _send(self) -> None:
        self._scheduled = False
        jobs, self._outbox = self._outbox, []
        if jobs and self._channel is not None:
            self._channel.send(jobs, now=True)

    # -- answers ----------------------------------------------------------

    def _on_message(self, msg) -> None:
        if msg == CLOSE:
            if self._done is not None and not self._done.done():
                self._done.set_result(None)
            return
        self.commits += 1
        self.jobs += len(msg)
        for jid, ok, value in msg:
            fault = None
            if not ok and is_store_fault(value):  # the one place store faults are mapped
                value = fault = unavailable(value)
            self.faults.answered(jid, ok, fault)  # failing first: a caller's retry waits for a round
            self._answer(jid, ok, value)

    def _answer(self, jid: int, ok: bool, value: Any) -> None:
        fut = self._pending.pop(jid, None)
        if fut is None:
            return
        if not isinstance(fut, asyncio.Future):
            _call(fut, ok, value)
        elif fut.done():
            return
        elif ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)

    def _on_lost(self) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_result(None)
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not isinstance(fut, asyncio.Future):
                _call(fut, False, StoreClosed("the store writer process exited"))
            elif not fut.done():
                fut.set_exception(StoreClosed("the store writer process exited"))
        was_closing = self._closed
        self._closed = True
        self._channel = None
        self.faults.closed()
        if not was_closing:
            code = self._process.exitcode if self._process is not None else None
            log.critical("the store writer process died", extra={"pid": self.pid, "exitcode": code})
            if self.on_lost is not None:
                self.on_lost()

    # -- closing ----------------------------------------------------------

    async def close(self, timeout: float = 30.0) -> None:
        """Commit everything queued, checkpoint and truncate the WAL, stop."""
        if self._closed:
            return
        log.info("store writer closing", extra={"commits": self.commits, "jobs": self.jobs})
        self._send()  # anything submitted in this loop iteration goes first
        self._closed = True
        self.faults.closed()
        if self._channel is not None:
            self._channel.send(CLOSE, now=True)
            try:
                await asyncio.wait_for(asyncio.shield(self._done), timeout)
            except asyncio.TimeoutError:
                log.warning("the store writer did not confirm its close")
            if self._channel is not None:
                self._channel.close()
        if self._process is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._process.join, 5)
            if self._process.is_alive():
                self._process.kill()


def _dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)

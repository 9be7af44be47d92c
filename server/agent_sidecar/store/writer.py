"""The parent's side of the writer process (see writer_process.py).

``submit(fn, *args)`` pickles the job at once — so a lambda or a closure fails
at the call site, not later on the other side — and returns a future. Jobs
submitted during one event-loop iteration travel as one pipe message; the
writer answers each group commit with one message, and the futures resolve
only then, i.e. once the write is durable.

If the writer process dies, every pending and later write fails with
``StoreClosed`` and ``on_lost`` is called: the sidecar cannot acknowledge
anything without its store, so it stops (and its supervisor restarts it).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import os
import pickle
import socket
import struct
from typing import Any, Callable

from .writer_process import CLOSE, writer_main

log = logging.getLogger("agent_sidecar.store")

_HEADER = struct.Struct("!i")  # multiprocessing.Connection's framing
_MAX_MESSAGE = 0x7FFFFFFF  # what that 4-byte length can say


class StoreClosed(RuntimeError):
    """The store was closed (or its writer died); no more writes are accepted."""


class _Replies(asyncio.Protocol):
    """Reads the writer's length-prefixed messages off the socket."""

    def __init__(self, owner: "GroupCommitWriter"):
        self.owner = owner
        self.buf = bytearray()

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos = 0
        while len(buf) - pos >= 4:
            (n,) = _HEADER.unpack_from(buf, pos)
            start = pos + 4
            if n == -1:  # > 2 GiB: an 8-byte length follows
                if len(buf) - start < 8:
                    break
                (n,) = struct.unpack_from("!Q", buf, start)
                start += 8
            if len(buf) - start < n:
                break
            self.owner._on_message(bytes(buf[start:start + n]))
            pos = start + n
        if pos:
            del buf[:pos]

    def connection_lost(self, exc) -> None:
        self.owner._on_lost()


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
        self._transport: asyncio.Transport | None = None
        self._pending: dict[int, asyncio.Future | Callable[[bool, Any], None]] = {}
        self._outbox: list[tuple[int, bytes]] = []
        self._scheduled = False
        self._next_id = 0
        self._closed = False
        self._hello: asyncio.Future | None = None
        self._done: asyncio.Future | None = None

    async def start(self, timeout: float = 60.0) -> None:
        ctx = mp.get_context("spawn")
        parent_end, child_end = ctx.Pipe(duplex=True)
        self._process = ctx.Process(
            target=writer_main, name="agent-sidecar-store-writer", daemon=True,
            args=(child_end, self.path, self.synchronous, os.getpid(), self.log_format, self.log_level))
        self._process.start()
        child_end.close()
        loop = asyncio.get_running_loop()
        sock = socket.socket(fileno=os.dup(parent_end.fileno()))
        parent_end.close()
        sock.setblocking(False)
        self._hello = loop.create_future()
        self._done = loop.create_future()
        self._transport, _ = await loop.create_unix_connection(lambda: _Replies(self), sock=sock)
        self.info = await asyncio.wait_for(self._hello, timeout)
        self.pid = self.info["pid"]
        log.info("store writer ready", extra={"pid": self.pid, "grpc_loaded": self.info["grpc_loaded"]})

    # -- submitting -------------------------------------------------------

    def submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future:
        """Queue ``fn(conn, *args)`` (``fn`` module-level, args picklable);
        await the returned future for its result."""
        if self._closed:
            raise StoreClosed("store is closed")
        blob = pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        jid = self._next_id = self._next_id + 1
        self._pending[jid] = fut
        self._outbox.append((jid, blob))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._send)
        return fut

    def send_now(self, fn: Callable[..., Any], args: tuple,
                 on_done: Callable[[bool, Any], None]) -> None:
        """For callers that already gathered one loop iteration's writes (the
        frame bus, batchers): the job leaves at once instead of on the next
        iteration, and ``on_done(ok, result or exception)`` runs as soon as
        the answer arrives — two event-loop hops fewer than ``submit``."""
        if self._closed:
            raise StoreClosed("store is closed")
        blob = pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
        jid = self._next_id = self._next_id + 1
        self._pending[jid] = on_done
        self._outbox.append((jid, blob))
        self._send()

    def _send(self) -> None:
        self._scheduled = False
        jobs, self._outbox = self._outbox, []
        if not jobs or self._transport is None:
            return
        body = pickle.dumps(jobs, protocol=pickle.HIGHEST_PROTOCOL)
        if len(body) <= _MAX_MESSAGE:
            self._write(body)
            return
        for job in jobs:  # a huge batch goes job by job; a job that alone is too big fails
            body = pickle.dumps([job], protocol=pickle.HIGHEST_PROTOCOL)
            if len(body) <= _MAX_MESSAGE:
                self._write(body)
            else:
                self._answer(job[0], False, ValueError("a store write larger than 2 GiB"))

    def _write(self, body: bytes) -> None:
        self._transport.write(_HEADER.pack(len(body)) + body)

    # -- answers ----------------------------------------------------------

    def _on_message(self, raw: bytes) -> None:
        if raw == CLOSE:
            if self._done is not None and not self._done.done():
                self._done.set_result(None)
            return
        msg = pickle.loads(raw)
        if isinstance(msg, dict):  # hello
            if self._hello is not None and not self._hello.done():
                self._hello.set_result(msg)
            return
        self.commits += 1
        self.jobs += len(msg)
        for jid, ok, value in msg:
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
        if self._hello is not None and not self._hello.done():
            self._hello.set_exception(StoreClosed("the store writer process exited"))
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
        self._transport = None
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
        if self._transport is not None:
            self._write(CLOSE)
            try:
                await asyncio.wait_for(asyncio.shield(self._done), timeout)
            except asyncio.TimeoutError:
                log.warning("the store writer did not confirm its close")
            self._transport.close()
        if self._process is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._process.join, 5)
            if self._process.is_alive():
                self._process.kill()

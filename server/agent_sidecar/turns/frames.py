"""Activity frames: persisted first, then fanned out.

``FrameBus.publish`` numbers a frame (seq per request, gapless), queues it with
any writes that must commit with it, and flushes everything queued in one loop
iteration as ONE writer job: many turns' frames share one transaction and one
fsync. Only after the commit are frames handed to subscribers (the Prompt
stream, WatchActivity by request, by session key, by platform), so a client
never sees a frame that a crash could take back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any, Callable

import orjson

from ..sessions import transcripts as tx
from ..v1 import prompt_service_pb2 as ppb

log = logging.getLogger("agent_sidecar.frames")

TERMINAL = frozenset(("completed", "failed", "superseded"))
_FN, _MSG = "fn", "msg"  # kinds of queued writes
_INSERT = ("INSERT INTO frames (request_id, seq, session_key, session_id, platform, at, kind, body)"
           " VALUES (?, ?, ?, ?, ?, ?, ?, ?)")


def build_frame(rid: str, key: str, sid: str, seq: int, at: float, cursor: int, kind: str,
                body: dict[str, Any]) -> ppb.ActivityFrame:
    f = ppb.ActivityFrame(request_id=rid, session_key=key, session_id=sid, seq=seq, cursor=cursor)
    f.at.FromNanoseconds(int(at * 1e9))
    sub = getattr(f, kind)
    sub.SetInParent()
    for k, v in body.items():
        setattr(sub, k, v)
    return f


def frame_from_row(row) -> ppb.ActivityFrame:
    """A row of ``SELECT id, request_id, seq, session_key, session_id, at, kind, body``."""
    cursor, rid, seq, key, sid, at, kind, body = row
    return build_frame(rid, key, sid, seq, at, cursor, kind, orjson.loads(body) if body else {})


FRAME_COLUMNS = "id, request_id, seq, session_key, session_id, at, kind, body"


class Subscriber:
    """A frame queue for one stream; ``get`` returns None on keepalive timeout."""

    __slots__ = ("buf", "waiter")

    def __init__(self):
        self.buf: deque = deque()
        self.waiter: asyncio.Future | None = None

    def push(self, frame) -> None:
        self.buf.append(frame)
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def get(self, timeout: float):
        if not self.buf:
            loop = asyncio.get_running_loop()
            self.waiter = loop.create_future()
            handle = loop.call_later(timeout, _wake, self.waiter)
            try:
                await self.waiter
            finally:
                handle.cancel()
                self.waiter = None
            if not self.buf:
                return None
        return self.buf.popleft()


def _wake(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class FrameBus:
    def __init__(self, store):
        self.store = store
        self._frames: list[tuple] = []  # (row, turn, kind, body)
        self._writes: list[tuple] = []  # (kind, fn or message item, then)
        self._scheduled = False
        self.by_key: dict[str, set[Subscriber]] = {}
        self.by_platform: dict[str, set[Subscriber]] = {}

    # -- producing ----------------------------------------------------------------

    def publish(self, turn, kind: str, body: dict[str, Any] | None = None,
                write: Callable | None = None, then: Callable | None = None) -> None:
        """Queue a frame for ``turn`` (with an optional write committed in the
        same transaction, before it, and a ``then(result)`` run after commit)."""
        body = body or {}
        seq = turn.next_seq
        turn.next_seq += 1
        at = time.time()
        if write is not None or then is not None:
            self._writes.append((_FN, write, then))
        self._frames.append(((turn.rid, seq, turn.key, turn.sid, turn.platform, at, kind,
                              orjson.dumps(body) if body else None), turn, kind, body))
        if kind in TERMINAL:
            turn.terminal_pending = True
        self._schedule()

    def write(self, fn: Callable, then: Callable | None = None) -> None:
        """Queue a write (no frame) into the next flush, keeping order with frames."""
        self._writes.append((_FN, fn, then))
        self._schedule()

    def append_message(self, session_id: str, msg: dict[str, Any], request_id: str,
                       then: Callable | None = None) -> None:
        """Queue a transcript message of a turn; consecutive ones in a flush
        become one ``append_many`` (one executemany for all turns)."""
        self._writes.append((_MSG, (session_id, [tx.from_model(msg)], request_id), then))
        self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        frames, writes = self._frames, self._writes
        self._frames, self._writes = [], []
        if not frames and not writes:
            return
        fut = self.store.submit(lambda conn: _run_flush(conn, frames, writes))
        fut.add_done_callback(lambda f: self._committed(f, frames, writes))

    def _committed(self, fut: asyncio.Future, frames, writes) -> None:
        if fut.cancelled() or fut.exception() is not None:
            log.error("frame flush failed", exc_info=fut.exception())
            return
        results, first_id = fut.result()
        cursor = first_id
        for row, turn, kind, body in frames:
            frame = build_frame(row[0], row[2], row[3], row[1], row[5], cursor, kind, body)
            cursor += 1
            self._deliver(turn, frame, kind)
        for (_, _, then), result in zip(writes, results):
            if then is not None:
                try:
                    then(result)
                except Exception:
                    log.exception("post-commit callback failed")

    def _deliver(self, turn, frame, kind: str) -> None:
        for sub in tuple(turn.subscribers):
            sub.push(frame)
        subs = self.by_key.get(turn.key)
        if subs:
            for sub in tuple(subs):
                sub.push(frame)
        subs = self.by_platform.get(turn.platform)
        if subs:
            for sub in tuple(subs):
                sub.push(frame)
        if kind in TERMINAL:
            turn.on_terminal(frame)

    def deliver_committed(self, turn, frame, kind: str) -> None:
        """For frames written by a job of their own (``accepted``)."""
        self._deliver(turn, frame, kind)

    # -- watching by key or platform --------------------------------------------

    def watch(self, index: dict[str, set[Subscriber]], name: str) -> Subscriber:
        sub = Subscriber()
        index.setdefault(name, set()).add(sub)
        return sub

    def unwatch(self, index: dict[str, set[Subscriber]], name: str, sub: Subscriber) -> None:
        subs = index.get(name)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del index[name]


def _run_flush(conn, frames, writes) -> tuple[list, int]:
    """The writer job: every write in publish order, then every frame row, in
    one transaction — a ``completed`` frame commits with its ledger update and
    transcript rows or not at all. Returns each write's result and the first
    frame id (rows inserted by one executemany get consecutive ids).

    The fast path runs the writes bare; if one raises, everything is rolled
    back to a savepoint and replayed with a savepoint per write, so one bad
    write fails alone and the batch's frames still land."""
    try:
        with conn:
            results = _run_writes(conn, writes, isolate=False)
    except Exception:
        log.exception("a write queued with frames failed; replaying the batch write by write")
        results = _run_writes(conn, writes, isolate=True)
    rows = [item[0] for item in frames]
    first_id = 0
    if rows:
        conn.executemany(_INSERT, rows)
        first_id = conn.last_insert_rowid() - len(rows) + 1
    return results, first_id


def _run_writes(conn, writes, isolate: bool) -> list:
    results: list = []
    i, n = 0, len(writes)
    while i < n:
        kind, payload, _ = writes[i]
        if kind is _MSG:
            j = i
            while j < n and writes[j][0] is _MSG:
                j += 1
            items = [w[1] for w in writes[i:j]]
            results.extend(_guarded(conn, isolate, tx.append_many, items, len(items)))
            i = j
            continue
        i += 1
        if payload is None:
            results.append(None)
        else:
            results.extend(_guarded(conn, isolate, payload, None, 1))
    return results


def _guarded(conn, isolate: bool, fn, arg, count: int) -> list:
    call = (lambda: fn(conn, arg)) if arg is not None else (lambda: fn(conn))
    if not isolate:
        out = call()
        return out if arg is not None else [out]
    try:
        with conn:
            out = call()
        return out if arg is not None else [out]
    except Exception as e:
        log.exception("a write queued with frames failed")
        return [e] * count

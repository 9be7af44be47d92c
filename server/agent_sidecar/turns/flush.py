"""The frame bus's flush as a store job (frames.py publishes, this commits).

One flush carries every write queued with frames during one loop iteration,
in publish order, then every frame row, in one transaction: a ``completed``
frame commits with its ledger update and transcript rows or not at all.

Flushes are numbered. The bus keeps several in flight; if one does not commit
(a full disk), those sent behind it must not commit before it is sent again,
or seqs would skip and transcript rows swap. So a flush runs only right after
its predecessor (checked here, in the writer process, which sees every flush
in order), else raises FlushOutOfOrder, and the bus sends it again behind it.

One flush carries many sessions' items. A row the store refuses for good (a
constraint, a trigger) must fail only its own session's, so a flush that
fails so runs again lane by lane (``LanesRefused``).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

from ..errors import SidecarError
from ..store import UnitOfWork
from ..store.records import Append
from ..store.writer.answers import sendable
from ..store.writer.group import at_end, transient
from .jobs import Started
from .leasing import check_fence

log = logging.getLogger("agent_sidecar.frames")

FN, MSG = "fn", "msg"  # kinds of writes queued with frames: a job, a transcript message


class FlushOutOfOrder(Exception):
    """A frame flush whose predecessor did not commit: it must not commit
    either (the bus sends it again, behind its predecessor)."""


class _FlushOrder:
    """In the writer process: the number of the last flush that ran (in the
    open transaction or committed) and of the last one that committed."""
    ran = 0
    committed = 0


def _flush_committed(no: int) -> None:
    _FlushOrder.committed = no


def _flush_undone() -> None:
    _FlushOrder.ran = _FlushOrder.committed


@dataclass(frozen=True)
class LanesRefused:
    """A flush run lane by lane (run_flush): it committed but for the items
    of ``lanes`` (maybe none), which the store refused for good (``error``,
    the first such lane's). ``cursors`` holds each committed frame's cursor,
    in publish order: a lane's frames are numbered together, so cursors need
    not grow across lanes. Until the bus has heard of it, the flushes sent
    behind it are refused (FlushOutOfOrder): they may hold more of a refused
    lane's items, which must not land after its gap."""
    lanes: frozenset[str]
    cursors: list[int]
    error: BaseException


def run_flush(uow: UnitOfWork, order: tuple[int, int], rows: list[tuple],
              writes: list[tuple], fence: dict[str, int] | None = None,
              lanes: list[str] | None = None) -> tuple[list, int | LanesRefused]:
    """One flush: ``order`` is (this flush's number, the one before it);
    ``writes`` holds ``(FN, (job, args) or None)`` and ``(MSG, Append)``;
    ``rows`` the frames (records.NewFrame); ``lanes`` each write's lane.
    Returns each write's result (an exception for one that failed) and the
    first frame's cursor.

    The fast path runs the writes bare, then inserts the frames, in one
    savepoint. If that raises, it is undone and run again with a savepoint
    per write, so one bad write fails alone and the batch's frames still
    land. If that raises too (a frame the store refuses for good: a
    constraint, a trigger), it runs lane by lane, each lane in a savepoint
    of its own: only the lanes whose items fail are refused
    (``LanesRefused``); if every lane's fails, the flush raises and nothing
    of it committed. Not so a store fault (a full disk) or a conflict with
    another writer: it fails the whole flush, which the bus keeps and
    retries — a frame must never commit without the writes queued before
    it. In a cluster ``fence`` holds each lane's lease epoch: a lane that
    moved refuses the whole flush (LeaseLost), which the bus sends again
    without that lane."""
    no, prev = order
    if prev != _FlushOrder.ran:
        raise FlushOutOfOrder(f"flush {no} follows {prev}, but {_FlushOrder.ran} ran last")
    check_fence(uow, fence)
    first: int | LanesRefused
    try:
        with uow.savepoint():
            results, first = _run_lane(uow, rows, writes, isolate=False)
    except Exception as e:
        if uow.is_fault(e) or transient(e):
            raise
        if not isinstance(e, SidecarError):  # a refusal (a session operation's) is its write's answer
            log.exception("a frame flush failed; running it again write by write")
        try:
            with uow.savepoint():
                results, first = _run_lane(uow, rows, writes, isolate=True)
        except Exception as e:
            if uow.is_fault(e) or transient(e) or lanes is None or len(_lanes_of(rows, lanes)) < 2:
                raise
            results, first = _by_lane(uow, rows, writes, lanes, e)
    if isinstance(first, LanesRefused) and first.lanes:  # those sent behind it wait for the bus (FlushOutOfOrder)
        at_end(functools.partial(_flush_committed, prev), _flush_undone)
        return results, first
    _FlushOrder.ran = no
    at_end(functools.partial(_flush_committed, no), _flush_undone)
    return results, first


def _run_lane(uow: UnitOfWork, rows: list[tuple], writes: list[tuple], isolate: bool) -> tuple[list, int]:
    """Writes, then frames: each write's result and the first frame's cursor."""
    results = _run_writes(uow, writes, isolate)
    moved = started_in(writes, results)
    if moved:  # a ``started`` frame names the incarnation its start job chose
        rows = [(*r[:3], moved[r[0]], *r[4:]) if r[6] == "started" and r[0] in moved else r for r in rows]
    return results, (uow.frames.insert(rows) if rows else 0)


def _lanes_of(rows: list[tuple], lanes: list[str]) -> list[str]:
    """A flush's lanes, in order of first appearance (frames, then writes)."""
    return list(dict.fromkeys([r[2] for r in rows] + lanes))


def _by_lane(uow: UnitOfWork, rows: list[tuple], writes: list[tuple], lanes: list[str],
             error: BaseException) -> tuple[list, LanesRefused]:
    """The flush again lane by lane (a lane's items keep their order), each
    lane in a savepoint of its own: a lane whose items fail is refused alone,
    its writes' results are its error. Raises ``error`` if every lane fails."""
    log.error("the store refused a frame flush; running it again session by session", exc_info=error)
    results: list = [None] * len(writes)
    cursors: dict[int, int] = {}
    refused: dict[str, BaseException] = {}
    keys = _lanes_of(rows, lanes)
    for key in keys:
        mine = [i for i, lane in enumerate(lanes) if lane == key]
        frames = [i for i, r in enumerate(rows) if r[2] == key]
        try:
            with uow.savepoint():
                got, first = _run_lane(uow, [rows[i] for i in frames], [writes[i] for i in mine], isolate=True)
        except Exception as e:
            if uow.is_fault(e) or transient(e):
                raise
            log.error("the store refused a session's items of a frame flush", extra={"key": key}, exc_info=e)
            refused[key] = e
            got, first = [e] * len(mine), 0
        for i, result in zip(mine, got):
            results[i] = result
        if first:
            cursors.update((i, first + n) for n, i in enumerate(frames))
    if len(refused) == len(keys):
        raise error
    return results, LanesRefused(frozenset(refused), [cursors[i] for i in sorted(cursors)],
                                 sendable(next(iter(refused.values()), error)))


def started_in(writes: list[tuple], results: list) -> dict[str, str]:
    """request id -> the incarnation each start job (jobs.start) of a flush
    began its turn in. The turn's ``started`` frame, queued with the job,
    names the incarnation the lane had then; a switch may have moved the lane
    while the turn waited, and the job follows it, so the frame is given the
    job's (in the store here, as the bus delivers it)."""
    return {payload[1][0].request_id: res.session_id
            for (kind, payload), res in zip(writes, results) if kind == FN and isinstance(res, Started)}


def _run_writes(uow: UnitOfWork, writes: list[tuple], isolate: bool) -> list:
    """Consecutive transcript messages become one append (one executemany for
    every turn's messages in the flush)."""
    results: list = []
    i, n = 0, len(writes)
    while i < n:
        kind, payload = writes[i]
        if kind == MSG:
            j = i
            while j < n and writes[j][0] == MSG:
                j += 1
            items = [w[1] for w in writes[i:j]]
            results.extend(_guarded(uow, isolate, _append, (items,), len(items), True))
            i = j
            continue
        i += 1
        if payload is None:
            results.append(None)
        else:
            results.extend(_guarded(uow, isolate, payload[0], payload[1], 1, False))
    return results


def _append(uow: UnitOfWork, items: list[Append]) -> list:
    return uow.messages.append(items)


def _guarded(uow: UnitOfWork, isolate: bool, fn, args: tuple, count: int, many: bool) -> list[Any]:
    if not isolate:
        out = fn(uow, *args)
        return out if many else [out]
    try:
        with uow.savepoint():
            out = fn(uow, *args)
        return out if many else [out]
    except Exception as e:
        if uow.is_fault(e):
            raise
        if not isinstance(e, SidecarError):  # a refusal goes to its caller; anything else is a defect
            log.exception("a write queued with frames failed")
        return [e] * count

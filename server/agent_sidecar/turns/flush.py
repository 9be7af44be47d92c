"""The frame bus's flush as a store job (frames.py publishes, this commits).

One flush carries every write queued with frames during one loop iteration,
in publish order, then every frame row, in one transaction: a ``completed``
frame commits with its ledger update and transcript rows or not at all.

Flushes are numbered. The bus keeps several in flight; if one does not commit
(a full disk), those sent behind it must not commit before it is sent again,
or seqs would skip and transcript rows swap. So a flush runs only right after
its predecessor (checked here, in the writer process, which sees every flush
in order), else raises FlushOutOfOrder, and the bus sends it again behind it.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from ..errors import SidecarError
from ..store import UnitOfWork
from ..store.records import Append
from ..store.writer.group import at_end
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


def run_flush(uow: UnitOfWork, order: tuple[int, int], rows: list[tuple],
              writes: list[tuple], fence: dict[str, int] | None = None) -> tuple[list, int]:
    """One flush: ``order`` is (this flush's number, the one before it);
    ``writes`` holds ``(FN, (job, args) or None)`` and ``(MSG, Append)``;
    ``rows`` the frames (records.NewFrame). Returns each write's result (an
    exception for one that failed) and the first frame's cursor.

    The fast path runs the writes bare; if one raises, everything is undone to
    a savepoint and replayed with a savepoint per write, so one bad write fails
    alone and the batch's frames still land. Not so a store fault (a full
    disk): it fails the whole flush, which the bus keeps and retries — a frame
    must never commit without the writes queued before it. In a cluster
    ``fence`` holds each lane's lease epoch: a lane that moved refuses the
    whole flush (LeaseLost), which the bus sends again without that lane."""
    no, prev = order
    if prev != _FlushOrder.ran:
        raise FlushOutOfOrder(f"flush {no} follows {prev}, but {_FlushOrder.ran} ran last")
    check_fence(uow, fence)
    try:
        with uow.savepoint():
            results = _run_writes(uow, writes, isolate=False)
    except Exception as e:
        if uow.is_fault(e):
            raise
        if not isinstance(e, SidecarError):  # a refusal (a session operation's) is its write's answer
            log.exception("a write queued with frames failed; replaying the batch write by write")
        results = _run_writes(uow, writes, isolate=True)
    moved = started_in(writes, results)
    if moved:  # a ``started`` frame names the incarnation its start job chose
        rows = [(*r[:3], moved[r[0]], *r[4:]) if r[6] == "started" and r[0] in moved else r for r in rows]
    first = uow.frames.insert(rows) if rows else 0
    _FlushOrder.ran = no
    at_end(functools.partial(_flush_committed, no), _flush_undone)
    return results, first


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

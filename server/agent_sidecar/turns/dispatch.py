"""A turn's start: its start job and ``started`` frame through the frame bus,
then its ``run`` message to the worker its session key maps to.

A turn accepted on an idle lane is started by its accept job (jobs.accept),
whose commit hands it here (``dispatch``); one that waited in its lane starts
with ``start`` when the lane reaches it. What the worker then says is
worker_events.py's. Functions over a TurnManager (like placement.py).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from .. import errors as E
from ..obs import tracing
from . import jobs, supervision, wire
from .lanes import Turn
from .pool import WorkerHandle

if TYPE_CHECKING:
    from .manager import TurnManager


def start(m: TurnManager, turn: Turn) -> None:
    """A turn that waited in its lane starts (one accepted on an idle lane
    was started by its accept job): its start job commits with its
    ``started`` frame, then the worker gets it; one whose Prompt call's
    deadline passed while it waited ends AGENT_TIMEOUT without running."""
    turn.timeout_s = turn.time_left()
    if turn.timeout_s <= 0:
        m.end(turn, "failed", E.AGENT_TIMEOUT, "the Prompt call's deadline passed while it waited")
        return
    turn.begin()
    req = jobs.StartRequest(turn.rid, turn.key, tuple(turn.user_texts()), turn.queued,
                            "resume" in turn.payload)  # an auto-resume note is synthetic
    m.bus.publish(turn, "started", write=(jobs.start, (req,)),
                  then=lambda res: dispatch(m, turn, res))


def dispatch(m: TurnManager, turn: Turn, res: jobs.Started | BaseException) -> None:
    """The turn's start committed (``res``: where, at which revision) or
    failed (it ends with the error's reason): its worker gets its ``run``
    message, or it ends now if it was cancelled meanwhile."""
    if turn.closing:
        return
    if isinstance(res, BaseException):
        reason = res.reason if isinstance(res, E.SidecarError) else E.UNAVAILABLE
        m.end(turn, "failed", reason, f"could not start the turn: {res}")
        return
    turn.sid = res.session_id  # a switch may have moved the lane while it waited
    if turn.cancel_reason:  # its end (and a rollback's hiding) goes where its start wrote
        m.end(turn, "failed", turn.cancel_reason, "the turn was cancelled")
        return
    profile, system_prompt = m.prompts.for_turn(turn, res.lane)
    assert m.pool is not None  # start_workers ran before any turn
    h = m.pool.slot_for(turn.key)
    if not h.ready.is_set() and h.failure is not None:
        _no_worker(m, turn, h)
        return
    h.turns_run += 1
    turn.run_on(h)
    turn.worker_gen = h.generation if h.ready.is_set() else -1
    msg = wire.run(turn.rid, turn.key, turn.sid, res.rev, res.base_seq, turn.user_texts(),
                   profile.wire, system_prompt, m.tools.specs_for(profile.tools, turn.platform),
                   turn.timeout_s)
    if tracing.ACTIVE is not None:  # its model calls' HTTP requests carry it on
        msg["traceparent"] = tracing.ACTIVE.traceparent(turn)
    if m.leases is not None:  # it stops by itself should this node stall past its lease
        msg["stop_at"] = m.leases.stop_at(turn.key)
    if h.ready.is_set():
        h.send(msg)
    else:
        m.spawn(_send_when_ready(m, h, turn, msg))
    turn.deadline = asyncio.get_running_loop().time() + turn.timeout_s + supervision.WATCHDOG_GRACE_S


async def _send_when_ready(m: TurnManager, h: WorkerHandle, turn: Turn, msg: wire.Run) -> None:
    """A worker being (re)started gets the run once it is ready, unless the
    turn ended or was cancelled while it waited, or the worker's start failed
    (the turn then ends UNAVAILABLE: a replacement that keeps failing may
    never come)."""
    if not h.ready.is_set():
        await _first(h.ready.wait(), h.failing.wait())
    if turn.closing:
        return
    if turn.cancel_reason:  # cancelled while it waited for the worker
        m.end(turn, "failed", turn.cancel_reason, "the turn was cancelled")
        return
    if not h.ready.is_set():
        _no_worker(m, turn, h)
        return
    turn.worker_gen = h.generation
    if m.leases is not None:  # as long as the lease is trusted now, not when it began to wait
        msg["stop_at"] = m.leases.stop_at(turn.key)
    h.send(msg)


def _no_worker(m: TurnManager, turn: Turn, h: WorkerHandle) -> None:
    """The turn's worker slot has no worker and its replacement failed to
    start: the turn ends now, UNAVAILABLE, where it waited out its timeout
    (the profile's, half an hour by default) for a worker that may never come."""
    m.end(turn, "failed", E.UNAVAILABLE,
          f"could not start the turn: worker {h.index} cannot be started ({h.failure}); see the sidecar's log")


async def _first(*waits) -> None:
    """Until the first of ``waits`` is done; the others are cancelled."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()

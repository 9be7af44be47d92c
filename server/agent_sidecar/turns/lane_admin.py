"""What a session operation does to the session's lane around its store job:
ResetSession, SuspendSession, DeleteSession, ClearAllSessions
(api/session_service.py), and another cluster node's deletes mirrored here
(cluster/tail.py). RewindSession and RewriteTranscript are undo.py's; they
begin with ``claim`` too.

The lane's waiting prompts end ``superseded`` and its running turn is
cancelled, so no turn of the session goes on writing into what the job
resets or deletes; a delete also waits (bounded) until those turns' ends have
committed, so the job removes their last writes instead of racing them. In a
cluster the job is fenced at the lease ``claim`` took (``under_lease``); a
delete's job revokes the lease itself.

Functions over a TurnManager (like placement.py and supervision.py).
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING

from .. import errors as E
from . import jobs, wire
from .lanes import Turn
from .leasing import LeaseLost
from .supervision import until_ended

if TYPE_CHECKING:
    from .manager import TurnManager


async def claim(m: TurnManager, key: str) -> int:
    """Before an operation changes the lane: refused (STORE_UNAVAILABLE)
    while the store cannot write, before any turn is ended; in a cluster this
    node takes the lane's lease (LaneElsewhere when another node runs it: the
    call is forwarded there, and the lane's holder does it). Returns the
    epoch it is held at (0 on one sidecar), for ``under_lease``."""
    m.store.check_writable()
    return await m.own(key)


def under_lease(m: TurnManager, key: str, epoch: int, job, *args) -> asyncio.Future:
    """The operation's store job, queued behind every write already published
    (the frame bus's, the accepts': the store runs jobs in the order written)
    and fenced at the epoch ``claim`` gave: should the lane have moved to
    another node meanwhile, the job is refused (LANE_MOVED: a retry goes to
    the new holder) instead of committing under that node's running turn,
    and the lane stops here, as for a turn's fenced write. While what the
    lane's turns sent has not all committed, the job rides the frame bus
    behind it (a flush refused meanwhile is sent again behind the jobs
    written after it: a rewind would then miss the rows it should hide)."""
    if m.bus.unsettled(key):
        return _on_the_bus(m, key, epoch, job, *args)
    fut = m.store.write(jobs.fenced, {key: epoch} if epoch else None, job, *args)
    if epoch and m.leases is not None:
        fut.add_done_callback(functools.partial(_fenced, m.leases))
    return fut


class _Operation:
    """A session operation's job as the frame bus carries it: its lane and
    epoch fence the flush it goes in; dropped (the lane lost or moved on),
    it fails LANE_MOVED, as ``under_lease`` does."""

    dropped = False

    def __init__(self, key: str, epoch: int, fut: asyncio.Future):
        self.key, self.epoch, self.fut = key, epoch, fut

    def answered(self, result) -> None:
        if self.fut.done():
            return
        if isinstance(result, BaseException):
            self.fut.set_exception(result)
        else:
            self.fut.set_result(result)

    def on_dropped(self) -> None:
        self.answered(LeaseLost({self.key: self.epoch}))


def _on_the_bus(m: TurnManager, key: str, epoch: int, job, *args) -> asyncio.Future:
    op = _Operation(key, epoch, asyncio.get_running_loop().create_future())
    m.bus.write(op, job, *args, then=op.answered)
    m.bus.flush_now()
    return op.fut


def _fenced(leases, fut: asyncio.Future) -> None:
    error = None if fut.cancelled() else fut.exception()
    if isinstance(error, LeaseLost):
        leases.refused(error.epochs, 1, error.revoked)


async def reset(m: TurnManager, key: str) -> int:
    epoch = await claim(m, key)
    drop(m, key)
    return epoch


async def delete(m: TurnManager, key: str) -> None:
    """Before the delete job: the lane's turns end and their ends commit."""
    await claim(m, key)
    evict(m, key)
    await until_ended(m, [t for t in m.live.values() if t.key == key])


async def clear_all(m: TurnManager) -> None:
    """Before ClearAllSessions' job (and mirroring another node's): every
    lane dropped, every cached agent gone, every turn's end committed."""
    m.store.check_writable()
    for key in list(m.lanes):
        drop(m, key)
    if m.pool is not None:
        m.pool.broadcast(wire.CLEAR)
    await until_ended(m, list(m.live.values()))


def present(m: TurnManager, key: str) -> frozenset:
    """The lane's turns now, running and waiting: for SuspendSession, taken
    right before its job is written, so every one of them was accepted before
    the job (its accept was written first) and none accepted after it."""
    lane = m.lanes.get(key)
    if lane is None:
        return frozenset()
    return frozenset([*lane.waiting(), *([lane.running] if lane.running is not None else [])])


def drop(m: TurnManager, key: str, before: frozenset | None = None, session_id: str = "") -> None:
    """The lane's queued prompts end superseded; its running turn is
    cancelled. With ``before`` (``present``) and ``session_id``: only the
    turns accepted before SuspendSession's job, which drops after it (had the
    store refused it, the lane would go on): those present when it was
    written, and those whose accept committed ahead of it all the same (its
    job rode the frame bus) in the incarnation it suspends. One accepted
    after the job went to the next incarnation, which the /stop does not end,
    and must stay. Not by incarnation alone: a turn accepted in an older one,
    before a SwitchSession, runs in the one the /stop suspends."""
    lane = m.lanes.get(key)
    if lane is None:
        return

    def stopped(turn: Turn) -> bool:
        return before is None or turn in before or (bool(session_id) and turn.sid == session_id)
    for turn in lane.waiting():
        if stopped(turn):
            lane.detach(turn)
            m.supersede(turn, "")
    if lane.running is not None and stopped(lane.running):
        m.cancel_turn(lane.running, E.CANCELLED)


def evict(m: TurnManager, key: str) -> None:
    """A deleted session's lane on this node: dropped, and its cached agent
    evicted from its worker (no lease taken: for another node's delete the
    deleting node holds it)."""
    drop(m, key)
    if m.pool is not None:
        m.pool.slot_for(key).send(wire.evict(key))

"""What a session operation does to the session's lane around its store job:
ResetSession, SuspendSession, DeleteSession, ClearAllSessions
(api/session_service.py), and another cluster node's deletes mirrored here
(cluster/tail.py). RewindSession and RewriteTranscript are undo.py's; they
begin with ``claim`` too.

The lane's waiting prompts end ``superseded`` and its running turn is
cancelled, so no turn of the session goes on writing into what the job
resets or deletes; a delete also waits (bounded) until those turns' ends have
committed, so the job removes their last writes instead of racing them.

Functions over a TurnManager (like placement.py and supervision.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import errors as E
from . import wire
from .supervision import until_ended

if TYPE_CHECKING:
    from .manager import TurnManager


async def claim(m: TurnManager, key: str) -> None:
    """Before an operation changes the lane: refused (STORE_UNAVAILABLE)
    while the store cannot write, before any turn is ended; in a cluster this
    node takes the lane's lease (LaneElsewhere when another node runs it: the
    call is forwarded there, and the lane's holder does it)."""
    m.store.check_writable()
    await m.own(key)


async def reset(m: TurnManager, key: str) -> None:
    await claim(m, key)
    drop(m, key)


async def suspend(m: TurnManager, key: str) -> None:
    """After the suspend job (it committed: the store could write)."""
    await m.own(key)
    drop(m, key)


async def delete(m: TurnManager, key: str) -> None:
    """Before the delete job: the lane's turns end and their ends commit."""
    await claim(m, key)
    evict(m, key)
    await until_ended([t for t in m.live.values() if t.key == key])


async def clear_all(m: TurnManager) -> None:
    """Before ClearAllSessions' job (and mirroring another node's): every
    lane dropped, every cached agent gone, every turn's end committed."""
    m.store.check_writable()
    for key in list(m.lanes):
        drop(m, key)
    if m.pool is not None:
        m.pool.broadcast(wire.CLEAR)
    await until_ended(list(m.live.values()))


def drop(m: TurnManager, key: str) -> None:
    """The lane's queued prompts end superseded; its running turn is cancelled."""
    lane = m.lanes.get(key)
    if lane is None:
        return
    for turn in lane.waiting():
        lane.detach(turn)
        m.supersede(turn, "")
    if lane.running is not None:
        m.cancel_turn(lane.running, E.CANCELLED)


def evict(m: TurnManager, key: str) -> None:
    """A deleted session's lane on this node: dropped, and its cached agent
    evicted from its worker (no lease taken: for another node's delete the
    deleting node holds it)."""
    drop(m, key)
    if m.pool is not None:
        m.pool.slot_for(key).send(wire.evict(key))

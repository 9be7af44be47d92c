"""A prompt's way into its lane and the store: placed (an idle lane runs it
now; a busy one puts it where its delivery mode says, placement.py), then
accepted by one job (jobs.accept), whose commit sends its ``accepted`` frame
and, on an idle lane, starts it in the same transaction (dispatch.py then
hands it to its worker). A prompt refused on the way leaves no trace
(``unreserve``). Functions over a TurnManager, which reserves the request id
first (TurnManager.submit).

The accept's answer is handled by a callback registered before anyone awaits
it, so it runs as the accept commits: in commit order with the frame bus's
frames, and whether or not the caller is still there.
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING

from .. import errors as E
from ..obs import tracing
from ..sessions.source import SessionSource
from . import burst, dispatch, jobs, placement
from .frames import build_frame
from .lanes import Lane, Turn
from .leasing import LeaseLost

if TYPE_CHECKING:
    from .manager import TurnManager


async def place_and_accept(m: TurnManager, turn: Turn, source: SessionSource | None, internal: bool) -> bool:
    """Place a reserved turn, then accept it; False: the store knew its request id (a twin)."""
    key, epoch, payload = turn.key, turn.epoch, turn.payload
    slot, lane = await _place(m, turn)
    if turn.deferred_end:  # cancelled while a steer waited: accepted, then ended, never run
        lane.detach(turn)
    payload["queue_position"] = placement.position(lane, turn)
    position = lane.next_position()
    if tracing.ACTIVE is not None:  # placed: a turn (refused by its delivery mode, it is none)
        tracing.ACTIVE.turn_began(turn)  # a child of the Prompt RPC's span
    # An idle lane: accept and start in one transaction. Not for the startup
    # restore's resume turns: their starts (and system prompts) should not
    # hold up SERVING, so they start after their accept, through the bus.
    start_now = slot is None and lane.running is turn and not internal
    if start_now and m.bus.unsettled(key):
        # What the lane's last turn sent (its last messages, its end) has not
        # committed: it goes to the writer first, and this turn starts after
        # it, through the bus. Started by its accept, its user message could
        # land between them: a flush refused meanwhile (another lane's epoch
        # moved) is sent again behind the jobs written after it.
        m.bus.flush_now()
        start_now = False
    try:  # refused at once if the store began to fail since check_writable
        accepted = m.store.write(jobs.accept, jobs.AcceptRequest(
            turn.record(), source, m.cfg.dedup_window_s, slot, position, start_now,
            {key: epoch} if epoch else None))
    except BaseException as e:  # reserved above: a turn never accepted must leave no trace
        unreserve(m, lane, turn, e)
        raise
    # Registered before anyone awaits it: runs first, as the accept commits.
    accepted.add_done_callback(functools.partial(_accepted, m, turn, lane, internal))
    try:
        await asyncio.shield(accepted)  # its commit is the store's to answer, whatever comes
    except jobs.DuplicateRequest:
        return False
    return True


async def _place(m: TurnManager, turn: Turn) -> tuple[str | None, Lane]:
    """Into its lane: runs now on an idle one, else where its delivery mode
    says (placement.py). Returns its queue slot (None: runs now or joined
    the running turn) and the lane (a steer's wait may have seen the lane
    end and a new one begin). A refusal leaves no trace."""
    lane = m.lane(turn.key)
    try:
        if not lane.busy():
            lane.running = turn
            return None, lane
        slot = await placement.place_busy(m, lane, turn)
    except BaseException as e:
        unreserve(m, m.lanes.get(turn.key, lane), turn, e)
        raise
    turn.queued = slot is not None
    return slot, m.lanes.get(turn.key, lane)


def _accepted(m: TurnManager, turn: Turn, lane: Lane, internal: bool, fut: asyncio.Future) -> None:
    """The accept job's answer, run as it commits (in commit order with the
    bus's frames, so watchers by key or platform see cursors in order)."""
    if turn.dropped:  # its lane's lease was lost meanwhile: the lane is not ours now
        return
    error = fut.exception() if not fut.cancelled() else E.SidecarError(E.UNAVAILABLE, "cancelled")
    if error is not None:
        unreserve(m, lane, turn, error)
        return
    result: jobs.Accepted = fut.result()
    rid, key, sid, started = turn.rid, turn.key, result.session_id, result.started
    turn.sid = sid
    turn.accept()
    m.recent.remember(rid, turn.created_at, key)
    frame = build_frame(rid, key, sid, 1, turn.created_at, result.cursor, "accepted",
                        {"queue_position": turn.payload["queue_position"]})
    m.bus.deliver_committed(turn, frame, "accepted")
    if result.absorbed is not None:
        burst.committed(m, turn, result.absorbed)
    deferred = turn.deferred_end
    if started is not None and not turn.closing:  # the accept job started it too
        turn.begin()
        turn.next_seq = 3
        frame = build_frame(rid, key, sid, 2, started.at, started.cursor, "started", {})
        m.bus.deliver_committed(turn, frame, "started")
        if deferred:  # ended (cancelled, superseded) before the commit came back
            m.end(turn, *deferred)  # it kept its lane: the next turn starts after its end
        else:
            dispatch.dispatch(m, turn, started)
    elif deferred:  # not started by its accept (a resume turn): it too kept its lane
        m.end(turn, *deferred)
    elif turn.host is None and lane.running is turn and not turn.began:
        dispatch.start(m, turn)


def unreserve(m: TurnManager, lane: Lane, turn: Turn, error: BaseException) -> None:
    """A prompt refused before its accept committed leaves no trace; a twin
    call following it gets the same answer (see PromptService._follow)."""
    if isinstance(error, LeaseLost) and m.leases is not None:
        # The lane's turns here end, this one too: CANCELLED when a delete revoked its lease.
        m.leases.refused(error.epochs, 1, error.revoked)
        return
    if m.live.get(turn.rid) is turn:
        del m.live[turn.rid]
    tracing.turn_left(turn, getattr(error, "reason", E.UNAVAILABLE))
    lane.detach(turn)
    burst.reinstate(m, turn)
    if not isinstance(error, (E.SidecarError, jobs.DuplicateRequest)):
        error = E.SidecarError(E.UNAVAILABLE, "the prompt with this request id was not accepted; retry")
    for sub in turn.subscribers:
        sub.push(error)
    turn.subscribers.clear()
    m.advance(lane)

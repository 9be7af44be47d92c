"""Where a prompt for a busy lane goes (docs/semantics.md delivery modes, seed 001 §8):
rejected, queued (FIFO), collapsed into the single follow-up slot (absorbing
the pending prompt), put ahead as an interrupt or rollback, or steered into
the running turn.

Functions over a TurnManager (like supervision.py and worker_events.py).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from .. import errors as E
from ..delivery import FOLLOW_UP, INTERRUPT, QUEUE, REJECT_IF_BUSY, ROLLBACK, STEER
from . import burst, wire
from .lanes import Lane, Phase, Turn

if TYPE_CHECKING:
    from .manager import TurnManager
    from .pool import WorkerHandle

async def place_busy(m: TurnManager, lane: Lane, turn: Turn) -> str | None:
    """Put a prompt for a busy lane where its delivery mode says; returns its
    queue slot (``pending``/``fifo``) or None when it joined the running turn
    (STEER) or the lane turned out idle. Raises AGENT_BUSY, QUEUE_FULL."""
    mode = turn.delivery
    if mode == REJECT_IF_BUSY:
        raise E.SidecarError(E.AGENT_BUSY, f"session {lane.key} has a turn in flight",
                             retry_after_s=1.0)
    if mode == STEER:
        if await steer(m, lane, turn):
            return None
        if turn.dropped:
            # Its lane's lease was lost while it waited (its turns here were
            # stopped, this one too): placed in a lane this node took anew
            # since, it would be accepted under the old epoch, refused by the
            # fence, and left there as the lane's next turn, never to start,
            # with every later prompt of the lane queued behind it.
            raise E.SidecarError(E.LANE_MOVED, "the session's lane was lost while this STEER waited; retry",
                                 retry_after_s=0.2)
        # While it waited the lane may have ended (and been dropped): place
        # the turn in the key's lane as it is now; an idle one runs it.
        lane = m.lane(turn.key)
        if not lane.busy():
            lane.running = turn
            return None
        if turn.deferred_end is not None:
            # Cancelled while it waited: accepted, it ends at once without running
            # (accept.place_and_accept), so it takes no place in the lane, least of
            # all the pending prompt's: absorbed, that one's text would end with it.
            return "fifo"
        mode = FOLLOW_UP
    # The cap bounds how deep the queue gets: a follow-up that only
    # replaces the pending one does not deepen it.
    profile = m.cfg.profile(turn.profile)
    cap = profile.queue_cap if profile else 0
    deepens = mode == QUEUE or (mode == FOLLOW_UP and lane.pending is None)
    if cap and deepens and lane.depth() >= cap:
        raise E.SidecarError(E.QUEUE_FULL,
                             f"session {lane.key} already has {lane.depth()} queued prompts"
                             f" (profiles.{turn.profile}.queue_cap = {cap}); retry later",
                             retry_after_s=1.0)
    if mode in (INTERRUPT, ROLLBACK):
        if mode == INTERRUPT:
            absorb_unstarted(lane, turn)
        else:
            replace_unstarted(m, lane)
        lane.interrupt.append(turn)
        running = lane.running
        if running is None:  # it took over the turn that was about to start
            m.advance(lane)
        elif not running.finished:
            if mode == ROLLBACK:
                running.want_rollback()
            m.cancel_turn(running, E.CANCELLED)
        return "pending"
    if mode == QUEUE:
        lane.fifo.append(turn)
        return "fifo"
    if lane.pending is not None:  # burst collapse: the newer follow-up absorbs the pending one
        burst.absorb(lane.pending, turn)
    lane.pending = turn
    return "pending"


def absorb_unstarted(lane: Lane, turn: Turn) -> None:
    """An INTERRUPT takes over a user prompt that has not started yet, as a
    follow-up takes over the pending one (burst.py): the older INTERRUPT still
    waiting behind the cancelled turn, or else the queued prompt next in line
    whose start is not decided yet. That one ends ``superseded`` by this turn,
    and its text runs in this turn as its own user message, before this one's.

    Why: a turn that has started keeps its user message when it is cancelled;
    one that had not would keep nothing. Two INTERRUPTs sent together would
    otherwise lose the first one's text or not depending on milliseconds.

    An auto-resume turn takes nothing over: its note is the system's, and a
    user's text run in it would be stored as the system's too."""
    if "resume" in turn.payload:
        return
    if lane.interrupt:
        older = lane.interrupt[-1]
        if older.delivery == INTERRUPT and _unstarted_user_prompt(older):
            lane.interrupt.pop()
            burst.absorb(older, turn)
        return
    running = lane.running
    if running is not None and running.queued and _unstarted_user_prompt(running):
        lane.running = None  # popped to run while its accept commits: nothing of it ran
        burst.absorb(running, turn)


def replace_unstarted(m: TurnManager, lane: Lane) -> None:
    """A ROLLBACK replaces the INTERRUPT or ROLLBACK still waiting ahead of it
    behind the cancelled turn: that one ends ``failed`` CANCELLED without
    running, as it does when it has just become the running turn (cancelled
    before it ran) or had begun (cancelled, what it wrote rolled back).

    Why: two ROLLBACKs sent together otherwise ran both, one after the other,
    or only the second, depending on milliseconds; a rollback means "this
    instead of what is in flight", and the newer one is what the user wants."""
    if lane.interrupt:
        older = lane.interrupt[-1]
        if older.delivery in (INTERRUPT, ROLLBACK) and _unstarted_user_prompt(older):
            lane.detach(older)
            m.close(older, "failed", E.CANCELLED, "replaced by a newer ROLLBACK before it ran")


def _unstarted_user_prompt(t: Turn) -> bool:
    """Acknowledged or about to be, nothing of it started or decided: its text
    can still move to another turn. Not an auto-resume note (synthetic)."""
    return ((t.phase is Phase.WAITING or t.phase is Phase.RESERVED) and not t.began
            and t.host is None and t.deferred_end is None and not t.cancel_reason
            and "resume" not in t.payload)


def position(lane: Lane, turn: Turn) -> int:
    """0 runs now (or joined the running turn); n = n-th in line."""
    if lane.running is turn or turn.host is not None:
        return 0
    waiting = lane.waiting()
    return waiting.index(turn) + 1 if turn in waiting else 0


async def steer(m: TurnManager, lane: Lane, turn: Turn) -> bool:
    """Ask the running turn's worker to take the text into its turn (seed 001
    §8's /steer); its answer comes through ``m.steer_waits`` (worker_events).

    The worker takes it only within ``agent.steer_timeout_s`` of the asking
    (a monotonic deadline in the message; one clock for every process of the
    host) and refuses it after; this side waits that long and as long again
    for the answer. So a worker too busy to answer in time (its loop blocked,
    stopped) never takes a steer this side has given up on and placed as a
    follow-up, which would run its text twice.

    No one is asked when no worker could answer: the host's run has not
    reached its worker yet (the worker slot respawning; the run waits for it),
    so the steer would be dropped unsent. A worker that dies while a steer
    waits for it answers no (``worker_events.on_exit``). Either way the prompt
    falls back at once, instead of after the whole wait."""
    host = lane.running
    if host is None or not host.began or host.finished or host.worker is None:
        return False
    if turn.deferred_end is not None:  # cancelled before it was asked (its placement is a task)
        return False
    h = host.worker
    if not h.ready.is_set() or host.worker_gen != h.generation:
        return False
    window = m.cfg.steer_timeout_s
    fut = asyncio.get_running_loop().create_future()
    m.steer_waits[turn.rid] = (fut, h)
    h.send(wire.steer(host.rid, turn.rid, turn.text, time.monotonic() + window))
    try:
        async with asyncio.timeout(2 * window):
            ok = await fut
    except TimeoutError:
        ok = False
    finally:
        m.steer_waits.pop(turn.rid, None)
    if ok and not host.closing:
        turn.join(host)
        if turn.deferred_end is not None and turn.deferred_end[1] == E.CANCELLED:
            m.cancel_turn(host, E.CANCELLED)  # cancelled while the worker took its text in
        return True
    return False


def steers_answered_no(m: TurnManager, worker: WorkerHandle | None = None) -> None:
    """The steers waiting for ``worker``'s answer (None: any worker's) are
    told no, as the worker would answer them (``steer``): no answer will
    come (it died; the store's writer died and nothing more commits), so
    each falls back at once instead of after the whole wait."""
    for fut, asked in list(m.steer_waits.values()):
        if (worker is None or asked is worker) and not fut.done():
            fut.set_result(False)

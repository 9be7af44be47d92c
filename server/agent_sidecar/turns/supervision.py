"""Supervision of the turn system across its life: the startup restore
(rebuilding lanes from the store and starting auto-resume turns), the drain on
shutdown, the watchdog for workers whose loop is blocked, and what a store
that cannot write (or has lost its writer) means for the turns.

Functions over a TurnManager, kept apart so the manager stays about accepting
and running turns.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import errors as E
from ..delivery import INTERRUPT, ROLLBACK
from ..obs import tracing
from ..recovery.startup import INTERRUPTED, RestoredPrompt, RestorePlan
from ..sessions import lifecycle as life
from ..store import StoreUnavailable
from . import placement, wire
from .lanes import Turn

if TYPE_CHECKING:
    from .manager import TurnManager
    from .subscriber import Subscriber

log = logging.getLogger("agent_sidecar.turns")

# A turn's worker has its timeout and this long more to end it before the
# watchdog takes it for stuck (a cancelled turn's: ``agent.cancel_grace_s``).
WATCHDOG_GRACE_S = 15.0
# The note an auto-resume turn runs with. It is stored as the turn's user
# message marked synthetic (nobody wrote it; adapters can tell), and the model
# reads it as written: its last turn was cut off, what it already did may have
# happened, so it reports where things stand instead of redoing finished work
# or repeating tool calls that may have taken effect.
RESUME_TEXT = ("[The previous turn was interrupted ({reason}) before it finished. This note comes from "
               "the system, not from the user. Tool calls made in that turn may already have taken "
               "effect: check their results above and do not repeat any of them blindly. Tell the "
               "user where things stand (what was done, what is left) instead of redoing finished "
               "work.]")


async def restore(m: TurnManager) -> None:
    """Run the store's restore job, rebuild queued lanes, submit auto-resume
    turns. A cluster node restores only the lanes it held (its leases do)."""
    from ..recovery.startup import consume_marker
    from ..recovery.startup import restore as restore_job
    if m.leases is not None:
        await m.recent.load(m.store)
        await m.leases.restore()
        return
    clean = consume_marker(m.cfg.data_dir)
    plan = await m.store.write(restore_job, clean, m.cfg.gateway_auto_continue_freshness,
                               m.cfg.auto_resume)
    await m.recent.load(m.store)
    log.info("startup restore", extra={"clean": plan.clean, "marked": len(plan.marked),
                                       "suspended": plan.suspended,
                                       "closed_turns": plan.closed_turns,
                                       "queued": len(plan.queued), "resume": len(plan.resume)})
    await adopt(m, plan)


async def adopt(m: TurnManager, plan: RestorePlan, epoch: int = 0) -> None:
    """Run what a restore plan found: its queued prompts back in their lanes,
    in order, its auto-resume turns submitted, those lanes started. For the
    startup restore, and for lanes a cluster node takes over (``epoch``: the
    lease they are held at). The turns the restore job ended count in the
    metrics' turns_total as every other ended turn does."""
    if plan.closed_turns:
        m.stats.ended.add(("failed", INTERRUPTED), plan.closed_turns)
    if plan.superseded:
        m.stats.ended.add(("superseded", ""), plan.superseded)
    keys = {q.entry.session_key for q in plan.queued} | {r.session_key for r in plan.resume}
    for q in plan.queued:
        _restore_queued(m, q).epoch = epoch
    # A lane whose user had interrupted the turn that was cut off (an INTERRUPT
    # or ROLLBACK waits in it) gets no continue turn: the user asked that turn
    # to stop, and their prompt runs next, as sent.
    resume = [r for r in plan.resume if not _user_interrupted(m.lanes.get(r.session_key))]
    # Submitted together, the resume turns' accepts share a few commits. One
    # refused (the store failing just now) must not leave the lanes unstarted,
    # their queued prompts waiting for ever: every lane goes on, then it is raised.
    refused = [e for e in await asyncio.gather(*(
        m.submit(rid=r.request_id, key=r.session_key, platform=r.platform,
                 profile=r.profile if m.cfg.profile(r.profile) else "main",
                 text=RESUME_TEXT.format(reason=r.reason), delivery=INTERRUPT,
                 source=None, timeout_s=_turn_timeout(m, r.profile),
                 payload={"resume": r.reason}, internal=True, epoch=epoch)
        for r in resume), return_exceptions=True) if isinstance(e, BaseException)]
    for key in sorted(keys):
        lane = m.lanes.get(key)
        if lane is not None:
            m.advance(lane)
    if refused:
        raise refused[0]


def _user_interrupted(lane) -> bool:
    return lane is not None and any(t.delivery in (INTERRUPT, ROLLBACK) and "resume" not in t.payload
                                    for t in lane.interrupt)


def _turn_timeout(m: TurnManager, profile: str) -> float:
    """A restored or resumed turn's timeout: its profile's ``timeout_s`` (the
    profile it runs with: ``main`` for one gone from the config, as
    SystemPrompts.for_turn), else ``agent.gateway_timeout``, as PromptService
    gives a prompt (the caller's deadline went with its call)."""
    prof = m.cfg.profile(profile) or m.cfg.profile("main")
    return (prof.timeout_s if prof is not None else 0) or m.cfg.gateway_timeout


def _restore_queued(m: TurnManager, q: RestoredPrompt) -> Turn:
    e = q.entry
    turn = Turn.restored(rid=e.request_id, key=e.session_key, platform=e.platform,
                         profile=e.payload.get("profile", "main"), text=e.text,
                         delivery=e.delivery, sid=e.session_id, created_at=e.created_at,
                         payload=e.payload, timeout_s=_turn_timeout(m, e.payload.get("profile", "main")),
                         next_seq=q.next_seq, queued=q.slot != "next",
                         absorbed=list(q.absorbed))  # a follow-up that absorbed a burst (burst.py)
    lane = m.lane(turn.key)
    if q.slot == "next":  # it was about to run when the last run ended
        lane.interrupt.appendleft(turn)
    elif turn.delivery in (INTERRUPT, ROLLBACK):
        lane.interrupt.append(turn)
    elif q.slot == "pending" and lane.pending is None:
        lane.pending = turn
    else:
        lane.fifo.append(turn)
    lane.position_counter = max(lane.position_counter, q.position)
    m.live[turn.rid] = turn
    return turn


async def drain(m: TurnManager, timeout: float, cut: asyncio.Event | None = None) -> bool:
    """Stop taking prompts, let in-flight turns finish (queued ones stay
    queued, persisted, for the next start). Returns whether it finished in
    time; if not (the timeout passed, or ``cut`` was set: an operator's second
    stop signal), the lanes still running are marked resume_pending."""
    m.accepting = False
    m.draining = True
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while m.busy_keys() and loop.time() < deadline and m.store.fault is None \
            and not (cut is not None and cut.is_set()):
        await asyncio.sleep(0.05)
    if m.store.fault is not None:
        return _undrained(m)
    still = sorted(m.busy_keys())
    if still:
        try:
            if not await answered(m.store.write(life.mark_resume_pending_many, still, "shutdown_timeout")):
                return _unanswered(m)
        except StoreUnavailable:
            return _undrained(m)
        log.warning("drain cut short" if cut is not None and cut.is_set() else "drain timed out",
                    extra={"sessions": still})
        # End them as what they are, cut off by the drain (their tool calls get
        # results in the worker), and give the workers a moment to say so.
        for key in still:
            lane = m.lanes.get(key)
            if lane is not None and lane.running is not None:
                m.cancel_turn(lane.running, "shutdown_timeout")
        end = loop.time() + 2.0
        while m.busy_keys() and loop.time() < end:
            await asyncio.sleep(0.02)
    # Every frame the bus holds, and every write queued before now, committed.
    end = loop.time() + 5.0
    while not m.bus.idle() and m.store.fault is None and loop.time() < end:
        await asyncio.sleep(0.01)
    try:
        if not await answered(m.store.barrier()):
            return _unanswered(m)
    except StoreUnavailable:
        return _undrained(m)
    return not still and m.bus.idle()


# How long a stop waits for one answer from the store's writer (drain, final writes).
STOP_WRITE_WAIT_S = 10.0


async def answered(write, within: float = STOP_WRITE_WAIT_S) -> bool:
    """Whether the store answered ``write`` (a store write's awaitable) within
    ``within`` seconds; it raises what the write raises. A writer that stalls
    (a hung disk or database, a stopped process) answers nothing: a stop
    waiting on it waited for ever, a second stop signal or not, until the
    supervisor's SIGKILL. Unanswered, the write is given up (not undone: it
    may still commit before the writer is closed), and the stop is not clean.
    A second signal does not shorten the wait: a healthy store answers in
    far less, and its answers are what make a cut drain a clean stop."""
    task = asyncio.ensure_future(write)
    try:
        done, _ = await asyncio.wait((task,), timeout=within)
    finally:
        if not task.done():
            task.cancel()
    if task not in done:
        return False
    task.result()
    return True


def _unanswered(m: TurnManager) -> bool:
    """The store's writer did not answer: the drain stops waiting (what it
    has not answered is not known to be saved: no clean-shutdown marker)."""
    log.error("the store did not answer: stopping without finishing the drain",
              extra={"busy_sessions": sorted(m.busy_keys()), "unanswered_writes": m.store.commit_stats.backlog})
    return False


def _undrained(m: TurnManager) -> bool:
    """The store cannot write: nothing more can end durably, so the drain
    stops waiting. What the bus still holds is lost with this process; the
    next start's restore closes those turns (their ledger rows are open)."""
    log.error("the store cannot write: stopping without finishing the drain",
              extra={"busy_sessions": sorted(m.busy_keys()), "unsaved_flush": not m.bus.idle()})
    return False


async def until_ended(m: TurnManager, turns, timeout: float = 10.0) -> None:
    """Wait (bounded) until these turns' terminal frames have committed, so a
    DeleteSession or ClearAllSessions that follows removes their last writes
    (the terminal frame, the turn-state row) instead of racing them. Once
    nothing more can commit here (``end_streams``: the writer died, the
    sidecar stops while the store cannot write) those ends will not come:
    it raises that error, which the caller's job would meet too, rather than
    wait on until the server's stop cuts the call with no ErrorInfo."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    pending = [t for t in turns if not t.finished]
    while pending and loop.time() < end:
        if m.cannot_commit is not None:
            raise copy.copy(m.cannot_commit)
        await asyncio.sleep(0.02)
        pending = [t for t in pending if not t.finished]
    if pending:
        log.warning("turns still running after their cancel",
                    extra={"request_ids": [t.rid for t in pending]})


async def watchdog(m: TurnManager) -> None:
    """The worker enforces turn timeouts itself; this catches a worker whose
    loop is blocked (a backend doing CPU-bound or blocking work) or that is
    stopped: past the deadline plus a grace (for a cancelled turn,
    ``agent.cancel_grace_s`` after its cancel), the worker is killed and its
    turns end WORKER_CRASHED like any other dead worker's (a cancelled one
    with its cancel's reason).

    It wakes at the nearest deadline (a cancel wakes it to look again), so a
    worker is killed when its grace is over, not up to a polling period
    later; and at least every ``WATCHDOG_GRACE_S / 3``, for the deadlines
    turns got as they started."""
    loop = asyncio.get_running_loop()
    while True:
        m.watchdog_wake.clear()
        now = loop.time()
        wake_at = now + WATCHDOG_GRACE_S / 3
        for turn in list(m.live.values()):
            h = turn.worker
            if h is None or not turn.deadline or turn.closing:
                continue
            if now < turn.deadline:
                wake_at = min(wake_at, turn.deadline)
                continue
            log.error("worker did not end a turn in time; killing it",
                      extra={"request_id": turn.rid, "worker": h.index, "pid": h.pid,
                             "cancelled": turn.cancel_reason or ""})
            turn.deadline = 0.0
            if h.process is not None and h.process.is_alive():
                h.process.kill()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(wake_at):
                await m.watchdog_wake.wait()


def on_store_fault(m: TurnManager, fault) -> None:
    """The store cannot write: every turn running on a worker is cancelled
    (reason STORE_UNAVAILABLE), so workers stop producing frames that could
    only pile up in memory; their ``failed`` frames commit, like everything
    the bus holds, once the store can write again. Queued turns stay queued
    and run then: a lane's next turn starts, but its ``started`` frame waits
    for the store, and its worker gets the turn only after that commit. With
    new prompts and writes refused, this is what bounds the memory held while
    the store cannot write: per lane, what its turn produced before the cancel
    took effect (at most limits.max_frames_per_turn frames), its end, and the
    next turn's start."""
    if fault is None:
        return
    for lane in list(m.lanes.values()):
        turn = lane.running
        if turn is not None and turn.worker is not None:
            m.cancel_turn(turn, E.STORE_UNAVAILABLE)


def end_streams(m: TurnManager, err: BaseException) -> None:
    """Nothing more will commit in this process (the store's writer died, or
    the sidecar stops while the store cannot write): the turns' streams end
    now with ``err`` (UNAVAILABLE, STORE_UNAVAILABLE) instead of waiting for
    frames that will never come; the next start's restore closes the turns.
    A STEER waiting for a worker's answer gets no, so its call ends the same
    way (its fallback's accept fails) rather than cut by the server's stop; a
    session operation riding the frame bus gets ``err``, and so does a delete
    waiting for its turns' ends (``until_ended``)."""
    m.cannot_commit = err
    for turn in list(m.live.values()):
        for sub in turn.subscribers:
            sub.push(err)
        turn.subscribers.clear()
    placement.steers_answered_no(m)  # each falls back, and its accept fails as every write does now
    m.bus.end_operations(err)


def trust(m: TurnManager, keys: AbstractSet[str], stop_at: Callable[[str], float]) -> None:
    """A cluster node renewed these lanes' leases: the workers running their
    turns are told how long each may run now (``stop_at(key)``: wire.Run's
    ``stop_at``, when a worker stops a turn its stalled node did not)."""
    told: dict[Any, dict[str, float]] = {}
    for turn in m.live.values():
        if turn.key in keys and turn.worker is not None and turn.in_flight:
            told.setdefault(turn.worker, {})[turn.rid] = stop_at(turn.key)
    for worker, stops in told.items():
        worker.send(wire.trust(stops))


def end_queued_streams(m: TurnManager) -> None:
    """The sidecar stops, drained, with prompts still waiting in their lanes
    (persisted: they run after the restart): the Prompt calls and request
    watches following them end UNAVAILABLE now, saying so, instead of being
    cut with no ErrorInfo by the server's stop. A turn that began or is
    ending is not one of them: its end commits with the drain."""
    for turn in list(m.live.values()):
        if turn.began or turn.closing or not turn.subscribers:
            continue
        err = E.SidecarError(E.UNAVAILABLE, "the sidecar is shutting down; the prompt stays queued and runs"
                                            " after the restart: follow it with WatchActivity(request_id)")
        for sub in turn.subscribers:
            sub.push(err)
        turn.subscribers.clear()


@dataclass
class Stopped:
    """A turn ``stop_lane`` stopped, with its streams, not yet told how it ended."""

    request_id: str
    acked: bool  # its accept had committed: the ledger held it
    subscribers: list[Subscriber]
    started: bool = False  # its start had committed (it was given to its worker): not a waiting prompt


def abandon(m: TurnManager, key: str, error: E.SidecarError) -> None:
    """This node must stop the lane's turns at once, writing nothing more, and
    knows how their streams end (``error``: the lane was deleted, CANCELLED)."""
    for stopped in stop_lane(m, key, error.reason):
        for sub in stopped.subscribers:
            sub.push(error)


def stop_lane(m: TurnManager, key: str, reason: str) -> list[Stopped]:
    """The lane's turns here stop at once (``reason``: why, to their workers
    and traces), writing nothing more (the store would refuse it: the node
    that took the lane over closes or reruns them from the ledger), and the
    lane is dropped; returns them with their streams' subscribers, not yet
    told how they end (``abandon`` tells them at once; a lane lost here tells
    them once the store says why: cluster/leases.py)."""
    lane = m.lanes.pop(key, None)
    stopped: list[Stopped] = []
    for turn in [t for t in m.live.values() if t.key == key]:
        del m.live[turn.rid]
        if turn.began and turn.worker is not None and not turn.finished:
            turn.worker.send(wire.cancel(turn.rid, reason))
        turn.drop()
        tracing.turn_left(turn, reason)
        stopped.append(Stopped(turn.rid, turn.acked, list(turn.subscribers), turn.worker is not None))
        turn.subscribers.clear()
    m.bus.forget(key)
    if lane is not None and m.pool is not None:
        m.pool.slot_for(key).send(wire.evict(key))
    return stopped

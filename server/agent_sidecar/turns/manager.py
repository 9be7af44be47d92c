"""TurnManager: the parent-side owner of turns.

It accepts prompts (ledger first, then the ``accepted`` frame), keeps each
session's lane (running turn, interrupt slot, follow-up slot, FIFO), starts
turns on the session's worker, ends them, and cleans up after cancels.
Beside it, functions over a TurnManager: accept.py places a prompt in its
lane and commits its accept, dispatch.py hands a starting turn
to its worker, worker_events.py turns what workers say into frames and
transcript rows (and handles dead workers), placement.py puts a prompt for
a busy lane where its delivery mode says, lane_admin.py ends a lane's turns
before a reset, suspend or delete (undo.py: before a rewind or rewrite),
supervision.py restores, drains and watches; dedup.py answers "seen this
request id?", context.py builds system prompts. Every decision about a lane
is made synchronously on the event loop, so lanes need no locks; the store
mirrors them for recovery.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable
from typing import Any

from .. import errors as E
from .. import logs
from ..config import Config
from ..delivery import FOLLOW_UP, STEER
from ..obs import tracing
from ..sessions.source import SessionSource
from ..store import Store
from ..tools.registry import ToolRegistry
from . import accept, admission, dedup, dispatch, jobs, supervision, wire, worker_events
from .context import SystemPrompts
from .frames import FrameBus
from .lanes import Lane, Phase, Turn
from .leasing import LaneLeases
from .memory import budget_per_worker
from .pool import WorkerHandle, WorkerPool
from .stats import TurnStats
from .subscriber import Subscriber


class TurnManager:
    def __init__(self, cfg: Config, store: Store, tools: ToolRegistry,
                 leases: LaneLeases | None = None):
        self.cfg, self.store = cfg, store
        self.leases = leases  # a cluster's lane leases (turns/leasing.py); None: every lane is ours
        self.stats = TurnStats()  # for the metrics endpoint (turns/stats.py)
        self.bus = FrameBus(store, cfg.limits.stream_buffer_frames, cfg.limits.stream_buffer_bytes,
                            self.stats, on_fenced=leases.refused if leases is not None else None,
                            on_lost=self._lost)
        self.lanes: dict[str, Lane] = {}
        self.recent = dedup.RecentRequests(cfg.dedup_window_s)  # the dedup window's request ids
        self.prompts = SystemPrompts(cfg)
        self.live = admission.LiveTurns()  # request id -> every turn not yet ended
        self.tools = tools
        self.pool: WorkerPool | None = None
        self.ready = asyncio.Event()  # set when startup restore is done
        self.accepting = True
        self.draining = False
        self.cannot_commit: BaseException | None = None  # why nothing more commits here (end_streams)
        self.steer_waits: dict[str, tuple[asyncio.Future, WorkerHandle]] = {}  # placement.steer
        self.watchdog_wake = asyncio.Event()  # a turn's deadline came nearer (supervision.watchdog)
        self._tasks: set[asyncio.Task] = set()
        store.watch_faults(functools.partial(supervision.on_store_fault, self))

    # -- lifecycle ------------------------------------------------------------------

    async def start_workers(self) -> None:
        n = self.cfg.worker_count()
        c = self.cfg.agent_cache
        settings = {"reader": self.store.reader_spec(), "parent_pid": os.getpid(),
                    "log_levels": logs.levels(),  # the sidecar's level, the libraries' level
                    "coalesce_ms": self.cfg.stream.coalesce_ms,
                    "max_reply_chars": self.cfg.limits.max_reply_chars,
                    "cache": {
            "max_size": c.max_size, "idle_ttl_secs": c.idle_ttl_secs,
            "memory_budget_bytes": budget_per_worker(c.memory_high_mb, n),
            "max_evictions_per_pass": c.max_evictions_per_pass, "protect_recent": c.protect_recent,
            "sweep_interval_s": c.sweep_interval_secs}}
        self.pool = WorkerPool(n, settings, functools.partial(worker_events.on_message, self),
                               functools.partial(worker_events.on_exit, self))
        await self.pool.start()

    async def start(self) -> None:
        """Startup restore, then open for prompts (which wait for ``ready``)."""
        from ..recovery import housekeeping
        self.tools.load_entry_points()
        await supervision.restore(self)
        self.ready.set()
        self.spawn(housekeeping.run(self.cfg, self.store, self.busy_keys))
        self.spawn(housekeeping.index_messages(self.store))
        self.spawn(supervision.watchdog(self))

    async def drain(self, timeout: float, cut: asyncio.Event | None = None) -> bool:
        return await supervision.drain(self, timeout, cut)

    async def stop(self) -> None:
        self.accepting = False
        for turn in self.live.values():  # queued for the next start, or cut off: spans exported
            tracing.turn_left(turn, "shutdown")
        for task in list(self._tasks):
            task.cancel()
        if self.pool is not None:
            await self.pool.stop()

    def spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- lanes and their leases -------------------------------------------------------

    def queue_depth(self, key: str) -> int:
        lane = self.lanes.get(key)
        return lane.depth() if lane else 0

    def open_turns(self) -> int:
        """Turns that started and whose end has not committed."""
        return sum(1 for t in self.live.values() if t.began and not t.finished)

    def busy_keys(self) -> set[str]:
        return {k for k, lane in self.lanes.items() if lane.running is not None}

    async def own(self, key: str) -> int:
        """In a cluster, this node's lease on the lane (taken when it has none;
        LaneElsewhere when another node runs it); 0 on one sidecar."""
        return await self.leases.hold(key) if self.leases is not None else 0

    def lane(self, key: str) -> Lane:
        """The key's lane, made when it has none."""
        lane = self.lanes.get(key)
        if lane is None:
            lane = self.lanes[key] = Lane(key)
        return lane

    # -- accepting prompts --------------------------------------------------------------

    async def submit(self, *, rid: str, key: str, platform: str, profile: str, text: str,
                     delivery: int, source: SessionSource | None, timeout_s: float,
                     payload: dict[str, Any], internal: bool = False,
                     epoch: int = 0, call_deadline: float = 0.0) -> tuple[Turn, Subscriber] | None:
        """Accept a prompt. Returns the new turn and the caller's subscriber
        to it, or None when the request id is already known (the caller
        replays it). The subscriber hears the turn's frames, or why it ended
        here: a lane lost or deleted while the accept committed lets go of
        the turn's subscribers, after telling them (cluster/leases.py).
        ``internal``: a restore's resume turn, written under ``epoch``, the
        lease its restore was taken at (whatever became of it meanwhile)."""
        if not internal and not self.ready.is_set():
            await self.ready.wait()  # startup restore first: never race it
        if not self.accepting:
            raise E.SidecarError(E.UNAVAILABLE, "the sidecar is shutting down")
        if await dedup.is_twin(self, rid, key):  # the caller replays the original turn
            return None
        # A known request id replays (reads work); a new one is refused before
        # placement could end or move anything in its lane.
        self.store.check_writable()
        if not internal:
            admission.check(self.live, self.cfg.limits)
        epoch = await self.own(key) if not internal else epoch
        placed = self.live.get(rid)
        if placed is not None:  # placed while this one took the lease: a twin, or another lane's
            if placed.key != key:
                raise jobs.request_id_reused(rid)
            return None
        turn = Turn(rid=rid, key=key, platform=platform, profile=profile, text=text,
                    delivery=delivery or FOLLOW_UP, timeout_s=timeout_s, payload=payload,
                    epoch=epoch, call_deadline=call_deadline)
        # Reserved before any await: a twin call with this request id follows
        # this turn (and hears it if it is refused) instead of placing its own.
        self.live[rid] = turn
        sub = self.bus.subscriber()
        if not internal:  # nobody streams a restore's resume turn (a WatchActivity may)
            turn.subscribers.append(sub)
        placing = accept.place_and_accept(self, turn, source, internal)
        lane = self.lanes.get(key)
        try:
            if turn.delivery == STEER and lane is not None and lane.running is not None:
                # Placed once the running turn's worker answers, which may be taking its text in: a
                # task its caller going away does not stop (a retry would steer the text in again).
                task = asyncio.ensure_future(placing)
                task.add_done_callback(lambda t: t.cancelled() or t.exception())  # read, caller or not
                accepted = await asyncio.shield(task)
            else:  # placed at once; a caller going away leaves the accept to commit
                accepted = await placing
        except asyncio.CancelledError:
            if sub in turn.subscribers:
                turn.subscribers.remove(sub)
            raise
        return (turn, sub) if accepted else None

    # -- running turns (dispatch.py starts them on their workers) ---------------------------

    def cancel_turn(self, turn: Turn, reason: str) -> bool:
        """A turn not started leaves its lane and ends at once; one whose
        accept, in flight, starts it keeps its lane and ends right after that
        commit; a started one's worker is told to stop (it ends with ``reason``)."""
        if turn.closing:
            return False
        lane = self.lanes.get(turn.key)
        if lane is not None and lane.starting(turn):  # it keeps its lane until its accept commits
            self.close(turn, "failed", reason, "cancelled before it ran")
            return True
        if not turn.began:
            if lane is not None:
                lane.detach(turn)
            else:
                turn.leave_host()
            self.close(turn, "failed", reason, "cancelled before it ran")
            if lane is not None:
                self.advance(lane)
            return True
        turn.cancel(reason)
        if turn.worker is not None:
            turn.worker.send(wire.cancel(turn.rid, reason))
            soon = asyncio.get_running_loop().time() + self.cfg.cancel_grace_s  # else the watchdog acts
            turn.deadline = min(turn.deadline, soon) if turn.deadline else soon
            self.watchdog_wake.set()
        return True

    def supersede(self, turn: Turn, by_rid: str) -> None:
        if not turn.closing:
            self.close(turn, "superseded", "", by_rid)

    # -- ending turns ----------------------------------------------------------------------

    def end(self, turn: Turn, status: str, reason: str, text: str) -> None:
        """A started turn is over: persist the end, free the lane, start the next."""
        lane = self.lanes.get(turn.key)
        if lane is not None and lane.running is turn:
            lane.running = None
        self.close(turn, status, reason, text)
        for st in turn.steers:
            self.close(st, status, reason, text)
        if lane is not None:
            self.advance(lane)

    def close(self, turn: Turn, status: str, reason: str, text: str) -> None:
        """Publish the turn's terminal frame with the ledger's end (once; one
        decided before its accept committed waits for that commit)."""
        if turn.closing:  # a turn ends once
            return
        if not turn.accepted:  # its accepted frame is not committed yet: end after it
            if turn.deferred_end is None:  # the first end decided is the one
                turn.defer_end(status, reason, text)
            return
        turn.ending()
        self._publish_end(turn, status, reason, text)

    def _publish_end(self, turn: Turn, status: str, reason: str, text: str) -> None:
        """The terminal frame of an ENDING turn, with the ledger's end job."""
        if status == "completed":
            kind, body = "completed", {"final_text": text}
        elif status == "superseded":
            kind, body = "superseded", {"by_request_id": text}
        else:
            kind, body = "failed", {"reason": reason, "message": text}
        lane = self.lanes.get(turn.key)
        lane_idle = lane is None or not lane.busy()
        state = {"request_id": turn.rid, "status": status, "reason": reason, "usage": turn.usage,
                 "final_text": text if status == "completed" else ""}
        write: tuple[Callable[..., None], tuple[Any, ...]]
        if turn.began and turn.host is None:
            # last_seq: the seq this terminal frame is about to get
            write = (jobs.finish, (jobs.TurnEnd(turn.rid, turn.key, turn.sid, status, reason,
                                                turn.next_seq, turn.rollback, lane_idle, state),))
        else:
            write = (jobs.close_unstarted, (turn.rid, status, reason, turn.next_seq))
        # Out of ``live`` once its end committed (a lost flush's refusal is no end: lost()).
        self.bus.publish(turn, kind, body, write=write,
                         then=lambda _: self.live.pop(turn.rid, None)
                         if turn.finished and self.live.get(turn.rid) is turn else None)

    def _lost(self, turn, error: E.SidecarError, ended: bool) -> None:
        """A flush the store refused for good took the turn's activity with it
        (turns/flights.py): it ends failed with the error, nothing it wrote
        kept (rolled back). A running turn refuses its further writes and its
        worker is told to stop; one whose terminal frame was lost gets it
        again, failed, once: lost again (the store refuses every frame), its
        streams end with the error and it leaves ``live`` unended in the store,
        for the next start's restore to close, rather than be sent for ever."""
        if not isinstance(turn, Turn) or turn.dropped or turn.finished:
            return  # a session operation's stand-in: its then hears the error
        again, turn.lost = turn.lost, True
        if not turn.closing:
            turn.take_back(error.message)
            self.cancel_turn(turn, error.reason)
        elif ended and turn.phase is Phase.ENDING and not again:
            turn.want_rollback()
            self._publish_end(turn, "failed", error.reason, error.message)
        elif ended and turn.phase is Phase.ENDING:
            for sub in turn.subscribers:
                sub.push(error)
            turn.subscribers.clear()
            turn.ended(None)
            if self.live.get(turn.rid) is turn:
                del self.live[turn.rid]

    def advance(self, lane: Lane) -> None:
        """An idle lane starts its next turn (or is dropped when it has none)."""
        if lane.running is not None or self.draining:
            return
        nxt = lane.pop_next()
        if nxt is None:
            if self.lanes.get(lane.key) is lane:
                del self.lanes[lane.key]
            return
        lane.running = nxt
        if nxt.accepted:
            dispatch.start(self, nxt)

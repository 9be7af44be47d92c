"""TurnManager: the parent-side owner of turns.

It accepts prompts (ledger first, then the ``accepted`` frame), keeps each
session's lane (running turn, interrupt slot, follow-up slot, FIFO), starts
turns on the session's worker, ends them, and cleans up after cancels and
resets. Beside it: worker_events.py turns what workers say into frames and
transcript rows (and handles dead workers), placement.py puts a prompt for a
busy lane where its delivery mode says, supervision.py restores, drains and
watches, dedup.py answers "seen this request id?", context.py builds
system prompts. Every decision about a lane is made synchronously on the event
loop, so lanes need no locks; the store mirrors them for recovery.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from typing import Any

from .. import errors as E
from ..config import Config
from ..sessions.source import SessionSource
from ..store import Store
from ..store.batcher import Batcher
from ..tools.registry import ToolRegistry
from . import admission, burst, dedup, jobs, placement, supervision, undo, worker_events
from .context import SystemPrompts
from .frames import FrameBus, build_frame
from .lanes import FOLLOW_UP, Lane, Turn
from .memory import budget_per_worker
from .pool import WorkerHandle, WorkerPool


class TurnManager:
    def __init__(self, cfg: Config, store: Store):
        self.cfg, self.store = cfg, store
        self.bus = FrameBus(store, cfg.limits.stream_buffer_frames, cfg.limits.stream_buffer_bytes)
        self.accepts = Batcher(store, jobs.accept_many)  # prompts accepted together commit together
        self.lanes: dict[str, Lane] = {}
        self.recent = dedup.RecentRequests(cfg.dedup_window_s)  # the dedup window's request ids
        self.prompts = SystemPrompts(cfg, store)
        self.live = admission.LiveTurns()  # request id -> every turn not yet ended
        self.tools = ToolRegistry()
        self.pool: WorkerPool | None = None
        self.ready = asyncio.Event()  # set when startup restore is done
        self.accepting = True
        self.draining = False
        self.steer_waits: dict[str, asyncio.Future] = {}
        self._tasks: set[asyncio.Task] = set()
        store.watch_faults(functools.partial(supervision.on_store_fault, self))

    # -- lifecycle ------------------------------------------------------------------

    async def start_workers(self) -> None:
        n = self.cfg.worker_count()
        c = self.cfg.agent_cache
        settings = {"db_path": self.cfg.db_path, "parent_pid": os.getpid(),
                    "debug": logging.getLogger("agent_sidecar").isEnabledFor(logging.DEBUG),
                    "cache": {
            "max_size": c.max_size, "idle_ttl_secs": c.idle_ttl_secs,
            "memory_budget_bytes": budget_per_worker(c.memory_high_mb, n),
            "max_evictions_per_pass": c.max_evictions_per_pass, "protect_recent": c.protect_recent,
            "sweep_interval_s": c.sweep_interval_secs}}
        self.pool = WorkerPool(n, settings, functools.partial(worker_events.on_message, self),
                               functools.partial(worker_events.on_exit, self))
        await self.pool.start()

    def servicers(self, auth) -> list:
        from ..api.prompt_service import PromptService
        from ..api.tool_service import ToolService
        from ..v1 import prompt_service_pb2_grpc, tool_service_pb2_grpc
        prompts = PromptService(self.cfg, self.store, auth, self)
        tools = ToolService(self.cfg, auth, self.tools)
        return [(lambda s: prompt_service_pb2_grpc.add_PromptServiceServicer_to_server(prompts, s), "prompts"),
                (lambda s: tool_service_pb2_grpc.add_ToolServiceServicer_to_server(tools, s), "tools")]

    async def start(self) -> None:
        """Startup restore, then open for prompts (which wait for ``ready``)."""
        from ..recovery import housekeeping
        self.tools.load_entry_points()
        await supervision.restore(self)
        self.ready.set()
        self.spawn(housekeeping.run(self.cfg, self.store, self.busy_keys))
        self.spawn(housekeeping.index_messages(self.store))
        self.spawn(supervision.watchdog(self))

    async def drain(self, timeout: float) -> bool:
        return await supervision.drain(self, timeout)

    async def stop(self) -> None:
        self.accepting = False
        for task in list(self._tasks):
            task.cancel()
        if self.pool is not None:
            await self.pool.stop()

    def spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- what SessionService asks -----------------------------------------------------

    def queue_depth(self, key: str) -> int:
        lane = self.lanes.get(key)
        return lane.depth() if lane else 0

    def busy_keys(self) -> set[str]:
        return {k for k, lane in self.lanes.items() if lane.running is not None}

    async def on_reset(self, key: str) -> None:
        self.store.check_writable()  # refused before its turns are ended
        self._drop_lane(key)

    async def on_suspend(self, key: str) -> None:
        self._drop_lane(key)

    async def on_delete(self, key: str) -> None:
        """Before the delete job: the lane's turns end and their ends commit."""
        self.store.check_writable()
        self._drop_lane(key)
        if self.pool:
            self.pool.slot_for(key).send({"t": "evict", "key": key})
        await supervision.until_ended([t for t in self.live.values() if t.key == key])

    async def rewind(self, key: str, session_id: str, n: int) -> dict[str, Any]:
        """RewindSession: the lane's waiting prompts and running turn count first (undo.py)."""
        self.store.check_writable()  # refused before it drops or cancels anything
        return await undo.rewind(self, key, session_id, n)

    async def rewrite(self, key: str, session_id: str, messages: list) -> None:
        """RewriteTranscript: the running turn is taken back first (undo.py)."""
        self.store.check_writable()
        await undo.rewrite(self, key, session_id, messages)

    async def on_clear_all(self) -> None:
        self.store.check_writable()
        for key in list(self.lanes):
            self._drop_lane(key)
        if self.pool:
            self.pool.broadcast({"t": "clear"})
        await supervision.until_ended(list(self.live.values()))

    def _drop_lane(self, key: str) -> None:
        """The lane's queued prompts end superseded; its running turn is cancelled."""
        lane = self.lanes.get(key)
        if lane is None:
            return
        for turn in lane.waiting():
            lane.remove(turn)
            self.supersede(turn, "")
        if lane.running is not None:
            self.cancel_turn(lane.running, E.CANCELLED)

    # -- accepting prompts --------------------------------------------------------------

    async def submit(self, *, rid: str, key: str, platform: str, profile: str, text: str,
                     delivery: int, source: SessionSource | None, timeout_s: float,
                     payload: dict[str, Any], internal: bool = False) -> Turn | None:
        """Accept a prompt. Returns the new turn with one subscriber attached
        (``turn.subscribers[0]``), or None when the request id is already known
        (the caller replays it)."""
        if not internal and not self.ready.is_set():
            await self.ready.wait()  # startup restore first: never race it
        if not self.accepting:
            raise E.SidecarError(E.UNAVAILABLE, "the sidecar is shutting down")
        if dedup.is_twin(self, rid, key):  # the caller replays the original turn
            return None
        # A known request id replays (reads work); a new one is refused before
        # placement could end or move anything in its lane.
        self.store.check_writable()
        if not internal:
            admission.check(self.live, self.cfg.limits)
        turn = Turn(rid=rid, key=key, platform=platform, profile=profile, text=text,
                    delivery=delivery or FOLLOW_UP, timeout_s=timeout_s, payload=payload)
        turn.next_seq = 2  # seq 1 is the accepted frame, written by the accept job
        # Reserved before any await: a twin call with this request id follows
        # this turn (and hears it if it is refused) instead of placing its own.
        self.live[rid] = turn
        sub = self.bus.subscriber()
        turn.subscribers.append(sub)
        lane = self.lanes.get(key)
        if lane is None:
            lane = self.lanes[key] = Lane(key)
        slot = None
        try:
            if lane.busy():
                slot = await placement.place_busy(self, lane, turn)
                lane = self.lanes.get(key, lane)  # a steer's wait may have seen the lane end and a new one begin
                turn.queued = slot is not None
            else:
                lane.running = turn
        except BaseException as e:
            self._unreserve(self.lanes.get(key, lane), turn, e)
            raise
        if turn.pending_end:  # cancelled while a steer waited: accepted, then ended, never run
            if lane.running is turn:
                lane.running = None
            lane.remove(turn)
            if turn.host is not None and turn in turn.host.steers:
                turn.host.steers.remove(turn)
            turn.host = None
        payload["queue_position"] = placement.position(lane, turn)
        position = lane.next_position()
        # An idle lane: accept and start in one transaction. Not for the startup
        # restore's resume turns: their starts (and system prompts) should not
        # hold up SERVING, so they start after their accept, through the bus.
        start_now = slot is None and lane.running is turn and not internal
        accepted = self.accepts.submit(
            (turn.ledger_fields(), source, self.cfg.dedup_window_s, slot, position, start_now),
            then=functools.partial(self._accepted, turn, lane, internal))
        try:
            await accepted
        except jobs.DuplicateRequest:
            return None
        except asyncio.CancelledError:  # the caller went away; the turn goes on without it
            if sub in turn.subscribers:
                turn.subscribers.remove(sub)
            raise
        return turn

    def _accepted(self, turn: Turn, lane: Lane, internal: bool, result) -> None:
        """The accept job's answer, run as it commits (in commit order with the
        bus's frames, so watchers by key or platform see cursors in order)."""
        if isinstance(result, BaseException):
            self._unreserve(lane, turn, result)
            return
        sid, frame_id, turn.routing_row, started, absorbed = result
        rid, key = turn.rid, turn.key
        turn.sid = sid
        turn.accepted = True
        self.recent.remember(rid, turn.created_at, key)
        if internal:
            turn.subscribers.clear()  # nobody streams it; WatchActivity can
        frame = build_frame(rid, key, sid, 1, turn.created_at, frame_id, "accepted",
                            {"queue_position": turn.payload["queue_position"]})
        self.bus.deliver_committed(turn, frame, "accepted")
        if absorbed is not None:
            burst.committed(self, turn, absorbed)
        if started is not None:  # the accept job started it too
            turn.started = True
            turn.next_seq = 3
            frame = build_frame(rid, key, sid, 2, started["at"], started["frame_id"], "started", {})
            self.bus.deliver_committed(turn, frame, "started")
            if turn.pending_end:  # ended (cancelled, superseded) before the commit came back
                self._publish_end(turn, *turn.pending_end)
            else:
                self._dispatch(turn, started, *self.prompts.for_turn(turn))
        elif turn.pending_end:
            self._publish_end(turn, *turn.pending_end)
        elif turn.host is None and lane.running is turn and not turn.started:
            self._start(turn)

    def _unreserve(self, lane: Lane, turn: Turn, error: BaseException) -> None:
        """A prompt refused before its accept committed leaves no trace; a twin
        call following it gets the same answer (see PromptService._follow)."""
        if self.live.get(turn.rid) is turn:
            del self.live[turn.rid]
        if lane.running is turn:
            lane.running = None
        lane.remove(turn)
        if turn.host is not None and turn in turn.host.steers:
            turn.host.steers.remove(turn)
        burst.reinstate(self, turn)
        if not isinstance(error, (E.SidecarError, jobs.DuplicateRequest)):
            error = E.SidecarError(E.UNAVAILABLE, "the prompt with this request id was not accepted; retry")
        for sub in turn.subscribers:
            sub.push(error)
        turn.subscribers.clear()
        self._advance(lane)

    # -- running turns --------------------------------------------------------------------

    def _start(self, turn: Turn) -> None:
        """A turn that waited in its lane starts (one accepted on an idle lane
        was started by its accept job)."""
        turn.started = True
        row = turn.routing_row if not turn.queued else None
        if row is None:  # it waited: the lane may have moved to another incarnation
            row = self.prompts.routing_row(turn.key)
        if row is None:
            self.end(turn, "failed", E.SESSION_NOT_FOUND, f"session {turn.key} no longer exists")
            return
        turn.sid = row[0]
        turn.routing_row = row
        profile, system_prompt = self.prompts.for_turn(turn)
        start = (jobs.start, (turn.rid, turn.key, turn.sid, turn.user_texts(), turn.queued,
                              "resume" in turn.payload))  # an auto-resume note is synthetic
        self.bus.publish(turn, "started", write=start,
                         then=lambda res: self._dispatch(turn, res, profile, system_prompt))

    def _dispatch(self, turn: Turn, res, profile, system_prompt: str) -> None:
        if isinstance(res, Exception):
            self.end(turn, "failed", E.UNAVAILABLE, f"could not start the turn: {res}")
            return
        if turn.cancel_reason:
            self.end(turn, "failed", turn.cancel_reason, "the turn was cancelled")
            return
        h = self.pool.slot_for(turn.key)
        turn.worker = h
        turn.worker_gen = h.generation if h.ready.is_set() else -1
        msg = {"t": "run", "rid": turn.rid, "key": turn.key, "sid": turn.sid, "rev": res["rev"],
               "base_seq": res["base_seq"], "texts": turn.user_texts(), "profile": profile.wire,
               "system_prompt": system_prompt, "tools": self.tools.specs_for(profile.tools, turn.platform),
               "timeout_s": turn.timeout_s}
        if h.ready.is_set():
            h.send(msg)
        else:
            self.spawn(self._send_when_ready(h, turn, msg))
        turn.deadline = asyncio.get_running_loop().time() + turn.timeout_s + supervision.WATCHDOG_GRACE_S

    async def _send_when_ready(self, h: WorkerHandle, turn: Turn, msg: dict) -> None:
        await h.ready.wait()
        if turn.finished or turn.terminal_pending:
            return
        if turn.cancel_reason:  # cancelled while it waited for the worker
            self.end(turn, "failed", turn.cancel_reason, "the turn was cancelled")
            return
        turn.worker_gen = h.generation
        h.send(msg)

    def cancel_turn(self, turn: Turn, reason: str) -> bool:
        if turn.finished or turn.terminal_pending:
            return False
        if not turn.started:
            lane = self.lanes.get(turn.key)
            if lane is not None:
                if lane.running is turn:
                    lane.running = None
                lane.remove(turn)
            if turn.host is not None:  # a steer: it no longer ends with its host
                if turn in turn.host.steers:
                    turn.host.steers.remove(turn)
                turn.host = None
            self._publish_end(turn, "failed", reason, "cancelled before it ran")
            if lane is not None:
                self._advance(lane)
            return True
        turn.cancel_reason = reason
        if turn.worker is not None:
            turn.worker.send({"t": "cancel", "rid": turn.rid, "reason": reason})
        return True

    def supersede(self, turn: Turn, by_rid: str) -> None:
        if not turn.finished and not turn.terminal_pending:
            self._publish_end(turn, "superseded", "", by_rid)

    # -- ending turns ----------------------------------------------------------------------

    def end(self, turn: Turn, status: str, reason: str, text: str) -> None:
        """A started turn is over: persist the end, free the lane, start the next."""
        lane = self.lanes.get(turn.key)
        if lane is not None and lane.running is turn:
            lane.running = None
        self._publish_end(turn, status, reason, text)
        for st in turn.steers:
            self._publish_end(st, status, reason, text)
        if lane is not None:
            self._advance(lane)

    def _publish_end(self, turn: Turn, status: str, reason: str, text: str) -> None:
        if turn.finished or turn.terminal_pending:  # a turn ends once
            return
        if not turn.accepted:  # its accepted frame is not committed yet: end after it
            turn.pending_end = (status, reason, text)
            return
        turn.pending_end = None
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
        if turn.started and turn.host is None:
            # last_seq: the seq this terminal frame is about to get
            write = (jobs.finish, (turn.rid, turn.key, turn.sid, status, reason, turn.next_seq,
                                   turn.rollback, lane_idle, state))
        else:
            write = (jobs.close_unstarted, (turn.rid, status, reason, turn.next_seq))
        self.bus.publish(turn, kind, body, write=write,
                         then=lambda _: self.live.pop(turn.rid, None) if self.live.get(turn.rid) is turn else None)

    def _advance(self, lane: Lane) -> None:
        if lane.running is not None or self.draining:
            return
        nxt = lane.pop_next()
        if nxt is None:
            if self.lanes.get(lane.key) is lane:
                del self.lanes[lane.key]
            return
        lane.running = nxt
        if nxt.accepted:
            self._start(nxt)

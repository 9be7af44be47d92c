"""A worker process: runs agent turns for the sessions that hash to it.

Started as a fresh interpreter (children.spawn; never fork: grpcio is not
fork-safe), eagerly, before the gRPC server exists. It imports no grpc — check
``grpc_loaded`` in its hello message — which keeps it at about half the memory.

One uvloop loop serves many sessions' turns at once; the parent guarantees one
turn per session at a time. The worker owns the agent loop and the agent cache;
the parent owns the store writes, so every frame and message goes back over the
pipe and the parent acknowledges messages once they are committed.

The messages both ways are declared in wire.py.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

import orjson

from .. import errors as E
from ..children import Channel, open_channel, tune_gc
from ..logs import bind_turn, forward
from ..models.registry import load_backend
from . import wire
from .agent import Agent, ToolRefused, TurnFailed, TurnSpec, paired_calls, run_turn
from .cache import AgentCache
from .model_trace import TracedBackend

# Under load a worker writes to the parent at most this often (children.Channel):
# every turn's frames of that spell in one write, read by the parent's loop at
# once, and persisted in one frame flush. The parent flushes what one wake-up
# brought, so this pace bounds the store's commits for streamed frames too; a
# commit's fsync and its pages cost the writer more CPU than the rows in it,
# and each wake-up of the parent costs its loop. What it costs: under load a
# frame reaches the parent up to this much later, a chat client sees text at
# most that much later than the model made it. A message sent WRITE_QUIET_S or
# more after the last write leaves at once: one turn at a time writes every few
# milliseconds, and pacing those would only delay each turn. What a turn waits
# for (a tool call, a steer's answer) is never paced.
WRITE_PACE_S = 0.010
WRITE_QUIET_S = 0.001
# A turn's stop time (wire.Run ``stop_at``) passed: the worker looks at its
# pipe once more, this long later, before it stops the turn by itself.
LOOK_AGAIN_S = 0.010

# Its lines go to the parent, which logs them as its own (logs.forward).
log = logging.getLogger("agent_sidecar.turns")


class _TurnIO:
    """What one running turn sees of the outside world.

    Text deltas are coalesced (``coalesce_s`` > 0): a delta that finds no
    window open goes out at once and opens one; the deltas that arrive while
    it is open go out together, as one ``text_delta`` whose text is theirs
    concatenated, when it closes (and a new window opens behind them). So no
    delta waits longer than one window, the first of a turn not at all, and
    a model streaming faster than the window sends one frame per window.
    Anything else the turn sends (another frame, a transcript message, a tool
    call, its end) sends the waiting text first, so the order is the model's."""

    def __init__(self, worker: Worker, rid: str, agent: Agent, coalesce_s: float = 0.0):
        self.w, self.rid, self.agent = worker, rid, agent
        self.steered: list[str] = []
        self.steering_open = True
        self.tool_waits: dict[str, asyncio.Future] = {}
        self.coalesce_s = coalesce_s
        self._text: list[str] = []  # deltas waiting for their window to close
        self._window: asyncio.TimerHandle | None = None
        self.model_calls: list[tuple[float, bool]] = []  # for the turn's report (wire.TurnReport)

    def frame(self, kind: str, body: dict[str, Any]) -> None:
        if kind == "text_delta" and self.coalesce_s > 0:
            if self._window is not None:
                self._text.append(body["text"])
                return
            self._window = asyncio.get_running_loop().call_later(self.coalesce_s, self._window_closed)
        else:
            self.flush_text()
        self.w.send(wire.frame_msg(self.rid, kind, body))

    def _window_closed(self) -> None:
        self._window = None
        if self._text:
            text, self._text = "".join(self._text), []
            self._window = asyncio.get_running_loop().call_later(self.coalesce_s, self._window_closed)
            self.w.send(wire.frame_msg(self.rid, "text_delta", {"text": text}))

    def flush_text(self) -> None:
        """Send the text waiting in the window now, and close the window."""
        if self._window is not None:
            self._window.cancel()
            self._window = None
        if self._text:
            text, self._text = "".join(self._text), []
            self.w.send(wire.frame_msg(self.rid, "text_delta", {"text": text}))

    def message(self, msg: dict[str, Any]) -> None:
        self.flush_text()
        self.w.send(wire.message(self.rid, msg))
        self.agent.unpersisted += 1  # once sent: a message that could not be is not waited for

    async def invoke_tool(self, call_id: str, name: str, arguments_json: str) -> tuple[bool, str]:
        fut = asyncio.get_running_loop().create_future()
        self.tool_waits[call_id] = fut
        self.flush_text()
        self.w.send(wire.tool_call(self.rid, call_id, name, arguments_json), soon=True)
        try:
            ok, result, refused = await fut
        finally:
            self.tool_waits.pop(call_id, None)
        if refused:
            raise ToolRefused(refused, result)
        return ok, result

    def take_steered(self) -> list[str]:
        out, self.steered = self.steered, []
        return out

    def close_steering(self) -> None:
        self.steering_open = False

    def model_called(self, seconds: float, ok: bool) -> None:
        self.model_calls.append((seconds, ok))

    def tool_refused(self, call_id: str, name: str, reason: str) -> None:
        self.flush_text()
        self.w.send(wire.tool_refused(self.rid, call_id, name, reason))


class Worker:
    def __init__(self, fileno: int, index: int, settings: dict[str, Any]):
        self.fileno, self.index, self.settings = fileno, index, settings
        # The parent's levels: a line below them would cost the parent's loop for nothing.
        self.logs = forward(*settings.get("log_levels", (logging.INFO, logging.WARNING)))
        self.coalesce_s = float(settings.get("coalesce_ms", 0)) / 1000
        self.max_reply_chars = int(settings["max_reply_chars"])  # limits.max_reply_chars, always given
        c = settings.get("cache", {})
        self.cache = AgentCache(max_size=c.get("max_size", 128), idle_ttl=c.get("idle_ttl_secs", 3600),
                                memory_budget_bytes=c.get("memory_budget_bytes", 0),
                                max_evictions_per_pass=c.get("max_evictions_per_pass", 16),
                                protect_recent=c.get("protect_recent", 8))
        self.sweep_interval = float(c.get("sweep_interval_s", 30))
        self.turns: dict[str, tuple[asyncio.Task, _TurnIO | None]] = {}
        self.early_steers: dict[str, list[str]] = {}  # steers taken in before their turn's task started
        self.cancel_reasons: dict[str, str] = {}
        self.stop_timers: dict[str, asyncio.TimerHandle] = {}  # a cluster node's turns: when they stop by themselves
        self.backends: dict[str, tuple[bytes, Any]] = {}
        self._transcripts = None  # the store's TranscriptReader, opened on the first miss
        self.channel: Channel | None = None

    # -- plumbing -------------------------------------------------------------

    def send(self, msg: Mapping[str, Any], soon: bool = False) -> None:
        """To the parent, paced; ``soon``: something waits for it, so at the
        end of this loop iteration (children.Channel)."""
        assert self.channel is not None  # opened first thing in run()
        self.channel.send(msg, soon=soon)

    def transcripts(self):
        """The store's reader for this process (store/interface.py
        TranscriptReader), from the recipe the parent sent."""
        if self._transcripts is None:
            opener, args = self.settings["reader"]
            module, _, fn = opener.partition(":")
            self._transcripts = getattr(importlib.import_module(module), fn)(*args)
        return self._transcripts

    def backend(self, profile: dict[str, Any]):
        sig = orjson.dumps([profile["model"], profile.get("model_options", {})],
                           option=orjson.OPT_SORT_KEYS)
        cached = self.backends.get(profile["name"])
        if cached and cached[0] == sig:
            return cached[1]
        b = load_backend(profile["model"], dict(profile.get("model_options", {})))
        self.backends[profile["name"]] = (sig, b)
        return b

    async def run(self) -> None:
        done = asyncio.get_running_loop().create_future()

        def on_message(msg: dict) -> None:
            if msg["type"] == "stop":
                if not done.done():
                    done.set_result(None)
            else:
                self.dispatch(msg)

        def on_lost() -> None:  # the parent is gone: so are we
            if not done.done():
                done.set_result(None)

        self.channel = await open_channel(self.fileno, on_message, on_lost, pace_s=WRITE_PACE_S,
                                          quiet_s=WRITE_QUIET_S)
        self.send(wire.hello(os.getpid(), self.index,
                             any(m == "grpc" or m.startswith("grpc.") for m in sys.modules)))
        self.logs.open(self.send)  # after the hello: the parent takes the first message for it
        tune_gc()
        sweeper = asyncio.get_running_loop().create_task(self._housekeeping())
        try:
            await done
        finally:
            sweeper.cancel()
            self.channel.close()

    def dispatch(self, msg: Any) -> None:  # a decoded message: its "type" names its wire TypedDict
        match msg["type"]:
            case "run":
                rid = msg["request_id"]
                task = asyncio.get_running_loop().create_task(self._turn(msg))
                task.add_done_callback(functools.partial(self._never_ran, rid))
                self.turns[rid] = (task, None)
                if "stop_at" in msg:
                    self._stop_at(rid, msg["stop_at"])
            case "cancel":
                self._cancel(msg["request_id"], msg["reason"])
            case "trust":
                for rid, at in msg["stop_at"].items():
                    if rid in self.turns:
                        self._stop_at(rid, at)
            case "steer":
                self._steer(msg)
            case "tool_result":
                entry = self.turns.get(msg["request_id"])
                fut = entry[1].tool_waits.get(msg["call_id"]) if entry and entry[1] else None
                if fut is not None and not fut.done():
                    fut.set_result((bool(msg["ok"]), msg["result"], msg.get("refused", "")))
            case "ack":
                agent = self.cache.peek(msg["session_key"])
                if agent is not None:
                    agent.unpersisted -= msg["n"]
            case "evict":
                self.cache.remove(msg["session_key"])
            case "clear":
                self.cache.clear()

    def _cancel(self, rid: str, reason: str) -> None:
        entry = self.turns.get(rid)
        if entry:
            self.cancel_reasons[rid] = reason
            entry[0].cancel()

    def _stop_at(self, rid: str, at: float) -> None:
        """A cluster node's turn stops by itself at ``at`` (time.monotonic(),
        the host's one clock), LANE_MOVED, unless a renewal of its lane's
        lease moves it on (``trust``). Its parent stops it first while it runs
        (that deadline is later than the parent's trust in the lease, earlier
        than the lease's end in the database); a parent that stalls (SIGSTOP,
        a long pause) cannot, and this keeps its model and tool calls from
        going on beside the lane's next holder's."""
        old = self.stop_timers.pop(rid, None)
        if old is not None:
            old.cancel()
        self.stop_timers[rid] = asyncio.get_running_loop().call_later(
            max(0.0, at - time.monotonic()), self._lapsed, rid)

    def _lapsed(self, rid: str, looked: bool = False) -> None:
        """Its stop time passed. Once this loop has read its pipe since (a
        renewal's ``trust`` may wait there unread: this worker stalled, or a
        blocking backend held its loop, not its parent), it stops the turn."""
        self.stop_timers.pop(rid, None)
        if rid not in self.turns or rid in self.cancel_reasons:
            return
        if not looked:  # the pipe is read before a timer set now is due
            self.stop_timers[rid] = asyncio.get_running_loop().call_later(LOOK_AGAIN_S, self._lapsed, rid, True)
            return
        log.warning("turn stopped: its lane's lease is no longer trusted and the sidecar did not stop it",
                    extra={"request_id": rid})
        self._cancel(rid, E.LANE_MOVED)

    def _steer(self, msg: wire.Steer) -> None:
        """Take a steer's text into its running turn, or refuse it; answer
        the parent either way. Past ``expires`` the parent may have given up
        waiting and placed the prompt as a follow-up: taking it then would
        run its text twice. A turn whose run came in the same read has no
        io yet (its task has not started): the text waits in
        ``early_steers`` for it, and its first model call sees it."""
        rid = msg["request_id"]
        entry = self.turns.get(rid)
        ok = entry is not None and time.monotonic() < msg["expires"]
        if entry is not None and ok:
            io = entry[1]
            if io is not None:
                ok = io.steering_open
                if ok:
                    io.steered.append(msg["text"])
            elif entry[0].done() or rid in self.cancel_reasons:
                ok = False
            else:
                self.early_steers.setdefault(rid, []).append(msg["text"])
        self.send(wire.steered(rid, msg["steer_id"], ok), soon=True)

    def _never_ran(self, rid: str, task: asyncio.Task) -> None:
        """A turn's task is done: its stop timer goes. A cancel that arrived
        with its run (same read) cancels the task before its coroutine
        starts, so _turn never reports: report here."""
        timer = self.stop_timers.pop(rid, None)
        if timer is not None:
            timer.cancel()
        if task.cancelled() and rid in self.turns:
            self.turns.pop(rid, None)
            self.early_steers.pop(rid, None)
            reason = self.cancel_reasons.pop(rid, E.CANCELLED)
            self.send(wire.failed(rid, reason, "the turn was cancelled before it started"))

    # -- one turn ---------------------------------------------------------------

    def _agent_for(self, m: wire.Run) -> tuple[Agent, bool, int]:
        """The session's agent, whether it was warm, and how many agents the
        cache evicted to make room for it."""
        key = m["session_key"]
        agent = self.cache.get(key)
        texts = m["texts"]  # the turn's user messages: one, or a burst's (seqs base_seq on)
        if (agent is not None and agent.session_id == m["session_id"] and agent.rev == m["rev"]
                and agent.next_seq == m["base_seq"] and agent.unpersisted <= 0):
            for text in texts:
                agent.add({"role": "user", "content": text})
            return agent, True, 0
        # Miss (or the store moved on): rebuild from the committed transcript,
        # which already holds this turn's user messages.
        msgs = paired_calls(self.transcripts().load_for_model(m["session_id"]))
        if len(msgs) > 1:
            log.debug("agent rebuilt from store", extra={"key": key, "messages": len(msgs)})
        agent = Agent(key, m["session_id"], m["rev"], m["base_seq"] + len(texts), msgs,
                      approx_bytes=sum(len(x.get("content") or "") + 64 for x in msgs))
        evicted = self.cache.put(agent)
        if evicted:
            log.debug("agents evicted", extra={"why": "lru", "count": len(evicted), "keys": evicted[:16]})
        return agent, False, len(evicted)

    async def _turn(self, m: wire.Run) -> None:
        rid = m["request_id"]
        profile = m["profile"]
        agent = io = None
        hit, evicted = False, 0
        bind_turn(rid, m["session_key"])  # this task's log lines are the turn's
        try:
            agent, hit, evicted = self._agent_for(m)
            io = _TurnIO(self, rid, agent, self.coalesce_s)
            io.steered = self.early_steers.pop(rid, [])  # taken in before this task started
            self.turns[rid] = (self.turns[rid][0], io)
            agent.in_turn = True
            spec = TurnSpec(system_prompt=m["system_prompt"], tools=m["tools"],
                            scopes=profile.get("tools", []),
                            max_iterations=profile.get("max_iterations", 25), request_id=rid,
                            max_reply_chars=self.max_reply_chars)
            backend = self.backend(profile)
            if "traceparent" in m:
                backend = TracedBackend(backend, m["traceparent"], rid, profile, self.send)
            async with asyncio.timeout(m["timeout_s"]):  # in this task: no second one to wait for
                final = await run_turn(agent, backend, spec, io)
            done = wire.completed(rid, final)
        except TurnFailed as e:
            done = wire.failed(rid, e.reason, e.message)
        except TimeoutError:
            done = wire.failed(rid, E.AGENT_TIMEOUT, f"the turn exceeded its timeout ({m['timeout_s']:.1f} s)")
        except asyncio.CancelledError:
            done = wire.failed(rid, self.cancel_reasons.pop(rid, E.CANCELLED), "the turn was cancelled")
        except E.SidecarError as e:  # the store could not be read (STORE_UNAVAILABLE): not the model's fault
            done = wire.failed(rid, e.reason, e.message)
        except Exception as e:  # a backend bug must fail the turn, not the worker
            done = wire.failed(rid, E.LLM_API_FAILURE, f"{type(e).__name__}: {e}")
        finally:
            if io is not None:
                io.flush_text()  # what the model said goes out before the turn's end
            if agent is not None:
                agent.in_turn = False
                agent.last_used = self.cache.clock()
            self.turns.pop(rid, None)
            self.early_steers.pop(rid, None)
        if agent is not None:
            done["report"] = wire.turn_report(profile["model"], io.model_calls if io else [], hit, evicted)
        self.send(done)

    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_interval)
            for why, keys in (("ttl", self.cache.sweep_idle()), ("pressure", self.cache.sweep_pressure())):
                if keys:
                    self.send(wire.evicted(why, len(keys), keys[:16]))


def worker_main(conn, index: int, settings: dict[str, Any]) -> None:
    """The spawn target (children.spawn). ``conn`` is our end of the pipe (child.Pipe)."""
    import uvloop

    from ..child import become_child
    become_child(f"sidecar-work-{index}", settings["parent_pid"])
    worker = Worker(conn.fileno(), index, settings)
    uvloop.run(worker.run())

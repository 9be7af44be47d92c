"""What the workers say, turned into the turn's persisted frames, transcript
rows and end; and what a worker's death means for the turns it was running.

Functions over a TurnManager (like supervision.py), called on the event loop
for each message a worker sends (wire.py declares the messages).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import orjson

from .. import errors as E
from .. import logs
from ..logs import TURN
from ..obs import tracing
from ..sessions import lifecycle as life
from ..tools.scope import in_scope
from . import jobs, placement, wire
from .lanes import Turn
from .pool import WorkerHandle

if TYPE_CHECKING:
    from .manager import TurnManager

log = logging.getLogger("agent_sidecar.turns")


def on_message(m: TurnManager, h: WorkerHandle, msg: Any) -> None:  # decoded: "type" names its wire TypedDict
    if msg["type"] == "frame":  # most of what workers say: a running turn's streamed frames
        turn = m.live.get(msg["request_id"])
        if turn is not None and not turn.closing and not turn.taken_back:
            _frame(m, turn, msg)  # not bound to the turn's log context: its one warning names the turn
            return
    match msg["type"]:
        case "log":  # a line the worker logged, at its own level (logs.forward)
            logs.relog(msg, worker=h.index)
            return
        case "steered":
            wait = m.steer_waits.get(msg["steer_id"])
            if wait is not None and not wait[0].done():
                wait[0].set_result(msg["ok"])
            return
        case "evicted":
            m.stats.evictions.add(msg["why"], msg["count"])
            log.info("agents evicted", extra={"worker": h.index, "why": msg["why"], "count": msg["count"],
                                              "keys": msg["keys"]})
            return
        case "tool_refused":
            _tool_refused(m, msg)
            return
        case "done" if "report" in msg:  # counted even when the turn's end came first
            m.stats.worker_report(msg["report"])
    turn = m.live.get(msg.get("request_id", ""))
    if turn is None or turn.closing:
        return
    bound = TURN.set((turn.rid, turn.key))  # what this message causes logs as the turn's
    try:
        _on_turn_message(m, h, turn, msg)
    finally:
        TURN.reset(bound)


def _on_turn_message(m: TurnManager, h: WorkerHandle, turn: Turn, msg: Any) -> None:
    if turn.taken_back and msg["type"] != "done" and _refused(h, turn, msg):
        return
    match msg["type"]:
        case "frame":
            _frame(m, turn, msg)
        case "message":
            _message(m, h, turn, msg["message"])
        case "tool_call" if m.leases is not None and not m.leases.trusted(turn.key):
            # Its lease is no longer trusted (this node stalled; its sweeper
            # has not run yet): the lane stops here now, the call unmade.
            m.leases.distrusted([turn.key])
        case "tool_call":
            m.spawn(_run_tool(m, h, turn, msg))  # the task inherits the turn's log context
        case "done":
            _done(m, turn, msg)
        case "model_call" if tracing.ACTIVE is not None:
            tracing.ACTIVE.model_call(turn, msg)


def _frame(m: TurnManager, turn: Turn, msg: wire.Frame) -> None:
    if turn.next_seq >= m.cfg.limits.max_frames_per_turn:  # one seq left: the terminal frame
        if not turn.cancel_reason:
            log.warning("turn reached max_frames_per_turn; cancelling it",
                        extra={"request_id": turn.rid, "session_key": turn.key})
            m.cancel_turn(turn, E.RESOURCE_EXHAUSTED)
        return
    kind, body = msg["kind"], msg["body"]
    if kind == "text_delta" and not turn.first_token_seen:
        m.stats.first_delta(turn)
    if kind == "usage":
        for k, v in body.items():
            turn.usage[k] = turn.usage.get(k, 0) + v
        m.bus.publish(turn, kind, body, write=(jobs.record_usage, (turn.key, turn.sid, body)))
    else:
        m.bus.publish(turn, kind, body)


def _message(m: TurnManager, h: WorkerHandle, turn: Turn, message: dict) -> None:
    for call in message.get("tool_calls") or ():
        turn.open_tool_calls[call["id"]] = call["function"]["name"]
    if message["role"] == "tool":
        turn.open_tool_calls.pop(message.get("tool_call_id", ""), None)
    ack = wire.ack(turn.key)
    # The ack tells the worker this message reached the store: until then
    # its agent may not be evicted (seed 001 §11) nor reused as is.
    m.bus.append_message(turn, message, then=lambda _: h.send(ack))


def _done(m: TurnManager, turn: Turn, msg: wire.Done) -> None:
    if not msg["ok"] and msg.get("reason") == E.LANE_MOVED and m.leases is not None:
        # Its worker stopped it by itself (wire.Run stop_at): this node, stalled,
        # did not in time. The lane stops here, its end written by its next holder.
        m.leases.distrusted([turn.key])
    elif turn.taken_back:  # even if it finished first: its reply was refused
        m.end(turn, "failed", turn.cancel_reason or E.CANCELLED, turn.taken_back)
    elif turn.cancel_reason == E.RESOURCE_EXHAUSTED:  # frames were dropped, even if it then finished
        m.end(turn, "failed", E.RESOURCE_EXHAUSTED,
              f"the turn reached limits.max_frames_per_turn ({m.cfg.limits.max_frames_per_turn} frames)")
    elif msg["ok"] and turn.cancel_reason == E.CANCELLED:
        # A cancel the caller asked for (Cancel, INTERRUPT, ROLLBACK, a reset or
        # suspend) that crossed the worker's end on the pipe: the caller was
        # told the turn is cancelled (Cancel answered true), and a ROLLBACK
        # hides what it wrote, so it ends as cancelled, never ``completed``
        # with a reply the transcript does not keep.
        m.end(turn, "failed", E.CANCELLED, "the turn was cancelled")
    elif msg["ok"]:
        m.end(turn, "completed", "", msg.get("final_text", ""))
    else:
        m.end(turn, "failed", msg["reason"], msg.get("message", ""))


def _refused(h: WorkerHandle, turn: Turn, msg: dict) -> bool:
    """A turn taken back by RewindSession / RewriteTranscript (turns/undo.py)
    writes nothing more: its frames and transcript messages are dropped (a
    message is still acknowledged, so the worker's agent is not held as
    unpersisted; its rev moved on, so the next turn rebuilds it) and its tool
    calls are answered with an error unrun. Usage frames pass: the tokens were
    spent. Returns whether ``msg`` was refused."""
    match msg["type"]:
        case "frame" if msg["kind"] == "usage":
            return False
        case "message":
            h.send(wire.ack(turn.key))
        case "tool_call":
            h.send(wire.tool_result(turn.rid, msg["call_id"], False,
                                    orjson.dumps({"error": "the turn was cancelled"}).decode()))
    return True


def _tool_refused(m: TurnManager, msg: wire.ToolRefused) -> None:
    """A call the worker refused itself (outside the profile's tools): an
    error of its namespace in the metrics (counted even when the turn's end
    came first), and, as for a call this side refuses, its ``tool call`` line
    and, on a traced turn, its ``execute_tool`` span, an error naming the
    reason."""
    m.stats.tool_refused(m.tools.namespace_of(msg["name"]))
    turn = m.live.get(msg["request_id"])
    fields = {"tool": msg["name"], "call_id": msg["call_id"], "ok": False, "refused": msg["reason"],
              "duration_ms": 0.0, "request_id": msg["request_id"]}
    if turn is not None:
        fields["session_key"] = turn.key
        if tracing.ACTIVE is not None:
            span, _ = tracing.ACTIVE.tool_begin(turn, msg["name"], msg["call_id"])
            tracing.ACTIVE.tool_end(span, False, msg["reason"])
    log.debug("tool call", extra=fields)


async def _run_tool(m: TurnManager, h: WorkerHandle, turn: Turn, msg: wire.ToolCall) -> None:
    """One tool call, answered to the worker, whatever happens (the worker's
    call has no timeout of its own). A call the registry refuses (the host
    may not serve this session's platform), or outside the profile's tools
    (the worker checks that too; this side does not take its word), is
    answered with ``refused``: the agent loop then ends the turn with that reason."""
    namespace = m.tools.namespace_of(msg["name"])
    meta = {"session_key": turn.key, "session_id": turn.sid, "request_id": turn.rid}
    span = None
    started, ok, refused = time.perf_counter(), False, ""
    try:
        if tracing.ACTIVE is not None:  # the host's span of the call is a child of ours
            span, meta["trace_context"] = tracing.ACTIVE.tool_begin(turn, msg["name"], msg["call_id"])
        profile = m.cfg.profile(turn.profile)
        if not in_scope(msg["name"], profile.tools if profile is not None else []):
            raise E.SidecarError(E.TOOL_SCOPE_VIOLATION, f"{msg['name']!r} is outside the profile's tools")
        ok, result = await m.tools.invoke(msg["name"], msg["arguments"], meta, platform=turn.platform,
                                          timeout_s=profile.tool_timeout_s if profile is not None else None)
        reply = wire.tool_result(turn.rid, msg["call_id"], ok, result)
    except E.SidecarError as e:
        ok, refused = False, e.reason
        reply = wire.tool_result(turn.rid, msg["call_id"], False,
                                 orjson.dumps({"error": e.message, "reason": e.reason}).decode(),
                                 refused=e.reason)
    except Exception as e:  # a bug: the model is told, the turn goes on
        log.exception("tool call failed", extra={"tool": msg["name"], "call_id": msg["call_id"]})
        reply = wire.tool_result(turn.rid, msg["call_id"], False,
                                 orjson.dumps({"error": f"the sidecar failed: {type(e).__name__}"}).decode())
    finally:
        if span is not None:
            tracing.ACTIVE.tool_end(span, ok, refused)
    elapsed = time.perf_counter() - started
    m.stats.tool_call(namespace, elapsed, ok)
    log.debug("tool call", extra={"tool": msg["name"], "call_id": msg["call_id"], "ok": ok,
                                  "refused": refused, "duration_ms": round(elapsed * 1e3, 3)})
    h.send(reply)


def on_exit(m: TurnManager, h: WorkerHandle) -> None:
    """The worker died: each turn it was running fails WORKER_CRASHED, its open
    tool calls are closed in the transcript, and its lane is marked for resume;
    a turn cancelled meanwhile (its worker stopped answering) ends as its
    cancel said, and is not resumed. A steer still waiting for its answer is
    told no: it falls back to FOLLOW_UP (placement.steer)."""
    for turn in list(m.live.values()):
        if turn.worker is h and turn.worker_gen == h.generation and turn.in_flight:
            _close_dangling_tool_calls(m, turn, "the worker running this turn died")
            if turn.cancel_reason:
                m.end(turn, "failed", turn.cancel_reason,
                      "the turn was cancelled; its worker did not stop it and was replaced")
                continue
            m.bus.write(turn, life.mark_resume_pending, turn.key, "worker_crashed")
            m.end(turn, "failed", E.WORKER_CRASHED, "the worker process running the turn died")
    placement.steers_answered_no(m, h)  # a dead worker takes no steer: they fall back now


def _close_dangling_tool_calls(m: TurnManager, turn: Turn, why: str) -> None:
    for call_id, name in list(turn.open_tool_calls.items()):
        message = {"role": "tool", "tool_call_id": call_id, "name": name,
                   "content": orjson.dumps({"error": why}).decode()}
        m.bus.append_message(turn, message)
    turn.open_tool_calls.clear()

"""Startup restore (seed 001 §7, DECISIONS.md "Recovery"): one writer job that
makes the store consistent again after whatever ended the last run.

1. The clean-shutdown marker present → consume it, skip the suspension pass;
   absent → ``suspend_recently_active(120 s)``.
2. Stuck loops: each lane that was in flight when the last run ended counts one
   more consecutive restart; at 3 it is suspended (and not resumed).
3. Turns that were running are closed in the ledger as failed
   (``restart_interrupted``) with a terminal frame, and their dangling tool
   calls get synthetic error results so the next model call is valid.
4. What was queued is returned, in order, for the manager to run exactly once.
5. Lanes whose turn was really interrupted, fresh enough, are returned for a
   synthesized continue turn (``recovery.auto_resume``, see resume_turns).

Every step reads through an index (partial indexes on running lanes, open
ledger rows, pending resumes): restart time does not grow with history.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..sessions import lifecycle as life
from ..sessions import transcripts as tx
from ..turns.jobs import INSERT_FRAME, close_unstarted, last_frame_seq
from ..turns.lanes import STEER

MARKER = ".clean_shutdown"
RECENT_WINDOW_S = 120
STUCK_LOOP_RESTARTS = 3
AUTO_RESUME_REASONS = frozenset({"restart_timeout", "shutdown_timeout", "restart_interrupted",
                                 "worker_crashed"})
# Marks that by themselves prove a turn was cut off: the drain timed out on it,
# or its worker died under it. "restart_interrupted" does not: the crash pass
# gives it to every lane merely active in the last RECENT_WINDOW_S as well.
CUT_OFF_REASONS = frozenset({"restart_timeout", "shutdown_timeout", "worker_crashed"})
INTERRUPTED = "restart_interrupted"


@dataclass
class RestorePlan:
    clean: bool
    marked: list[str] = field(default_factory=list)
    suspended: list[str] = field(default_factory=list)
    closed_turns: int = 0
    queued: list[dict[str, Any]] = field(default_factory=list)
    resume: list[dict[str, Any]] = field(default_factory=list)


def consume_marker(data_dir: str) -> bool:
    path = os.path.join(data_dir, MARKER)
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def write_marker(data_dir: str) -> None:
    path = os.path.join(data_dir, MARKER)
    with open(path, "w") as f:
        f.write(f"{time.time()}\n")
        f.flush()
        os.fsync(f.fileno())


# A turn's transcript rows (?1 is the request id), from the first seq its ledger
# row records on, through UNIQUE (session_id, seq): no index on the request id.
TURN_MESSAGES = ("SELECT m.session_id, m.role, m.extra FROM prompts p JOIN messages m"
                 " ON m.session_id = p.session_id AND m.seq >= coalesce(p.first_seq, 0)"
                 " WHERE p.request_id = ?1 AND m.request_id = ?1 ORDER BY m.seq")


def dangling_tool_calls(conn, request_id: str) -> list[tuple[str, str, str]]:
    """(session_id, call_id, name) of tool calls a turn made without a result."""
    calls: dict[str, tuple[str, str]] = {}
    for sid, role, extra in conn.execute(TURN_MESSAGES, (request_id,)):
        if not extra:
            continue
        d = orjson.loads(extra)
        if role == "assistant" and d.get("tool_calls_json"):
            for c in orjson.loads(d["tool_calls_json"]):
                calls[c["id"]] = (sid, c.get("function", {}).get("name", ""))
        elif role == "tool":
            calls.pop(d.get("tool_call_id", ""), None)
    return [(sid, cid, name) for cid, (sid, name) in calls.items()]


def close_interrupted_turn(conn, request_id: str, key: str, sid: str, platform: str,
                           reason: str, message: str) -> None:
    """Fail one turn that will never finish: synthetic tool results, a terminal
    frame after its last one, the ledger row closed."""
    # The synthetic results leave routing.updated_at alone: the freshness check
    # of auto-resume reads it as the time the lane was last active.
    tx.append_many(conn, [(msid, [tx.Message(role="tool", tool_call_id=call_id, tool_name=name,
                                             content=orjson.dumps({"error": message}).decode())],
                           request_id)
                          for msid, call_id, name in dangling_tool_calls(conn, request_id)],
                   touch_routing=False)
    _close(conn, request_id, key, sid, platform, "failed", reason,
           {"reason": reason, "message": message})


def _close(conn, request_id: str, key: str, sid: str, platform: str, status: str,
           reason: str, body: dict[str, Any]) -> None:
    """A terminal frame after the request's last one, then the ledger row (and
    any queue row) closed."""
    last = last_frame_seq(conn, request_id)
    conn.execute(INSERT_FRAME, (request_id, last + 1, key, sid, platform, time.time(), status,
                                orjson.dumps(body)))
    close_unstarted(conn, request_id, status, reason, last + 1)


def restore(conn, clean: bool, freshness_s: float, auto_resume: str = "interrupted") -> RestorePlan:
    """The whole restore as one writer job. ``auto_resume`` is
    ``recovery.auto_resume`` (see resume_turns)."""
    plan = RestorePlan(clean=clean)
    now = time.time()
    if not clean:
        plan.marked = life.suspend_recently_active(conn, RECENT_WINDOW_S, INTERRUPTED)
    open_rows = conn.execute(
        "SELECT p.request_id, p.session_key, p.session_id, p.platform, p.status, p.delivery, p.text,"
        " p.payload, p.created_at, p.started_at, q.slot, q.position"
        " FROM prompts p LEFT JOIN prompt_queue q ON q.request_id = p.request_id"
        " WHERE p.status IN ('queued', 'running') ORDER BY p.session_key, p.created_at").fetchall()
    # In flight = a turn that had started and not ended (the ledger says so; the
    # lane's ``running`` flag may also be up for a lane that only had queued work).
    in_flight = sorted({r[1] for r in open_rows if r[4] == "running" and r[9] is not None})
    # Only consecutive restarts count: a lane that was not in flight this time
    # starts again from zero.
    conn.execute("DELETE FROM restart_counts WHERE session_key NOT IN (SELECT value FROM json_each(?))",
                 (orjson.dumps(in_flight),))
    for key in in_flight:  # stuck loops: consecutive restarts with the lane in flight
        conn.execute("INSERT INTO restart_counts (session_key, count, updated_at) VALUES (?, 1, ?)"
                     " ON CONFLICT (session_key) DO UPDATE SET count = count + 1, updated_at = ?",
                     (key, now, now))
        count = conn.execute("SELECT count FROM restart_counts WHERE session_key = ?", (key,)).fetchone()[0]
        if count >= STUCK_LOOP_RESTARTS:
            life.suspend(conn, key)
            conn.execute("UPDATE routing SET resume_pending = 0, resume_reason = '',"
                         " last_resume_marked_at = NULL WHERE session_key = ?", (key,))
            plan.suspended.append(key)
        else:  # it resumes (unless already marked, e.g. shutdown_timeout)
            conn.execute("UPDATE routing SET resume_pending = 1, resume_reason = ?,"
                         " last_resume_marked_at = ? WHERE session_key = ? AND resume_pending = 0"
                         " AND suspended = 0", (INTERRUPTED, now, key))
    conn.execute("UPDATE routing SET running = 0 WHERE running = 1")
    for rid, key, sid, platform, status, delivery, text, payload, created, started, slot, pos in open_rows:
        if status == "running" and (started is not None or delivery == STEER):
            # A steer in the ledger as running had joined its lane's running
            # turn (whose model may have read it already): it ends with that
            # turn, never re-runs as a turn of its own.
            close_interrupted_turn(conn, rid, key, sid, platform, INTERRUPTED,
                                   "the sidecar stopped while this turn was running")
            plan.closed_turns += 1
            continue
        if key in plan.suspended:  # as SuspendSession does: its waiting prompts end
            _close(conn, rid, key, sid, platform, "superseded", "", {"by_request_id": ""})
            continue
        # Queued, or acknowledged and about to start (its lane's next turn): it
        # runs after the restart, exactly once, in its place.
        last = last_frame_seq(conn, rid)
        plan.queued.append({"rid": rid, "key": key, "sid": sid, "platform": platform,
                            "delivery": delivery, "text": text, "created_at": created,
                            "payload": orjson.loads(payload) if payload else {},
                            "slot": slot or "next", "position": pos or 0, "next_seq": last + 1})
    order = {"next": 0, "pending": 1, "fifo": 2}
    plan.queued.sort(key=lambda q: (q["key"], order[q["slot"]], q["position"], q["created_at"]))
    # A lane whose continue turn from the last start never ran has it queued
    # (it runs now, in its place): it gets no second one.
    waiting = {q["key"] for q in plan.queued if q["rid"].startswith("resume:")}
    plan.resume = resume_turns(conn, now - freshness_s, auto_resume, set(in_flight), waiting)
    return plan


def resume_turns(conn, fresh_since: float, mode: str, in_flight: set[str],
                 waiting: set[str] = frozenset()) -> list[dict[str, Any]]:
    """The continue turns to run (DECISIONS.md "Recovery"): lanes marked
    ``resume_pending``, not suspended, active since ``fresh_since``, and

    * ``"interrupted"`` (the default): whose turn was really cut off — in
      flight when the last run ended (the ledger says so: ``in_flight``), or
      marked for a drain timeout or a dead worker. A lane merely active in
      the recent window keeps its mark (and its id) but gets no turn: a
      finished conversation must not hear from the bot unasked;
    * ``"recent"``: every lane with an auto-resume reason (hermes' rule);
    * ``"off"``: none;

    never one for a lane in ``waiting`` (its earlier continue turn is queued).
    Reads the lanes through the partial index on pending resumes."""
    if mode == "off":
        return []
    out = []
    for key, sid, platform, profile, reason in conn.execute(
            "SELECT session_key, session_id, platform, profile, resume_reason FROM routing"
            " WHERE resume_pending = 1 AND updated_at >= ? AND suspended = 0",
            (fresh_since,)).fetchall():
        if mode == "recent" and reason not in AUTO_RESUME_REASONS:
            continue
        if mode == "interrupted" and key not in in_flight and reason not in CUT_OFF_REASONS:
            continue
        if key in waiting:
            continue
        prefix = f"resume:{sid}:"
        # One more than the highest number still in the ledger (retention may
        # have dropped lower ones, so a count could hand out a live id again).
        taken = [r[0][len(prefix):] for r in conn.execute(
            "SELECT request_id FROM prompts WHERE request_id >= ? AND request_id < ?",
            (prefix, prefix + "\uffff"))]
        n = max((int(t) for t in taken if t.isdigit()), default=0) + 1
        out.append({"rid": f"{prefix}{n}", "key": key, "sid": sid, "platform": platform,
                    "profile": profile, "reason": reason or INTERRUPTED})
    return out

"""Startup restore (seed 001 §7, docs/semantics.md "Recovery"): one store job
that makes the store consistent again after whatever ended the last run.

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
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..delivery import STEER
from ..sessions import lifecycle as life
from ..store import UnitOfWork
from ..store.record_type import record
from ..store.records import Append, LedgerEntry, Message, RoutingPatch

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
_SLOT_ORDER = {"next": 0, "pending": 1, "fifo": 2}


@record
class RestoredPrompt:
    """A prompt acknowledged and not yet run: it runs after the restart,
    exactly once, in its place. ``slot`` "next" means it was about to start."""

    entry: LedgerEntry
    slot: str
    position: int
    next_seq: int
    absorbed: tuple[dict[str, Any], ...] = ()  # a follow-up's absorbed texts, oldest first


@record
class ResumeTurn:
    request_id: str
    session_key: str
    session_id: str
    platform: str
    profile: str
    reason: str


@dataclass
class RestorePlan:
    clean: bool
    marked: list[str] = field(default_factory=list)
    suspended: list[str] = field(default_factory=list)
    closed_turns: int = 0  # failed restart_interrupted
    superseded: int = 0  # waiting prompts of a lane suspended as a stuck loop
    queued: list[RestoredPrompt] = field(default_factory=list)
    resume: list[ResumeTurn] = field(default_factory=list)


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


def dangling_tool_calls(uow: UnitOfWork, request_id: str) -> list[tuple[str, str]]:
    """(call_id, name) of tool calls a turn made without a result."""
    calls: dict[str, str] = {}
    for m in uow.messages.of_request(request_id):
        if m.role == "assistant" and m.tool_calls_json:
            for c in orjson.loads(m.tool_calls_json):
                calls[c["id"]] = c.get("function", {}).get("name", "")
        elif m.role == "tool":
            calls.pop(m.tool_call_id, None)
    return list(calls.items())


def close_interrupted_turn(uow: UnitOfWork, e: LedgerEntry, reason: str, message: str) -> None:
    """Fail one turn that will never finish: synthetic tool results, a terminal
    frame after its last one, the ledger row closed. The synthetic results
    leave the lane's updated_at alone: auto-resume's freshness check reads it
    as the time the lane was last active."""
    results = tuple(Message("tool", orjson.dumps({"error": message}).decode(), tool_call_id=cid,
                            tool_name=name) for cid, name in dangling_tool_calls(uow, e.request_id))
    if results:
        uow.messages.append([Append(e.session_id, results, e.request_id, touch_lane=False)])
    close_with_frame(uow, e, "failed", reason, {"reason": reason, "message": message})


def close_with_frame(uow: UnitOfWork, e: LedgerEntry, status: str, reason: str,
                     body: dict[str, Any]) -> None:
    """A terminal frame after the request's last one, then the ledger row (and
    any queue row) closed."""
    last = uow.frames.last_seq(e.request_id)
    uow.frames.insert([(e.request_id, last + 1, e.session_key, e.session_id, e.platform, time.time(),
                        status, orjson.dumps(body))])
    uow.ledger.close(e.request_id, status, reason, last + 1, time.time())
    uow.queue.remove(e.request_id)


def _count_restarts(uow: UnitOfWork, in_flight: list[str], now: float, plan: RestorePlan,
                    keys: Sequence[str] | None) -> None:
    """Stuck loops: consecutive restarts with the lane in flight; a lane that
    was not in flight this time starts again from zero. A lane a cluster node
    takes while it is suspended keeps its count: nothing runs on it before a
    new incarnation starts the count anew (lifecycle._replace_incarnation),
    and a count at STUCK_LOOP_RESTARTS is how the nodes tell the guard's
    suspension from a SuspendSession (cluster/verdict.py)."""
    if keys is None:
        uow.restarts.keep_only(in_flight)
    else:
        for key in set(keys) - set(in_flight):
            entry = uow.routing.get(key)
            if entry is None or not entry.suspended:
                uow.restarts.reset(key)
    for key in in_flight:
        if uow.restarts.increment(key, now) >= STUCK_LOOP_RESTARTS:
            life.suspend(uow, key)
            uow.routing.patch(key, RoutingPatch(resume_pending=False, resume_reason="",
                                                last_resume_marked_at=None))
            plan.suspended.append(key)
            continue
        entry = uow.routing.get(key)  # it resumes (unless already marked, e.g. shutdown_timeout)
        if entry is not None and not entry.resume_pending and not entry.suspended:
            uow.routing.patch(key, RoutingPatch(resume_pending=True, resume_reason=INTERRUPTED,
                                                last_resume_marked_at=now))


def restore(uow: UnitOfWork, clean: bool, freshness_s: float,
            auto_resume: str = "interrupted", keys: Sequence[str] | None = None) -> RestorePlan:
    """The whole restore as one job. ``auto_resume`` is
    ``recovery.auto_resume`` (see resume_turns). With ``keys``, the same
    restore for those lanes only: a cluster node taking lanes over from a node
    that died or stalled (``clean``: their last node let them go)."""
    plan = RestorePlan(clean=clean)
    now = time.time()
    if not clean:
        plan.marked = life.suspend_recently_active(uow, RECENT_WINDOW_S, INTERRUPTED, keys)
    open_prompts = uow.ledger.open_prompts(keys)
    # In flight = a turn that had started and not ended (the ledger says so; the
    # lane's ``running`` flag may also be up for a lane that only had queued work).
    in_flight = sorted({o.entry.session_key for o in open_prompts
                        if o.entry.status == "running" and o.entry.started_at is not None})
    _count_restarts(uow, in_flight, now, plan, keys)
    uow.routing.clear_running(keys)
    for o in open_prompts:
        e = o.entry
        if e.status == "running" and (e.started_at is not None or e.delivery == STEER):
            # A steer in the ledger as running had joined its lane's running
            # turn (whose model may have read it already): it ends with that
            # turn, never re-runs as a turn of its own.
            close_interrupted_turn(uow, e, INTERRUPTED, "the sidecar stopped while this turn was running")
            plan.closed_turns += 1
        elif e.session_key in plan.suspended:  # as SuspendSession does: its waiting prompts end
            close_with_frame(uow, e, "superseded", "", {"by_request_id": ""})
            plan.superseded += 1
        else:
            link = e.payload.get("absorbed_from")  # a follow-up that absorbed a burst
            plan.queued.append(RestoredPrompt(
                e, o.slot or "next", o.position or 0, uow.frames.last_seq(e.request_id) + 1,
                tuple(absorbed_texts(uow, link)) if link else ()))
    plan.queued.sort(key=lambda q: (q.entry.session_key, _SLOT_ORDER[q.slot], q.position,
                                    q.entry.created_at))
    # A lane whose continue turn from the last start never ran has it queued
    # (it runs now, in its place): it gets no second one.
    waiting = {q.entry.session_key for q in plan.queued if q.entry.request_id.startswith("resume:")}
    plan.resume = resume_turns(uow, now - freshness_s, auto_resume, set(in_flight), waiting, keys)
    return plan


def absorbed_texts(uow: UnitOfWork, rid: str) -> list[dict[str, Any]]:
    """The chain of prompts ``rid`` absorbed (itself first, then the one it
    absorbed, …) read back from their ledger rows, oldest first, as {"text",
    "at"} (turns/burst.py)."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    while rid and rid not in seen:
        seen.add(rid)
        e = uow.ledger.get(rid)
        if e is None:  # retention dropped it
            break
        out.append({"text": e.text, "at": e.created_at})
        rid = e.payload.get("absorbed_from") or ""
    out.reverse()
    return out


def resume_turns(uow: UnitOfWork, fresh_since: float, mode: str, in_flight: set[str],
                 waiting: AbstractSet[str] = frozenset(), keys: Sequence[str] | None = None) -> list[ResumeTurn]:
    """The continue turns to run (docs/semantics.md "Recovery"): lanes marked
    ``resume_pending``, not suspended, active since ``fresh_since``, and

    * ``"interrupted"`` (the default): whose turn was really cut off — in
      flight when the last run ended (the ledger says so: ``in_flight``), or
      marked for a drain timeout or a dead worker. A lane merely active in
      the recent window keeps its mark (and its id) but gets no turn: a
      finished conversation must not hear from the bot unasked;
    * ``"recent"``: every lane with an auto-resume reason (hermes' rule);
    * ``"off"``: none;

    never one for a lane in ``waiting`` (its earlier continue turn is queued)."""
    if mode == "off":
        return []
    out = []
    for entry in uow.routing.resume_candidates(fresh_since, keys):
        key, reason = entry.session_key, entry.resume_reason
        if mode == "recent" and reason not in AUTO_RESUME_REASONS:
            continue
        if mode == "interrupted" and key not in in_flight and reason not in CUT_OFF_REASONS:
            continue
        if key in waiting:
            continue
        prefix = f"resume:{entry.session_id}:"
        # One more than the highest number still in the ledger (retention may
        # have dropped lower ones, so a count could hand out a live id again).
        taken = [rid[len(prefix):] for rid in uow.ledger.ids_with_prefix(prefix)]
        n = max((int(t) for t in taken if t.isdigit()), default=0) + 1
        out.append(ResumeTurn(f"{prefix}{n}", key, entry.session_id, entry.platform,
                              entry.profile, reason or INTERRUPTED))
    return out

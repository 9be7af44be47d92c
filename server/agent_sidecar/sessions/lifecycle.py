"""The session lifecycle's rules as store jobs: get-or-create, reset, switch,
suspend, resume marking, usage, delete, prune (seed 001 §2–§3, §7; seed 000's
lifecycle).

Each function takes the unit of work first (store/unit_of_work.py) and runs as
one job: atomic, and isolated from every other writer, so read-then-write
logic here is safe — 200 concurrent GetOrCreateSession calls for one key see
one row. Only the rules live here; the rows are the store's.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from ..errors import SidecarError, excerpt, not_found
from ..store import UnitOfWork
from ..store.records import Append, Message, RoutingColumns, RoutingPatch, SessionEntry, UsageDelta
from .entry import new_session_id, origin_of
from .source import SessionSource
from .transcripts import check_appended

# What a lane moving to a fresh incarnation starts with: counters and flags
# belong to the incarnation's conversation (seed 001 builds a new SessionEntry).
# The resume marker goes with its time: ``last_resume_marked_at`` is set and
# cleared together with ``resume_pending``.
FRESH: RoutingColumns = dict(
    input_tokens=0, output_tokens=0, cache_read_tokens=0, cache_write_tokens=0, total_tokens=0,
    estimated_cost_usd=0.0, cost_status="unknown", last_prompt_tokens=0, suspended=False,
    resume_pending=False, resume_reason="", last_resume_marked_at=None, expiry_finalized=False)
# What a completed turn consumes (seed 001 §2, §7): the resume marker with its
# reason and time, and the notices of a new incarnation (fresh reset, auto
# reset and its reason), which are for its first turn. A failed or cancelled
# turn consumes nothing: the next one still needs them.
CONSUMED_BY_A_TURN = RoutingPatch(resume_pending=False, resume_reason="", last_resume_marked_at=None,
                                  is_fresh_reset=False, was_auto_reset=False, auto_reset_reason="")


def require_entry(uow: UnitOfWork, key: str) -> SessionEntry:
    entry = uow.routing.get(key)
    if entry is None:
        raise not_found(key)
    return entry


def _replace_incarnation(uow: UnitOfWork, entry: SessionEntry, end_reason: str, now: float, *,
                         was_auto_reset: bool, auto_reset_reason: str, is_fresh_reset: bool,
                         display_name: str | None = None,
                         origin: dict[str, Any] | None = None) -> SessionEntry:
    """End the lane's incarnation and point the lane at a new one (its
    ``origin`` and ``display_name`` too, when given)."""
    ended = uow.incarnations.end(entry.session_id, end_reason, now)
    sid = new_session_id(now)
    uow.incarnations.insert(sid, entry.session_key, now)
    columns: RoutingColumns = {**FRESH, "session_id": sid, "created_at": now, "updated_at": now,
                               "was_auto_reset": was_auto_reset, "auto_reset_reason": auto_reset_reason,
                               "reset_had_activity": bool(ended and ended.had_activity),
                               "is_fresh_reset": is_fresh_reset}
    if display_name:
        columns["display_name"] = display_name
    if origin is not None:
        columns["origin"] = origin
    uow.routing.patch(entry.session_key, RoutingPatch(columns))
    # Stuck-loop restarts count against a conversation; a new one starts at zero.
    uow.restarts.reset(entry.session_key)
    return require_entry(uow, entry.session_key)


def get_or_create(uow: UnitOfWork, key: str, source: SessionSource, profile: str,
                  force_new: bool = False) -> tuple[SessionEntry, bool]:
    """seed 001 §2's priority: suspended → new id; resume_pending → keep as is;
    otherwise keep and bump updated_at. Returns (entry, created)."""
    now = time.time()
    origin = source.to_dict()
    entry = uow.routing.get(key)
    if entry is None:
        new = SessionEntry(session_key=key, session_id=new_session_id(now), profile=profile,
                           platform=source.platform, chat_type=source.effective_chat_type,
                           created_at=now, updated_at=now, origin=origin,
                           display_name=source.chat_name)
        if uow.routing.insert(new):
            uow.incarnations.insert(new.session_id, key, now)
            return new, True
        entry = require_entry(uow, key)  # another writer created it meanwhile
    # A new incarnation takes the source's chat name as the lane's display
    # name, as keeping the lane does (``kept``): a chat renamed before a
    # force_new or a /stop is shown by the name it has now.
    if force_new:
        return _replace_incarnation(uow, entry, "force_new", now, was_auto_reset=False,
                                    auto_reset_reason="", is_fresh_reset=False, origin=origin,
                                    display_name=source.chat_name), True
    if entry.suspended:
        return _replace_incarnation(uow, entry, "suspended", now, was_auto_reset=True,
                                    auto_reset_reason="suspended", is_fresh_reset=False,
                                    origin=origin, display_name=source.chat_name), True
    if entry.resume_pending:
        return entry, False  # soft recovery: same id, flag cleared by the next good turn
    uow.routing.patch(key, kept(source, now))
    return dataclasses.replace(entry, updated_at=now, origin=origin,
                               display_name=source.chat_name or entry.display_name), False


def kept(source: SessionSource, now: float) -> RoutingPatch:
    """get_or_create's "keep and bump" for a lane that stays on its
    incarnation: active now, its origin the latest source, its display name
    the chat's current name (when the source has one). A Prompt by source
    applies the same (turns/jobs.py), so both keep a renamed chat's name."""
    origin = source.to_dict()
    if source.chat_name:
        return RoutingPatch(updated_at=now, origin=origin, display_name=source.chat_name)
    return RoutingPatch(updated_at=now, origin=origin)


def starting_over(uow: UnitOfWork, key: str) -> SessionEntry:
    """A prompt named a lane by key that is suspended: it starts over as
    get-or-create from the lane's own origin would (seed 001 §2)."""
    entry = require_entry(uow, key)
    return get_or_create(uow, key, origin_of(entry), entry.profile)[0]


def seed(uow: UnitOfWork, key: str, messages: list[Message], source: SessionSource | None = None,
         profile: str = "") -> SessionEntry:
    """SeedSession: messages into an existing lane (``source`` None) or into
    the lane ``source`` resolves to, created if need be. A suspended lane
    named by key starts over first, as for a Prompt by key: seeded into the
    suspended incarnation, they would be gone from the next turn's. A tool
    message must answer an open call (transcripts.check_answers)."""
    if source is not None:
        entry = get_or_create(uow, key, source, profile)[0]
    elif (entry := require_entry(uow, key)).suspended:
        entry = starting_over(uow, key)
    check_appended(uow, entry.session_id, messages)
    result = uow.messages.append([Append(entry.session_id, tuple(messages))])[0]
    if isinstance(result, BaseException):
        raise result
    return require_entry(uow, key)


def reset(uow: UnitOfWork, key: str, display_name: str | None = None) -> SessionEntry:
    """/new, /reset: an explicit boundary with a fresh incarnation."""
    return _replace_incarnation(uow, require_entry(uow, key), "reset", time.time(),
                                was_auto_reset=False, auto_reset_reason="", is_fresh_reset=True,
                                display_name=display_name or None)


def switch(uow: UnitOfWork, key: str, target_session_id: str) -> SessionEntry:
    """/resume: point the lane at an earlier incarnation of the same key. The
    lane's entry starts afresh (seed 001 §2's switch_session makes a new
    entry): its counters and flags were the other incarnation's."""
    entry = require_entry(uow, key)
    target = uow.incarnations.get(target_session_id)
    # Another key's incarnation is not found either: the answer must not tell
    # a platform-scoped caller that the id exists under a lane it cannot see.
    if target is None or target.session_key != key:
        raise SidecarError("SESSION_NOT_FOUND", f"no session {excerpt(target_session_id)} of this key",
                           field="target_session_id")
    now = time.time()
    if target_session_id == entry.session_id:
        if not entry.suspended:
            return entry
        # /stop, then /resume of the same conversation: the explicit resume
        # wins, as it does for any other target (the next access keeps it).
        uow.routing.patch(key, RoutingPatch(suspended=False, updated_at=now))
        uow.restarts.reset(key)
        return require_entry(uow, key)
    uow.incarnations.end(entry.session_id, "switched", now)
    uow.incarnations.reopen(target_session_id)
    uow.routing.patch(key, RoutingPatch(FRESH, session_id=target_session_id, created_at=now,
                                        updated_at=now, is_fresh_reset=False, was_auto_reset=False,
                                        auto_reset_reason="", reset_had_activity=False))
    uow.restarts.reset(key)
    return require_entry(uow, key)


def suspend(uow: UnitOfWork, key: str) -> SessionEntry:
    """/stop or stuck-loop escalation: the next access gets a new id."""
    require_entry(uow, key)
    uow.routing.patch(key, RoutingPatch(suspended=True, updated_at=time.time()))
    return require_entry(uow, key)


def mark_resume_pending(uow: UnitOfWork, key: str, reason: str) -> SessionEntry:
    """Soft recovery marker; never overrides ``suspended``."""
    entry = require_entry(uow, key)
    if entry.suspended:
        return entry
    uow.routing.patch(key, RoutingPatch(resume_pending=True, resume_reason=reason,
                                        last_resume_marked_at=time.time()))
    return require_entry(uow, key)


def mark_resume_pending_many(uow: UnitOfWork, keys: list[str], reason: str) -> None:
    for key in keys:
        mark_resume_pending(uow, key, reason)


def suspend_recently_active(uow: UnitOfWork, max_age_seconds: float,
                            reason: str = "restart_interrupted",
                            among: Sequence[str] | None = None) -> list[str]:
    """Crash recovery (seed 001 §7): mark lanes updated within the window
    ``resume_pending``, skipping suspended and already-pending ones (of
    ``among`` only, when given: lanes a cluster node takes over)."""
    now = time.time()
    keys = uow.routing.keys_active_since(now - max_age_seconds, among)
    mark = RoutingPatch(resume_pending=True, resume_reason=reason, last_resume_marked_at=now)
    for key in keys:
        uow.routing.patch(key, mark)
    return keys


def update_usage(uow: UnitOfWork, key: str, delta: UsageDelta) -> SessionEntry:
    """UpdateUsage: add the counters (seed 001 §2); the lane counts as active."""
    require_entry(uow, key)
    uow.routing.add_usage(key, delta, time.time())
    return require_entry(uow, key)


def delete(uow: UnitOfWork, key: str) -> bool:
    """Drop the lane, every incarnation, messages, state, frames, ledger and
    queue. A key whose routing entry a prune removed still has its
    transcripts: they go too (a delete is how a user's data is erased)."""
    if uow.routing.get(key) is None and not uow.incarnations.of_key(key):
        return False
    if uow.leases is not None:  # a cluster: a write of the lane still on its way is refused
        uow.leases.revoke([key])
    uow.delete_lane(key)
    uow.announce("delete", (key,))  # the other sidecars of a cluster drop it too
    return True


def clear_all(uow: UnitOfWork) -> int:
    """seed 000's $sessionClearAll: everything goes, no trash. In a cluster
    every lease is revoked first (the turns other nodes are still ending
    write under their old epochs: the fence refuses it, so no row of a
    cleared session comes back after the truncate)."""
    if uow.leases is not None:
        uow.leases.revoke(None)
    n = uow.clear_all()
    uow.announce("clear_all", ())
    return n


def prune(uow: UnitOfWork, max_age_days: int, busy_keys: set[str]) -> int:
    """Drop routing entries idle longer than ``max_age_days``; skips suspended
    entries and lanes with a turn in flight. Transcripts stay (seed 001 §3, §10)."""
    if max_age_days <= 0:
        return 0
    keys = [k for k in uow.routing.idle_before(time.time() - max_age_days * 86400)
            if k not in busy_keys]
    for key in keys:
        uow.routing.delete(key)
    if keys:
        uow.announce("prune", keys)
    return len(keys)

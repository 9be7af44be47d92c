"""Writer jobs for the session lifecycle: get-or-create, reset, switch, suspend,
resume marking, usage, delete, prune (seed 001 §2–§3, §7; seed 000's lifecycle).

Each function takes the writer connection first and runs inside the writer's
transaction, so read-then-write logic here is atomic: 200 concurrent
GetOrCreateSession calls for one key run one after another and see one row.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from ..errors import SidecarError, not_found, invalid
from . import transcripts as tx
from .entry import SessionEntry, load_entry, new_session_id
from .source import SessionSource


def _insert_incarnation(conn, session_id: str, key: str, now: float) -> None:
    conn.execute(
        "INSERT INTO incarnations (session_id, session_key, created_at) VALUES (?, ?, ?)",
        (session_id, key, now),
    )


def _end_incarnation(conn, session_id: str, reason: str, now: float) -> bool:
    """Close an incarnation; returns whether it had any activity (turns or messages)."""
    conn.execute(
        "UPDATE incarnations SET ended_at = ?, end_reason = ? WHERE session_id = ? AND ended_at IS NULL",
        (now, reason, session_id),
    )
    row = conn.execute(
        "SELECT turn_count, next_seq FROM incarnations WHERE session_id = ?", (session_id,)
    ).fetchone()
    return bool(row and (row[0] > 0 or row[1] > 1))


# Columns reset when a lane moves to a fresh incarnation: counters and flags
# belong to the incarnation's conversation (seed 001 builds a new SessionEntry).
# The resume marker goes with its time: ``last_resume_marked_at`` is set and
# cleared together with ``resume_pending``.
_FRESH = (
    "input_tokens = 0, output_tokens = 0, cache_read_tokens = 0, cache_write_tokens = 0,"
    " total_tokens = 0, estimated_cost_usd = 0, cost_status = 'unknown', last_prompt_tokens = 0,"
    " suspended = 0, resume_pending = 0, resume_reason = '', last_resume_marked_at = NULL,"
    " expiry_finalized = 0"
)


def _replace_incarnation(conn, entry: SessionEntry, end_reason: str, now: float,
                         *, was_auto_reset: bool, auto_reset_reason: str,
                         is_fresh_reset: bool, display_name: str | None = None) -> str:
    had_activity = _end_incarnation(conn, entry.session_id, end_reason, now)
    sid = new_session_id(now)
    _insert_incarnation(conn, sid, entry.session_key, now)
    conn.execute(
        f"UPDATE routing SET session_id = ?, created_at = ?, updated_at = ?, {_FRESH},"
        " was_auto_reset = ?, auto_reset_reason = ?, reset_had_activity = ?, is_fresh_reset = ?,"
        " display_name = COALESCE(?, display_name) WHERE session_key = ?",
        (sid, now, now, int(was_auto_reset), auto_reset_reason, int(had_activity),
         int(is_fresh_reset), display_name, entry.session_key),
    )
    # Stuck-loop restarts count against a conversation; a new one starts at zero.
    conn.execute("DELETE FROM restart_counts WHERE session_key = ?", (entry.session_key,))
    return sid


def get_or_create(conn, key: str, source: SessionSource, profile: str,
                  force_new: bool = False) -> tuple[SessionEntry, bool]:
    """seed 001 §2's priority: suspended → new id; resume_pending → keep as is;
    otherwise keep and bump updated_at. Returns (entry, created)."""
    now = time.time()
    entry = load_entry(conn, key)
    origin = orjson.dumps(source.to_dict())
    if entry is None:
        sid = new_session_id(now)
        _insert_incarnation(conn, sid, key, now)
        conn.execute(
            "INSERT INTO routing (session_key, session_id, profile, platform, chat_type,"
            " created_at, updated_at, origin, display_name) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (key, sid, profile, source.platform, source.effective_chat_type, now, now, origin,
             source.chat_name),
        )
        return load_entry(conn, key), True
    if force_new:
        _replace_incarnation(conn, entry, "force_new", now, was_auto_reset=False,
                             auto_reset_reason="", is_fresh_reset=False)
        conn.execute("UPDATE routing SET origin = ? WHERE session_key = ?", (origin, key))
        return load_entry(conn, key), True
    if entry.suspended:
        _replace_incarnation(conn, entry, "suspended", now, was_auto_reset=True,
                             auto_reset_reason="suspended", is_fresh_reset=False)
        conn.execute("UPDATE routing SET origin = ? WHERE session_key = ?", (origin, key))
        return load_entry(conn, key), True
    if entry.resume_pending:
        return entry, False  # soft recovery: same id, flag cleared by the next good turn
    conn.execute(
        "UPDATE routing SET updated_at = ?, origin = ?,"
        " display_name = CASE WHEN ? != '' THEN ? ELSE display_name END WHERE session_key = ?",
        (now, origin, source.chat_name, source.chat_name, key),
    )
    return load_entry(conn, key), False


def seed(conn, key: str, messages: list, source: SessionSource | None = None,
         profile: str = "") -> SessionEntry:
    """SeedSession: messages into an existing lane (``source`` None) or into
    the lane ``source`` resolves to, created if need be."""
    if source is None:
        entry = require_entry(conn, key)
    else:
        entry, _ = get_or_create(conn, key, source, profile)
    tx.append(conn, entry.session_id, messages)
    return load_entry(conn, key)


def require_entry(conn, key: str) -> SessionEntry:
    entry = load_entry(conn, key)
    if entry is None:
        raise not_found(key)
    return entry


def reset(conn, key: str, display_name: str | None = None) -> SessionEntry:
    """/new, /reset: an explicit boundary with a fresh incarnation."""
    entry = require_entry(conn, key)
    _replace_incarnation(conn, entry, "reset", time.time(), was_auto_reset=False,
                         auto_reset_reason="", is_fresh_reset=True,
                         display_name=display_name or None)
    return load_entry(conn, key)


def switch(conn, key: str, target_session_id: str) -> SessionEntry:
    """/resume: point the lane at an earlier incarnation of the same key."""
    entry = require_entry(conn, key)
    row = conn.execute(
        "SELECT session_key FROM incarnations WHERE session_id = ?", (target_session_id,)
    ).fetchone()
    if row is None:
        raise SidecarError("SESSION_NOT_FOUND", f"no such session id: {target_session_id}")
    if row[0] != key:
        raise invalid("target_session_id", "belongs to another session key")
    if target_session_id == entry.session_id:
        return entry
    now = time.time()
    _end_incarnation(conn, entry.session_id, "switched", now)
    conn.execute(
        "UPDATE incarnations SET ended_at = NULL, end_reason = NULL WHERE session_id = ?",
        (target_session_id,),
    )
    # The lane's entry starts afresh (seed 001 §2's switch_session makes a new
    # entry): its counters and flags were the other incarnation's.
    conn.execute(
        f"UPDATE routing SET session_id = ?, created_at = ?, updated_at = ?, {_FRESH},"
        " is_fresh_reset = 0, was_auto_reset = 0, auto_reset_reason = '', reset_had_activity = 0"
        " WHERE session_key = ?",
        (target_session_id, now, now, key),
    )
    conn.execute("DELETE FROM restart_counts WHERE session_key = ?", (key,))
    return load_entry(conn, key)


def suspend(conn, key: str) -> SessionEntry:
    """/stop or stuck-loop escalation: the next access gets a new id."""
    require_entry(conn, key)
    conn.execute("UPDATE routing SET suspended = 1, updated_at = ? WHERE session_key = ?",
                 (time.time(), key))
    return load_entry(conn, key)


def mark_resume_pending(conn, key: str, reason: str) -> SessionEntry:
    """Soft recovery marker; never overrides ``suspended``."""
    entry = require_entry(conn, key)
    if entry.suspended:
        return entry
    conn.execute(
        "UPDATE routing SET resume_pending = 1, resume_reason = ?, last_resume_marked_at = ?"
        " WHERE session_key = ?",
        (reason, time.time(), key),
    )
    return load_entry(conn, key)


def suspend_recently_active(conn, max_age_seconds: float, reason: str = "restart_interrupted") -> list[str]:
    """Crash recovery (seed 001 §7): mark lanes updated within the window
    ``resume_pending``, skipping suspended and already-pending ones."""
    now = time.time()
    keys = [r[0] for r in conn.execute(
        "SELECT session_key FROM routing WHERE updated_at >= ? AND suspended = 0"
        " AND resume_pending = 0", (now - max_age_seconds,))]
    conn.executemany(
        "UPDATE routing SET resume_pending = 1, resume_reason = ?, last_resume_marked_at = ?"
        " WHERE session_key = ?", [(reason, now, k) for k in keys])
    return keys


def update_usage(conn, key: str, delta: dict[str, Any], last_prompt_tokens: int = 0,
                 cost_status: str = "") -> SessionEntry:
    require_entry(conn, key)
    i, o = int(delta.get("input_tokens", 0)), int(delta.get("output_tokens", 0))
    cr, cw = int(delta.get("cache_read_tokens", 0)), int(delta.get("cache_write_tokens", 0))
    cost = float(delta.get("cost_usd", 0.0))
    conn.execute(
        "UPDATE routing SET input_tokens = input_tokens + ?, output_tokens = output_tokens + ?,"
        " cache_read_tokens = cache_read_tokens + ?, cache_write_tokens = cache_write_tokens + ?,"
        " total_tokens = total_tokens + ?, estimated_cost_usd = estimated_cost_usd + ?,"
        " last_prompt_tokens = CASE WHEN ? > 0 THEN ? ELSE last_prompt_tokens END,"
        " cost_status = CASE WHEN ? != '' THEN ? ELSE cost_status END,"
        " updated_at = ? WHERE session_key = ?",
        (i, o, cr, cw, i + o + cr + cw, cost, last_prompt_tokens, last_prompt_tokens,
         cost_status, cost_status, time.time(), key),
    )
    return load_entry(conn, key)


def delete(conn, key: str) -> bool:
    """Drop the lane, every incarnation, messages, state, frames, ledger and queue."""
    if conn.execute("SELECT 1 FROM routing WHERE session_key = ?", (key,)).fetchone() is None:
        return False
    sids = [r[0] for r in conn.execute(
        "SELECT session_id FROM incarnations WHERE session_key = ?", (key,))]
    tx.index_pending(conn)  # the delete trigger then takes every row out of the index
    for sid in sids:
        conn.execute("DELETE FROM messages WHERE session_id = ?", (sid,))
        conn.execute("DELETE FROM turn_state WHERE session_id = ?", (sid,))
    tx.index_after_delete(conn)
    conn.execute("DELETE FROM incarnations WHERE session_key = ?", (key,))
    conn.execute("DELETE FROM frames WHERE session_key = ?", (key,))
    conn.execute("DELETE FROM prompt_queue WHERE session_key = ?", (key,))
    conn.execute("DELETE FROM prompts WHERE session_key = ?", (key,))
    conn.execute("DELETE FROM restart_counts WHERE session_key = ?", (key,))
    conn.execute("DELETE FROM routing WHERE session_key = ?", (key,))
    return True


def clear_all(conn) -> int:
    """seed 000's $sessionClearAll: everything goes, no trash."""
    n = conn.execute("SELECT count(*) FROM routing").fetchone()[0]
    conn.execute("INSERT INTO messages_fts (messages_fts) VALUES ('delete-all')")
    tx.set_index_mark(conn, 0)  # nothing indexed: the delete trigger stays quiet
    for table in ("routing", "incarnations", "messages", "turn_state", "frames", "prompts",
                  "prompt_queue", "restart_counts"):
        conn.execute(f"DELETE FROM {table}")
    return n


def prune(conn, max_age_days: int, busy_keys: set[str]) -> int:
    """Drop routing entries idle longer than ``max_age_days``; skips suspended
    entries and lanes with a turn in flight. Transcripts stay (seed 001 §3, §10)."""
    if max_age_days <= 0:
        return 0
    cutoff = time.time() - max_age_days * 86400
    keys = [r[0] for r in conn.execute(
        "SELECT session_key FROM routing WHERE updated_at < ? AND suspended = 0 AND running = 0",
        (cutoff,)) if r[0] not in busy_keys]
    conn.executemany("DELETE FROM routing WHERE session_key = ?", [(k,) for k in keys])
    return len(keys)

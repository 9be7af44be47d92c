"""Writer jobs for turns: the ledger, the queue mirror, turn start and end.

Each runs on the store's writer thread, inside a group-commit transaction,
usually together with the frames it reports (see frames.py).
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from ..errors import SidecarError
from ..sessions import lifecycle as life
from ..sessions import transcripts as tx

from ..sessions.source import SessionSource
from .lanes import Turn


class DuplicateRequest(Exception):
    """The request id is already in the ledger (within the dedup window)."""


def accept(conn, turn: Turn, source: SessionSource | None, dedup_window_s: float,
           slot: str | None, position: int) -> tuple[str, int]:
    """Resolve the session, write the ledger row (+ queue row) and the
    ``accepted`` frame. Returns (session_id, frame id)."""
    now = time.time()
    old = conn.execute("SELECT created_at FROM prompts WHERE request_id = ?", (turn.rid,)).fetchone()
    if old is not None:
        if now - old[0] < dedup_window_s:
            raise DuplicateRequest(turn.rid)
        conn.execute("DELETE FROM frames WHERE request_id = ?", (turn.rid,))
        conn.execute("DELETE FROM prompts WHERE request_id = ?", (turn.rid,))
    row = conn.execute("SELECT session_id, suspended, resume_pending, created_at, origin"
                       " FROM routing WHERE session_key = ?", (turn.key,)).fetchone()
    if row is not None and not row[1]:
        # The common case, kept to two statements: the lane exists and is usable.
        if not row[2] and source is not None:  # get_or_create's "keep and bump"
            conn.execute("UPDATE routing SET updated_at = ?, origin = ? WHERE session_key = ?",
                         (now, orjson.dumps(source.to_dict()), turn.key))
        turn.sid = row[0]
        # What _start needs for the system prompt, saving it a read.
        turn.routing_row = (row[0], row[3], orjson.dumps(source.to_dict()) if source else row[4])
    elif source is not None:
        entry, _ = life.get_or_create(conn, turn.key, source, turn.profile)
        turn.sid = entry.session_id
    else:
        entry = life.require_entry(conn, turn.key)
        # seed 001 §2: a suspended lane starts over
        origin = entry.origin or SessionSource(platform=entry.platform)
        entry, _ = life.get_or_create(conn, turn.key, origin, entry.profile)
        turn.sid = entry.session_id
    status = "queued" if slot else "running"
    conn.execute(
        "INSERT INTO prompts (request_id, session_key, session_id, platform, status, delivery, text,"
        " payload, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (turn.rid, turn.key, turn.sid, turn.platform, status, turn.delivery, turn.text,
         orjson.dumps(turn.payload), turn.created_at))
    if slot:
        conn.execute("INSERT INTO prompt_queue (request_id, session_key, slot, position, enqueued_at)"
                     " VALUES (?, ?, ?, ?, ?)", (turn.rid, turn.key, slot, position, now))
    body = orjson.dumps({"queue_position": turn.payload.get("queue_position", 0)})
    conn.execute("INSERT INTO frames (request_id, seq, session_key, session_id, platform, at, kind, body)"
                 " VALUES (?, 1, ?, ?, ?, ?, 'accepted', ?)",
                 (turn.rid, turn.key, turn.sid, turn.platform, turn.created_at, body))
    return turn.sid, conn.last_insert_rowid()


def accept_many(conn, items: list[tuple]) -> list:
    """Many prompts' accept jobs as one writer job (see store/batcher.py).
    ``accept`` raises its refusals (unknown session, duplicate) before writing
    anything, so no per-item savepoint is needed."""
    out: list = []
    for args in items:
        try:
            out.append(accept(conn, *args))
        except (SidecarError, DuplicateRequest) as e:
            out.append(e)
    return out


def start(conn, turn: Turn) -> dict[str, Any]:
    """The turn begins: ledger running, lane marked running, the user's message
    appended. Returns what the worker needs to match its cache."""
    now = time.time()
    if turn.queued:  # it waited: its ledger row and queue row change state now
        conn.execute("UPDATE prompts SET status = 'running', started_at = ?, session_id = ?"
                     " WHERE request_id = ?", (now, turn.sid, turn.rid))
        conn.execute("DELETE FROM prompt_queue WHERE request_id = ?", (turn.rid,))
    else:  # accepted as running: only the start time (and no index) changes
        conn.execute("UPDATE prompts SET started_at = ?, session_id = ? WHERE request_id = ?",
                     (now, turn.sid, turn.rid))
    base, rev = conn.execute("SELECT next_seq, rev FROM incarnations WHERE session_id = ?",
                             (turn.sid,)).fetchone()
    conn.execute("INSERT INTO messages (session_id, seq, role, content, created_at, request_id)"
                 " VALUES (?, ?, 'user', ?, ?, ?)", (turn.sid, base, turn.text, now, turn.rid))
    conn.execute("UPDATE incarnations SET next_seq = ? WHERE session_id = ?", (base + 1, turn.sid))
    # updated_at moved at accept and moves again at the end; leaving it alone
    # here spares two index updates per turn.
    conn.execute("UPDATE routing SET running = 1 WHERE session_key = ?", (turn.key,))
    return {"base_seq": base, "rev": rev}


def finish(conn, turn: Turn, status: str, reason: str, lane_idle: bool,
           state: dict[str, Any]) -> None:
    """The turn ended: ledger closed; on success the turn counts, the resume
    marker and fresh-reset flag clear, the stuck-loop counter resets."""
    now = time.time()
    conn.execute("UPDATE prompts SET status = ?, finished_at = ?, reason = ?, last_seq = ?"
                 " WHERE request_id = ?", (status, now, reason or None, turn.next_seq - 1, turn.rid))
    if turn.rollback and turn.started:
        tx.hide_request(conn, turn.sid, turn.rid)
    if status == "completed":
        conn.execute("UPDATE incarnations SET turn_count = turn_count + 1 WHERE session_id = ?",
                     (turn.sid,))
        conn.execute("DELETE FROM restart_counts WHERE session_key = ?", (turn.key,))
    # One statement for the lane: a good turn clears the resume marker and the
    # fresh-reset flag; an idle lane stops being "running".
    done = status == "completed"
    conn.execute(
        "UPDATE routing SET updated_at = ?,"
        " running = CASE WHEN ? THEN 0 ELSE running END,"
        " resume_pending = CASE WHEN ? THEN 0 ELSE resume_pending END,"
        " resume_reason = CASE WHEN ? THEN '' ELSE resume_reason END,"
        " is_fresh_reset = CASE WHEN ? THEN 0 ELSE is_fresh_reset END"
        " WHERE session_key = ?", (now, lane_idle, done, done, done, turn.key))
    if turn.started:
        conn.execute("INSERT INTO turn_state (session_id, request_id, updated_at, state)"
                     " VALUES (?, ?, ?, ?) ON CONFLICT (session_id) DO UPDATE SET"
                     " request_id = excluded.request_id, updated_at = excluded.updated_at,"
                     " state = excluded.state", (turn.sid, turn.rid, now, orjson.dumps(state)))


def close_unstarted(conn, turn: Turn, status: str, reason: str) -> None:
    """A queued turn that never ran ends (superseded, cancelled, dropped)."""
    conn.execute("UPDATE prompts SET status = ?, finished_at = ?, reason = ? WHERE request_id = ?",
                 (status, time.time(), reason or None, turn.rid))
    conn.execute("DELETE FROM prompt_queue WHERE request_id = ?", (turn.rid,))


def record_usage(conn, key: str, u: dict[str, Any]) -> None:
    """A usage frame's accounting: one UPDATE (seed 001 §2's counters)."""
    i, o = int(u.get("input_tokens", 0)), int(u.get("output_tokens", 0))
    cr, cw = int(u.get("cache_read_tokens", 0)), int(u.get("cache_write_tokens", 0))
    conn.execute(
        "UPDATE routing SET input_tokens = input_tokens + ?, output_tokens = output_tokens + ?,"
        " cache_read_tokens = cache_read_tokens + ?, cache_write_tokens = cache_write_tokens + ?,"
        " total_tokens = total_tokens + ?, estimated_cost_usd = estimated_cost_usd + ?,"
        " last_prompt_tokens = CASE WHEN ? > 0 THEN ? ELSE last_prompt_tokens END"
        " WHERE session_key = ?",
        (i, o, cr, cw, i + o + cr + cw, float(u.get("cost_usd", 0.0)), i, i, key))


def ledger_lookup(conn, rid: str) -> tuple | None:
    return conn.execute("SELECT status, created_at, session_key FROM prompts WHERE request_id = ?",
                        (rid,)).fetchone()



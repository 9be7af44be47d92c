"""Writer jobs for turns: the ledger, the queue mirror, turn start and end,
and the frame flush that carries them.

They run in the store's writer process (store/writer_process.py), inside a
group-commit transaction, so they take plain data — never a ``Turn`` — and
return plain data; the manager applies the results to its turns.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

import apsw
import orjson

from ..errors import INVALID_ARGUMENT, SidecarError
from ..sessions import lifecycle as life
from ..sessions import transcripts as tx
from ..sessions.source import SessionSource
from ..store.faults import is_store_fault
from ..store.writer_process import at_end

log = logging.getLogger("agent_sidecar.frames")

INSERT_FRAME = ("INSERT INTO frames (request_id, seq, session_key, session_id, platform, at, kind, body)"
                 " VALUES (?, ?, ?, ?, ?, ?, ?, ?)")

# One request's frames (?1 is the request id), found through its ledger row: its
# session key and first frame id bound a range of ``frames_by_key``. There is no
# index on the request id: ids are random, so one would cost a random b-tree page
# per turn in every commit (migration 4).
REQUEST_FRAMES = ("FROM frames WHERE session_key = (SELECT session_key FROM prompts WHERE request_id = ?1)"
                  " AND id >= (SELECT coalesce(first_frame, 0) FROM prompts WHERE request_id = ?1)"
                  " AND request_id = ?1")


def last_frame_seq(conn, rid: str) -> int:
    return conn.execute(f"SELECT max(seq) {REQUEST_FRAMES}", (rid,)).fetchone()[0] or 0


class DuplicateRequest(Exception):
    """The request id is already in the ledger (within the dedup window), for the same session key."""


def request_id_reused(rid: str) -> SidecarError:
    """A request id known for another session key (turns/dedup.py): refused,
    naming neither that session nor anything of its turn."""
    return SidecarError(INVALID_ARGUMENT, f"request_id: {rid!r} is already used by another session"
                        " within the dedup window; use a new request id", field="request_id")


def accept(conn, t: tuple, source: SessionSource | None, dedup_window_s: float,
           slot: str | None, position: int, start_now: bool = False) -> tuple:
    """Resolve the session, write the ledger row (+ queue row) and the
    ``accepted`` frame. ``t`` is ``Turn.ledger_fields()``. With ``start_now``
    (the lane is idle) the turn's start commits in the same transaction: one
    commit instead of two before the worker gets the turn.

    A follow-up that absorbed the pending prompt (turns/burst.py) links to it
    in its ledger payload (``absorbed_from``) and closes that prompt's ledger
    row with its ``superseded`` frame here too: one transaction moves the texts
    from the prompts that carried them to the one that carries them now.

    Returns (session_id, accepted frame id, the routing row the system prompt
    needs or None, for ``start_now`` what ``start`` returns plus the
    ``started`` frame's id and time else None, and for an absorbing prompt
    ``{"link": absorbed request id or None, "closed": (rid, seq, session_id,
    at, frame_id) of its superseded frame or None}`` else None)."""
    rid, key, platform, profile, delivery, text, payload, created_at = t
    now = time.time()
    absorbing, link = "absorb" in payload, None
    if absorbing:  # reads only: a refusal below still comes before any write
        link = _absorb_link(conn, key, payload["absorb"])
        payload = {k: v for k, v in payload.items() if k != "absorb"}
        if link is not None:
            payload["absorbed_from"] = link[0]
    row = conn.execute("SELECT session_id, suspended, resume_pending, created_at, origin"
                       " FROM routing WHERE session_key = ?", (key,)).fetchone()
    usable = row is not None and not row[1]
    if usable:  # the common case: the lane exists and is usable
        sid = row[0]
    else:  # the session comes into being (or a suspended lane starts over) first
        _check_duplicate(conn, rid, key, dedup_window_s, now)
        if source is not None:
            entry, _ = life.get_or_create(conn, key, source, profile)
        else:
            entry = life.require_entry(conn, key)
            # seed 001 §2: a suspended lane starts over
            origin = entry.origin or SessionSource(platform=entry.platform)
            entry, _ = life.get_or_create(conn, key, origin, entry.profile)
        sid = entry.session_id
    # On a usable lane the ledger row is the first write: a duplicate request
    # id is refused before anything is written.
    _insert_ledger(conn, (rid, key, sid, platform, "queued" if slot else "running", delivery, text,
                          orjson.dumps(payload), created_at, now if start_now else None),
                   dedup_window_s, now)
    ledger_rowid = conn.last_insert_rowid()
    routing_row = None
    if usable:
        origin = orjson.dumps(source.to_dict()) if source is not None else row[4]
        if not row[2] and source is not None:  # get_or_create's "keep and bump"
            conn.execute("UPDATE routing SET updated_at = ?, origin = ? WHERE session_key = ?",
                         (now, origin, key))
        # What the turn's start needs for the system prompt, saving it a read.
        routing_row = (sid, row[3], origin)
    if slot:
        conn.execute("INSERT INTO prompt_queue (request_id, session_key, slot, position, enqueued_at)"
                     " VALUES (?, ?, ?, ?, ?)", (rid, key, slot, position, now))
    body = orjson.dumps({"queue_position": payload.get("queue_position", 0)})
    frames = [(rid, 1, key, sid, platform, created_at, "accepted", body)]
    started = None
    if start_now:
        started = _begin(conn, rid, key, sid, [text], now, "resume" in payload)
        started["at"] = now
        frames.append((rid, 2, key, sid, platform, now, "started", None))
    if link is not None:
        seq = last_frame_seq(conn, link[0]) + 1
        close_unstarted(conn, link[0], "superseded", "", seq)
        frames.append((link[0], seq, key, link[1], link[2], now, "superseded",
                       orjson.dumps({"by_request_id": rid})))
    conn.executemany(INSERT_FRAME, frames)
    first_id = conn.last_insert_rowid() - len(frames) + 1
    # Where this request's frames and transcript rows start (see REQUEST_FRAMES).
    conn.execute("UPDATE prompts SET first_frame = ?, first_seq = ? WHERE rowid = ?",
                 (first_id, started["base_seq"] if started else None, ledger_rowid))
    if started is not None:
        started["frame_id"] = first_id + 1
    absorbed = None
    if absorbing:
        absorbed = {"link": link[0] if link else None,
                    "closed": (link[0], seq, link[1], now, first_id + len(frames) - 1) if link else None}
    return sid, first_id, routing_row, started, absorbed


def _absorb_link(conn, key: str, candidates: list[str]) -> tuple | None:
    """(request id, session id, platform) of the prompt an absorbing follow-up
    takes over: the first of ``candidates`` (see burst.candidates) still open.
    One with no ledger row was refused (its caller got the error; its text is
    not carried); one that ended some other way ends the chain."""
    for rid in candidates:
        row = conn.execute("SELECT status, session_id, platform FROM prompts"
                           " WHERE request_id = ? AND session_key = ?", (rid, key)).fetchone()
        if row is None:
            continue
        return (rid, row[1], row[2]) if row[0] == "queued" else None
    return None


def absorbed_texts(conn, rid: str) -> list[dict[str, Any]]:
    """The chain of prompts ``rid`` absorbed (itself first, then the one it
    absorbed, …) read back from their ledger rows, oldest first, as {"text",
    "at"}: for the startup restore of a queued follow-up."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    while rid and rid not in seen:
        seen.add(rid)
        row = conn.execute("SELECT text, created_at, payload FROM prompts WHERE request_id = ?",
                           (rid,)).fetchone()
        if row is None:  # retention dropped it
            break
        out.append({"text": row[0], "at": row[1]})
        rid = orjson.loads(row[2]).get("absorbed_from") if row[2] else None
    out.reverse()
    return out


_INSERT_LEDGER = ("INSERT INTO prompts (request_id, session_key, session_id, platform, status, delivery,"
                  " text, payload, created_at, started_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")


def _insert_ledger(conn, row: tuple, dedup_window_s: float, now: float) -> None:
    try:
        conn.execute(_INSERT_LEDGER, row)
    except apsw.ConstraintError:  # the request id is in the ledger
        _check_duplicate(conn, row[0], row[1], dedup_window_s, now)
        conn.execute(_INSERT_LEDGER, row)


def _check_duplicate(conn, rid: str, key: str, dedup_window_s: float, now: float) -> None:
    """Refuse a request id seen within the window (a twin for the same key,
    INVALID_ARGUMENT for another); forget an older one."""
    old = conn.execute("SELECT created_at, session_key FROM prompts WHERE request_id = ?",
                       (rid,)).fetchone()
    if old is None:
        return
    if now - old[0] < dedup_window_s:
        raise DuplicateRequest(rid) if old[1] == key else request_id_reused(rid)
    conn.execute(f"DELETE {REQUEST_FRAMES}", (rid,))  # before the ledger row it is found by
    conn.execute("DELETE FROM prompts WHERE request_id = ?", (rid,))


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


def start(conn, rid: str, key: str, sid: str, texts: list[str], queued: bool,
          synthetic: bool = False) -> dict[str, Any]:
    """A turn that waited in its lane begins: ledger running, lane marked
    running, its user messages appended (one, or a burst's, oldest first: see
    Turn.user_texts). Returns what the worker needs to match its cache."""
    now = time.time()
    begun = _begin(conn, rid, key, sid, texts, now, synthetic)
    if queued:  # it waited: its ledger row and queue row change state now
        conn.execute("UPDATE prompts SET status = 'running', started_at = ?, session_id = ?,"
                     " first_seq = ? WHERE request_id = ?", (now, sid, begun["base_seq"], rid))
        conn.execute("DELETE FROM prompt_queue WHERE request_id = ?", (rid,))
    else:  # accepted as running: only the start time (and no index) changes
        conn.execute("UPDATE prompts SET started_at = ?, session_id = ?, first_seq = ?"
                     " WHERE request_id = ?", (now, sid, begun["base_seq"], rid))
    return begun


_INSERT_USER = ("INSERT INTO messages (session_id, seq, role, content, extra, created_at, request_id)"
                " VALUES (?, ?, 'user', ?, ?, ?, ?)")


def _begin(conn, rid: str, key: str, sid: str, texts: list[str], now: float,
           synthetic: bool) -> dict[str, Any]:
    """The user's messages into the transcript (seqs from ``base_seq`` on, all
    tagged with this request, so a rollback hides them with the turn), the lane
    marked running. ``synthetic``: the sidecar's own prompt (an auto-resume
    turn's note), kept as role "user" for the model but marked as written by
    nobody."""
    base, rev = conn.execute("SELECT next_seq, rev FROM incarnations WHERE session_id = ?",
                             (sid,)).fetchone()
    extra = tx.SYNTHETIC_EXTRA if synthetic else None
    rows = [(sid, base + i, text, extra, now, rid) for i, text in enumerate(texts)]
    if len(rows) == 1:  # the common case: one prompt, one message
        conn.execute(_INSERT_USER, rows[0])
    else:
        conn.executemany(_INSERT_USER, rows)
    conn.execute("UPDATE incarnations SET next_seq = ? WHERE session_id = ?",
                 (base + len(texts), sid))
    # updated_at moved at accept and moves again at the end; leaving it alone
    # here spares two index updates per turn.
    conn.execute("UPDATE routing SET running = 1 WHERE session_key = ?", (key,))
    return {"base_seq": base, "rev": rev}


# What a completed turn consumes (seed 001 §2, §7): the resume marker with its
# reason and time, and the notices of a new incarnation (fresh reset, auto
# reset and its reason), which are for its first turn. A failed or cancelled
# turn consumes nothing: the next one still needs them.
_CONSUMED = (("resume_pending", "0"), ("resume_reason", "''"), ("last_resume_marked_at", "NULL"),
             ("is_fresh_reset", "0"), ("was_auto_reset", "0"), ("auto_reset_reason", "''"))
# One statement for the lane at a turn's end: the consumed flags clear only on
# the turn's own incarnation (a reset or switch may have moved the lane on
# while it finished); an idle lane stops being "running".
_FINISH_LANE = ("UPDATE routing SET updated_at = :now, running = CASE WHEN :idle THEN 0 ELSE running END, "
                + ", ".join(f"{col} = CASE WHEN :done AND session_id = :sid THEN {v} ELSE {col} END"
                            for col, v in _CONSUMED)
                + " WHERE session_key = :key")


def finish(conn, rid: str, key: str, sid: str, status: str, reason: str, last_seq: int,
           rollback: bool, lane_idle: bool, state: dict[str, Any]) -> None:
    """The turn ended: ledger closed; on success the turn counts, the flags
    of _CONSUMED clear, the stuck-loop counter resets."""
    now = time.time()
    conn.execute("UPDATE prompts SET status = ?, finished_at = ?, reason = ?, last_seq = ?"
                 " WHERE request_id = ?", (status, now, reason or None, last_seq, rid))
    if rollback:
        tx.hide_request(conn, sid, rid)
    if status == "completed":
        conn.execute("UPDATE incarnations SET turn_count = turn_count + 1 WHERE session_id = ?",
                     (sid,))
        conn.execute("DELETE FROM restart_counts WHERE session_key = ?", (key,))
    conn.execute(_FINISH_LANE, {"now": now, "idle": lane_idle, "done": status == "completed",
                                "sid": sid, "key": key})
    conn.execute("INSERT INTO turn_state (session_id, request_id, updated_at, state)"
                 " VALUES (?, ?, ?, ?) ON CONFLICT (session_id) DO UPDATE SET"
                 " request_id = excluded.request_id, updated_at = excluded.updated_at,"
                 " state = excluded.state", (sid, rid, now, orjson.dumps(state)))


def close_unstarted(conn, rid: str, status: str, reason: str, last_seq: int) -> None:
    """The ledger closes a turn that has no ``finish`` of its own: a queued one
    that never ran (superseded, cancelled, dropped), or one the startup restore
    closes. Its queue row, if any, goes."""
    conn.execute("UPDATE prompts SET status = ?, finished_at = ?, reason = ?, last_seq = ?"
                 " WHERE request_id = ?", (status, time.time(), reason or None, last_seq, rid))
    conn.execute("DELETE FROM prompt_queue WHERE request_id = ?", (rid,))


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
        # the prompt's whole size, cached parts included (seed 001: what the API reported)
        (i, o, cr, cw, i + o + cr + cw, float(u.get("cost_usd", 0.0)), i + cr + cw, i + cr + cw, key))


def ledger_lookup(conn, rid: str) -> tuple | None:
    return conn.execute("SELECT status, created_at, session_key FROM prompts WHERE request_id = ?",
                        (rid,)).fetchone()


def mark_resume_pending_many(conn, keys: list[str], reason: str) -> None:
    for key in keys:
        life.mark_resume_pending(conn, key, reason)


# -- the frame flush (see frames.py) ----------------------------------------------------

FN, MSG = "fn", "msg"  # kinds of writes queued with frames


class FlushOutOfOrder(Exception):
    """A frame flush whose predecessor did not commit: it must not commit
    either (the bus sends it again, behind its predecessor)."""


class _FlushOrder:
    """In the writer process: the number of the last flush that ran (in the
    open transaction or committed) and of the last one that committed."""
    ran = 0
    committed = 0


def _flush_committed(no: int) -> None:
    _FlushOrder.committed = no


def _flush_undone() -> None:
    _FlushOrder.ran = _FlushOrder.committed


def run_flush(conn, order: tuple[int, int], rows: list[tuple], writes: list[tuple]) -> tuple[list, int]:
    """One flush of the frame bus: every write in publish order, then every
    frame row, in one transaction — a ``completed`` frame commits with its
    ledger update and transcript rows or not at all. ``writes`` holds
    ``(FN, (fn, args) or None)`` and ``(MSG, append_many item)``. Returns each
    write's result (an exception for one that failed) and the first frame id
    (rows inserted by one executemany get consecutive ids).

    ``order`` is (this flush's number, the number of the flush before it).
    The bus keeps several flushes in flight; if one does not commit (a full
    disk), those sent behind it must not commit before it is sent again, or
    seqs would skip and transcript rows swap. So a flush runs only right
    after its predecessor (here, in the writer process, which sees every
    flush in order), else raises FlushOutOfOrder.

    The fast path runs the writes bare; if one raises, everything is rolled
    back to a savepoint and replayed with a savepoint per write, so one bad
    write fails alone and the batch's frames still land. Not so a store fault
    (a full disk): it fails the whole flush, which the bus keeps and retries —
    a frame must never commit without the writes queued before it."""
    no, prev = order
    if prev != _FlushOrder.ran:
        raise FlushOutOfOrder(f"flush {no} follows {prev}, but {_FlushOrder.ran} ran last")
    try:
        with conn:
            results = _run_writes(conn, writes, isolate=False)
    except Exception as e:
        if is_store_fault(e):
            raise
        log.exception("a write queued with frames failed; replaying the batch write by write")
        results = _run_writes(conn, writes, isolate=True)
    first_id = 0
    if rows:
        conn.executemany(INSERT_FRAME, rows)
        first_id = conn.last_insert_rowid() - len(rows) + 1
    _FlushOrder.ran = no
    at_end(functools.partial(_flush_committed, no), _flush_undone)
    return results, first_id


def _run_writes(conn, writes: list[tuple], isolate: bool) -> list:
    results: list = []
    i, n = 0, len(writes)
    while i < n:
        kind, payload = writes[i]
        if kind == MSG:
            j = i
            while j < n and writes[j][0] == MSG:
                j += 1
            items = [w[1] for w in writes[i:j]]
            results.extend(_guarded(conn, isolate, tx.append_many, (items, False), len(items), True))
            i = j
            continue
        i += 1
        if payload is None:
            results.append(None)
        else:
            results.extend(_guarded(conn, isolate, payload[0], payload[1], 1, False))
    return results


def _guarded(conn, isolate: bool, fn, args: tuple, count: int, many: bool) -> list:
    if not isolate:
        out = fn(conn, *args)
        return out if many else [out]
    try:
        with conn:
            out = fn(conn, *args)
        return out if many else [out]
    except Exception as e:
        if is_store_fault(e):
            raise
        log.exception("a write queued with frames failed")
        return [e] * count

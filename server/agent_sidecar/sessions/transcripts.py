"""Transcripts: append-only message rows per incarnation (seed 000, seed 001 §3).

Rewind, rewrite and rollback never delete: they clear ``active`` and record why
in ``hidden_by``, so the audit trail stays and ``include_rewound`` can show it.
Writes are writer jobs (``conn`` first); reads take a reader connection.

A ``synthetic`` message is one nobody wrote: the sidecar's own note (the
continue note of an auto-resume turn) stored with the role the model must read
it in. The flag lives in the row's ``extra`` blob beside the tool fields (no
column, no migration) and reaches clients as ``Message.synthetic``, so an
adapter never shows the note as something its user said.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterable

import apsw
import orjson

from ..errors import SidecarError, invalid

ROLES = ("system", "user", "assistant", "tool")


@dataclass(slots=True)
class Message:
    role: str
    content: str = ""
    tool_call_id: str = ""
    tool_name: str = ""
    tool_calls_json: str = ""
    created_at: float = 0.0
    seq: int = 0
    active: bool = True
    synthetic: bool = False

    def extra(self) -> bytes | None:
        d = {k: v for k, v in (("tool_call_id", self.tool_call_id), ("tool_name", self.tool_name),
                               ("tool_calls_json", self.tool_calls_json),
                               ("synthetic", self.synthetic)) if v}
        return orjson.dumps(d) if d else None


SYNTHETIC_EXTRA = Message(role="user", synthetic=True).extra()


_SELECT = "SELECT seq, role, content, extra, created_at, active FROM messages"


def _row_to_message(row) -> Message:
    seq, role, content, extra, created_at, active = row
    m = Message(role=role, content=content, created_at=created_at, seq=seq, active=bool(active))
    if extra:
        d = orjson.loads(extra)
        m.tool_call_id = d.get("tool_call_id", "")
        m.tool_name = d.get("tool_name", "")
        m.tool_calls_json = d.get("tool_calls_json", "")
        m.synthetic = bool(d.get("synthetic", False))
    return m


def incarnation_exists(conn, session_id: str) -> bool:
    return conn.execute("SELECT 1 FROM incarnations WHERE session_id = ?",
                        (session_id,)).fetchone() is not None


_INSERT = ("INSERT INTO messages (session_id, seq, role, content, extra, created_at, request_id)"
           " VALUES (?, ?, ?, ?, ?, ?, ?)")


def append_many(conn, items: list[tuple[str, list[Message], str | None]],
                touch_routing: bool = True) -> list:
    """Append for many callers at once: one executemany for every row, seqs
    handed out per session in item order. Returns per item (first_seq,
    last_seq) or the SidecarError for an unknown session id. A turn's own
    messages pass ``touch_routing=False``: the turn's end moves the lane's
    ``updated_at`` anyway (two index updates saved per message)."""
    now = time.time()
    state: dict[str, list] = {}  # session_id -> [next_seq, session_key]
    rows: list[tuple] = []
    results: list = []
    for session_id, messages, request_id in items:
        st = state.get(session_id)
        if st is None:
            row = conn.execute("SELECT next_seq, session_key FROM incarnations WHERE session_id = ?",
                               (session_id,)).fetchone()
            if row is None:
                results.append(SidecarError("SESSION_NOT_FOUND", f"no such session id: {session_id}"))
                continue
            st = state[session_id] = [row[0], row[1]]
        first = st[0]
        for m in messages:
            rows.append((session_id, st[0], m.role, m.content, m.extra(), m.created_at or now,
                         request_id))
            st[0] += 1
        results.append((first, st[0] - 1))
    if rows:
        conn.executemany(_INSERT, rows)
        conn.executemany("UPDATE incarnations SET next_seq = ? WHERE session_id = ?",
                         [(st[0], sid) for sid, st in state.items()])
        if touch_routing:
            conn.executemany("UPDATE routing SET updated_at = ? WHERE session_key = ? AND session_id = ?",
                             [(now, st[1], sid) for sid, st in state.items()])
    return results


def append(conn, session_id: str, messages: Iterable[Message],
           request_id: str | None = None) -> tuple[int, int]:
    """Append rows with the next seqs; returns (first_seq, last_seq)."""
    result = append_many(conn, [(session_id, list(messages), request_id)])[0]
    if isinstance(result, BaseException):
        raise result
    return result


def load_page(conn, session_id: str, *, include_rewound: bool = False, after_seq: int = 0,
              limit: int | None = None) -> list[Message]:
    sql = _SELECT + " WHERE session_id = ? AND seq > ?"
    if not include_rewound:
        sql += " AND active = 1"
    sql += " ORDER BY seq"
    params: list[Any] = [session_id, after_seq]
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    return [_row_to_message(r) for r in conn.execute(sql, params)]


def load_active(conn, session_id: str) -> list[Message]:
    return load_page(conn, session_id)


def load_for_model(conn, session_id: str) -> list[dict[str, Any]]:
    """The live transcript straight into the model's chat shape (the inverse
    of ``from_model``), for a worker rebuilding an agent: no intermediate
    objects on this path, which runs on every cache miss."""
    out: list[dict[str, Any]] = []
    for role, content, extra in conn.execute(
            "SELECT role, content, extra FROM messages WHERE session_id = ? AND active = 1 ORDER BY seq",
            (session_id,)):
        m: dict[str, Any] = {"role": role, "content": content}
        if extra:
            d = orjson.loads(extra)
            if d.get("tool_calls_json"):
                m["tool_calls"] = orjson.loads(d["tool_calls_json"])
            if d.get("tool_call_id"):
                m["tool_call_id"] = d["tool_call_id"]
            if d.get("tool_name"):
                m["name"] = d["tool_name"]
        out.append(m)
    return out


def rewrite(conn, session_id: str, messages: list[Message]) -> None:
    """Full replacement: hide every live row (kept as audit trail), append the new."""
    if not incarnation_exists(conn, session_id):
        raise SidecarError("SESSION_NOT_FOUND", f"no such session id: {session_id}")
    conn.execute("UPDATE messages SET active = 0, hidden_by = 'rewrite'"
                 " WHERE session_id = ? AND active = 1", (session_id,))
    _bump_rev(conn, session_id)
    append(conn, session_id, messages)


def rewind(conn, session_id: str, n: int, taken: Iterable[str] = ()) -> dict[str, Any]:
    """Back up ``n`` user turns by soft delete: the n-th last live user message
    and everything after it become inactive. ``taken``: request ids of turns the
    lane already took back (turns/undo.py): what they wrote is hidden first, so
    it is neither counted nor left behind."""
    if not incarnation_exists(conn, session_id):
        raise SidecarError("SESSION_NOT_FOUND", f"no such session id: {session_id}")
    hidden = sum(hide_request(conn, session_id, rid, "rewind") for rid in taken)
    users = conn.execute(
        "SELECT seq, content FROM messages WHERE session_id = ? AND active = 1 AND role = 'user'"
        " ORDER BY seq DESC LIMIT ?", (session_id, n)).fetchall() if n > 0 else []
    if not users:
        return {"rewound_count": hidden, "turns_undone": 0, "target_text": ""}
    target_seq, target_text = users[-1]
    conn.execute(
        "UPDATE messages SET active = 0, hidden_by = 'rewind'"
        " WHERE session_id = ? AND active = 1 AND seq >= ?", (session_id, target_seq))
    count = conn.changes()
    _bump_rev(conn, session_id)
    return {"rewound_count": hidden + count, "turns_undone": len(users), "target_text": target_text}


def hide_request(conn, session_id: str, request_id: str, reason: str = "rollback") -> int:
    """ROLLBACK delivery: soft-delete what one turn wrote. Its rows are found from
    the turn's first seq (in its ledger row) on, through UNIQUE (session_id, seq)."""
    conn.execute("UPDATE messages SET active = 0, hidden_by = ? WHERE session_id = ?"
                 " AND seq >= coalesce((SELECT first_seq FROM prompts WHERE request_id = ?), 0)"
                 " AND request_id = ? AND active = 1", (reason, session_id, request_id, request_id))
    n = conn.changes()
    _bump_rev(conn, session_id)
    return n


def _bump_rev(conn, session_id: str) -> None:
    conn.execute("UPDATE incarnations SET rev = rev + 1 WHERE session_id = ?", (session_id,))


def current_rev(conn, session_id: str) -> int:
    row = conn.execute("SELECT rev FROM incarnations WHERE session_id = ?", (session_id,)).fetchone()
    return row[0] if row else 0


def from_model(msg: dict[str, Any]) -> Message:
    """The agent loop's OpenAI-shaped message as a transcript row."""
    calls = msg.get("tool_calls")
    return Message(role=msg["role"], content=msg.get("content") or "",
                   tool_call_id=msg.get("tool_call_id", ""), tool_name=msg.get("name", ""),
                   tool_calls_json=orjson.dumps(calls).decode() if calls else "")


# -- the full-text index ------------------------------------------------------------
#
# Messages are indexed in batches, not by a trigger on every insert: FTS5 writes
# a new index segment for every transaction that touches it, which cost about a
# sixth of the store writer's time per turn. The index is caught up every second
# (recovery/housekeeping.py), before every search (so a search always sees
# every message written before it), at a clean stop, and by doctor.

FTS_MARK = "fts_indexed_id"  # meta key: every message id up to it is indexed


def index_pending(conn, limit: int | None = None) -> int:
    """Index messages added since the last call (at most ``limit``); returns
    how many. A writer job."""
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (FTS_MARK,)).fetchone()
    last = row[0] if row else 0
    sql = "SELECT id, content FROM messages WHERE id > ? ORDER BY id"
    rows = conn.execute(sql + (" LIMIT ?" if limit else ""),
                        (last, limit) if limit else (last,)).fetchall()
    if rows:
        conn.executemany("INSERT INTO messages_fts (rowid, content) VALUES (?, ?)", rows)
        set_index_mark(conn, rows[-1][0])
    return len(rows)


def index_after_delete(conn) -> None:
    """After deleting messages (everything having been indexed first): the
    mark comes down to the highest id left, because SQLite hands the freed ids
    above it out again and those new rows must still be indexed."""
    set_index_mark(conn, conn.execute("SELECT coalesce(max(id), 0) FROM messages").fetchone()[0])


def set_index_mark(conn, value: int) -> None:
    conn.execute("INSERT INTO meta (key, value) VALUES (?, ?)"
                 " ON CONFLICT (key) DO UPDATE SET value = excluded.value", (FTS_MARK, value))


def search(conn, query: str, session_key: str = "", limit: int = 20) -> list[dict[str, Any]]:
    """FTS5 over live messages. A query that is not valid FTS5 syntax is retried
    as a plain phrase search, so users can type anything. NUL counts as a space:
    FTS5 reads a query only up to its first NUL, which would cut a phrase's
    closing quote off ("unterminated string")."""
    query = query.replace("\x00", " ")
    sql = (
        "SELECT i.session_key, m.session_id, m.seq, m.role,"
        " snippet(messages_fts, 0, '[', ']', '…', 12), m.created_at"
        " FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid"
        " JOIN incarnations i ON i.session_id = m.session_id"
        " WHERE messages_fts MATCH ? AND m.active = 1"
    )
    params: list[Any] = [query]
    if session_key:
        sql += " AND i.session_key = ?"
        params.append(session_key)
    sql += " ORDER BY rank LIMIT ?"
    params.append(limit)
    try:
        rows = conn.execute(sql, params).fetchall()
    except apsw.SQLError:
        params[0] = " ".join('"' + t.replace('"', '""') + '"' for t in query.split())
        if not params[0]:
            raise invalid("query", "is empty")
        rows = conn.execute(sql, params).fetchall()
    return [dict(zip(("session_key", "session_id", "seq", "role", "snippet", "created_at"), r))
            for r in rows]

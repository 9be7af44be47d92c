"""The SQLite backend's read queries, one function per ``Store`` read, each
run in one read transaction on a read-only connection (store.py). Every one
goes through an index: keyset pages on ``routing_by_updated`` and
``routing_by_platform``, a request's frames through its ledger row, frame
replays on ``frame_keys`` (plus the short tail it has not taken yet:
frame_keys.py) / ``frames_by_platform``."""

from __future__ import annotations

from typing import Any

import apsw

from .. import search_query
from ..records import FrameRecord, LedgerEntry, Message, SearchHit, SessionEntry
from ..statements import ENTRY_SELECT, entries_page, one
from . import frame_keys, rows
from .messages import FTS_MARK


def entry(conn: apsw.Connection, key: str) -> SessionEntry | None:
    row = conn.execute(ENTRY_SELECT + " WHERE r.session_key = ?", (key,)).fetchone()
    return rows.entry(row) if row else None


def session_key_of(conn: apsw.Connection, session_id: str) -> str | None:
    row = conn.execute("SELECT session_key FROM incarnations WHERE session_id = ?",
                       (session_id,)).fetchone()
    return row[0] if row else None


def list_entries(conn: apsw.Connection, platform: str, active_since: float | None,
                 after: tuple[float, str] | None, limit: int) -> list[SessionEntry]:
    sql, params = entries_page("?", platform, active_since, after, limit)
    return [rows.entry(r) for r in conn.execute(sql, params)]


def transcript(conn: apsw.Connection, session_id: str, include_rewound: bool, after_seq: int,
               limit: int | None) -> list[Message]:
    sql = rows.MESSAGE_SELECT + " WHERE session_id = ? AND seq > ?"
    if not include_rewound:
        sql += " AND active = 1"
    sql += " ORDER BY seq"
    params: list[Any] = [session_id, after_seq]
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    return [rows.message(r) for r in conn.execute(sql, params)]


def load_for_model(conn: apsw.Connection, session_id: str) -> list[dict[str, Any]]:
    # A plain row (no tool fields) is made here: no call per row of a transcript.
    return [rows.model_message(role, content, extra) if extra else {"role": role, "content": content}
            for role, content, extra in conn.execute(
                "SELECT role, content, extra FROM messages WHERE session_id = ? AND active = 1"
                " ORDER BY seq", (session_id,))]


_SEARCH = ("SELECT i.session_key, m.session_id, m.seq, m.role,"
           " snippet(messages_fts, 0, '[', ']', '…', 12), m.created_at"
           " FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid"
           " JOIN incarnations i ON i.session_id = m.session_id"
           " WHERE messages_fts MATCH ? AND m.active = 1")


def search(conn: apsw.Connection, query: str, session_key: str, limit: int) -> list[SearchHit]:
    """FTS5 over live messages, the query read in the websearch syntax both
    backends share (search_query.py) and written as FTS5: what a user types is
    never FTS5 syntax, and means what it means on PostgreSQL."""
    groups = search_query.parse(query)
    if not groups:
        return []
    sql = _SEARCH
    params: list[str | int] = [search_query.to_fts5(groups)]
    if session_key:
        sql += " AND i.session_key = ?"
        params.append(session_key)
    sql += " ORDER BY rank LIMIT ?"
    params.append(limit)
    return [SearchHit(*r) for r in conn.execute(sql, params)]


def ledger(conn: apsw.Connection, request_id: str) -> LedgerEntry | None:
    row = conn.execute(rows.LEDGER_SELECT + " WHERE request_id = ?", (request_id,)).fetchone()
    return rows.ledger(row) if row else None


def recent_requests(conn: apsw.Connection, since: float, limit: int) -> list[tuple[str, float, str]]:
    return [tuple(r) for r in conn.execute(
        "SELECT request_id, created_at, session_key FROM prompts WHERE created_at >= ?"
        " ORDER BY created_at DESC LIMIT ?", (since, limit))]


def request_frames(conn: apsw.Connection, request_id: str, after_seq: int, after_cursor: int = 0,
                   limit: int = 0) -> list[FrameRecord]:
    """A request's frames from its first one, or past a cursor (whichever is
    later): a page costs its own rows, not those before it (frame_keys.py)."""
    return [rows.frame(r) for r in frame_keys.of_request(conn, request_id, after_seq=after_seq,
                                                         after_id=after_cursor, limit=limit or -1)]


def frames_after(conn: apsw.Connection, cursor: int, session_key: str, platform: str,
                 limit: int) -> list[FrameRecord]:
    if session_key:
        return [rows.frame(r) for r in frame_keys.of_key(conn, session_key, cursor, limit=limit)]
    return [rows.frame(r) for r in conn.execute(
        f"{rows.FRAME_SELECT} WHERE platform = ? AND id > ? ORDER BY id LIMIT ?", (platform, cursor, limit))]


def last_frame_cursor(conn: apsw.Connection) -> int:
    return one(conn.execute("SELECT coalesce(max(id), 0) FROM frames").fetchone())[0]


def fts_backlog(conn: apsw.Connection) -> int:
    """Messages past the full-text index's mark (what the next indexing takes)."""
    return one(conn.execute("SELECT count(*) FROM messages WHERE id > coalesce("
                            "(SELECT value FROM meta WHERE key = ?), 0)", (FTS_MARK,)).fetchone())[0]

"""The SQLite transcript repository (unit_of_work.MessageRepo) and the full-text
index's batch indexing.

Rows are append-only; hiding clears ``active`` and records why in
``hidden_by``, so the audit trail stays. A turn's rows are found from the
first seq its ledger row records on, through UNIQUE (session_id, seq): there
is no index on the request id (ids are random, so one would cost a random
b-tree page per turn in every commit).

The full-text index is filled in batches, not by a trigger per insert: FTS5
writes a new index segment for every transaction that touches it, which cost
about a sixth of the writer's time per turn. ``meta.fts_indexed_id`` is the
last message id indexed (every id up to it is in the index, none above it);
the delete trigger of schema.py takes indexed rows back out.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import apsw

from ..records import Append, Message
from ..statements import one
from ..unit_of_work import unknown_session
from . import rows

_INSERT = ("INSERT INTO messages (session_id, seq, role, content, extra, created_at, request_id)"
           " VALUES (?, ?, ?, ?, ?, ?, ?)")
# A turn's rows (?1 is the request id), from the first seq its ledger row records on.
TURN_ROWS = ("SELECT m.seq, m.role, m.content, m.extra, m.created_at, m.active"
             " FROM prompts p JOIN messages m"
             " ON m.session_id = p.session_id AND m.seq >= coalesce(p.first_seq, 0)"
             " WHERE p.request_id = ?1 AND m.request_id = ?1 ORDER BY m.seq")
# One item's seq range: the incarnation's next_seq moves past it, and the row says where it ends.
_TAKE_SEQS = ("UPDATE incarnations SET next_seq = next_seq + ? WHERE session_id = ?"
              " RETURNING next_seq, session_key, rev")
FTS_MARK = "fts_indexed_id"
# The live rows from the last live non-tool row on (?1 the session id): the
# subquery walks the (session_id, seq) index back from the end to that row.
_TAIL = (rows.MESSAGE_SELECT + " WHERE session_id = ?1 AND active = 1 AND seq >= coalesce(("
         "SELECT seq FROM messages WHERE session_id = ?1 AND active = 1 AND role <> 'tool'"
         " ORDER BY seq DESC LIMIT 1), 0) ORDER BY seq")


class SqliteMessages:
    def __init__(self, conn: apsw.Connection):
        self.conn = conn

    def append(self, items: Sequence[Append]) -> list:
        """Seqs handed out per incarnation in item order, each item's range
        taken by one ``UPDATE ... RETURNING`` (no read before the write); the
        rows of every item in one insert; the lanes' ``updated_at`` moves for
        items that ask (a turn's end moves it anyway: two index updates saved
        per message)."""
        now = time.time()
        out_rows: list[tuple] = []
        results: list = []
        touched: dict[str, str] = {}  # session_id -> session_key
        execute, extra_of = self.conn.execute, rows.message_extra
        for item in items:
            sid, msgs, rid = item.session_id, item.messages, item.request_id
            taken = execute(_TAKE_SEQS, (len(msgs), sid)).fetchone()
            if taken is None:
                results.append(unknown_session(sid))
                continue
            end, key, rev = taken
            first = end - len(msgs)
            if item.touch_lane:
                touched[sid] = key
            for seq, m in enumerate(msgs, first):
                extra = extra_of(m) if (m.tool_call_id or m.tool_name or m.tool_calls_json
                                        or m.synthetic) else None
                out_rows.append((sid, seq, m.role, m.content, extra, m.created_at or now, rid))
            results.append((first, end - 1, rev))
        if len(out_rows) == 1:
            execute(_INSERT, out_rows[0])
        elif out_rows:
            self.conn.executemany(_INSERT, out_rows)
        if touched and out_rows:
            self.conn.executemany("UPDATE routing SET updated_at = ? WHERE session_key = ?"
                                  " AND session_id = ?", [(now, k, s) for s, k in touched.items()])
        return results

    def hide_live(self, session_id: str, reason: str) -> int:
        self.conn.execute("UPDATE messages SET active = 0, hidden_by = ? WHERE session_id = ?"
                          " AND active = 1", (reason, session_id))
        return self.conn.changes()

    def hide_from(self, session_id: str, seq: int, reason: str) -> int:
        self.conn.execute("UPDATE messages SET active = 0, hidden_by = ? WHERE session_id = ?"
                          " AND active = 1 AND seq >= ?", (reason, session_id, seq))
        return self.conn.changes()

    def hide_request(self, session_id: str, request_id: str, reason: str) -> int:
        self.conn.execute(
            "UPDATE messages SET active = 0, hidden_by = ? WHERE session_id = ?"
            " AND seq >= coalesce((SELECT first_seq FROM prompts WHERE request_id = ?), 0)"
            " AND request_id = ? AND active = 1", (reason, session_id, request_id, request_id))
        return self.conn.changes()

    def last_user(self, session_id: str, n: int) -> list[tuple[int, str]]:
        return [tuple(r) for r in self.conn.execute(
            "SELECT seq, content FROM messages WHERE session_id = ? AND active = 1 AND role = 'user'"
            " AND (extra IS NULL OR json_extract(CAST(extra AS TEXT), '$.synthetic') IS NULL)"
            " ORDER BY seq DESC LIMIT ?", (session_id, n))]

    def of_request(self, request_id: str) -> list[Message]:
        """Every row one turn wrote (in its ledger row's incarnation), in seq order."""
        return [rows.message(r) for r in self.conn.execute(TURN_ROWS, (request_id,))]

    def lock(self, session_ids: Sequence[str]) -> None:
        pass  # the store's one writer: no other append can come between a read and this commit

    def tail(self, session_id: str) -> list[Message]:
        return [rows.message(r) for r in self.conn.execute(_TAIL, (session_id,))]

    def tail_request(self, session_id: str) -> str | None:
        row = self.conn.execute("SELECT request_id FROM messages WHERE session_id = ? AND active = 1"
                                " AND role <> 'tool' ORDER BY seq DESC LIMIT 1", (session_id,)).fetchone()
        return row[0] if row else None

    # -- the full-text index ---------------------------------------------------------------

    def index_pending(self, limit: int | None = None) -> int:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (FTS_MARK,)).fetchone()
        last = row[0] if row else 0
        sql = "SELECT id, content FROM messages WHERE id > ? ORDER BY id"
        found: list[tuple[Any, ...]] = self.conn.execute(sql + (" LIMIT ?" if limit else ""),
                                  (last, limit) if limit else (last,)).fetchall()
        if found:
            self.conn.executemany("INSERT INTO messages_fts (rowid, content) VALUES (?, ?)", found)
            self.set_index_mark(found[-1][0])
        return len(found)

    def set_index_mark(self, value: int) -> None:
        self.conn.execute("INSERT INTO meta (key, value) VALUES (?, ?)"
                          " ON CONFLICT (key) DO UPDATE SET value = excluded.value", (FTS_MARK, value))

    def delete_sessions(self, session_ids: list[str]) -> None:
        """Drop incarnations' rows (everything indexed first, so the delete
        trigger takes each out of the index); the mark comes down to the
        highest id left, because SQLite hands freed ids above it out again
        and those new rows must still be indexed."""
        self.index_pending()
        for sid in session_ids:
            self.conn.execute("DELETE FROM messages WHERE session_id = ?", (sid,))
        self.set_index_mark(one(self.conn.execute("SELECT coalesce(max(id), 0) FROM messages").fetchone())[0])

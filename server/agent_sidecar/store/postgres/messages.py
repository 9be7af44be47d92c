"""The PostgreSQL transcript repository (unit_of_work.MessageRepo).

As on SQLite: append-only rows, hiding instead of deleting, a turn's rows
found from the first seq its ledger row records. Seqs are handed out under the
incarnation's row lock, so appends from several sidecars to one incarnation
never collide: an append to one incarnation (the common case: a turn's user
messages, its reply) is one statement whose UPDATE of ``next_seq`` takes the
lock and inserts the rows; an append to several locks them all first, in
session-id order (``SELECT … FOR UPDATE``), then writes every row in one
statement and every ``next_seq`` in another, neither awaited (the writer's
pipeline, connection.py). The full-text index is a generated column: nothing
to catch up (``index_pending`` is 0).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import psycopg

from ..records import Append, Message
from ..unit_of_work import unknown_session
from . import rows
from .codec import json_rows

# Every row of an append in one statement, every next_seq in another (the
# rows as one json parameter: codec.json_rows), not a statement per row.
_INSERT = ("INSERT INTO messages (session_id, seq, role, content, extra, created_at, request_id)"
           " SELECT r->>0, (r->>1)::bigint, r->>2, r->>3, nullif((r->4)::jsonb, 'null'), (r->>5)::float8, r->>6"
           " FROM json_array_elements(%s::json) AS r")
_NEXT_SEQ = ("UPDATE incarnations i SET next_seq = (u.r->>1)::bigint FROM json_array_elements(%s::json) AS u(r)"
             " WHERE i.session_id = u.r->>0")
_TOUCH = ("UPDATE routing r SET updated_at = %s FROM json_array_elements(%s::json) AS u(k)"
          " WHERE r.session_key = u.k->>0 AND r.session_id = u.k->>1")
# An append to one incarnation (a turn's user messages, its reply) in one
# statement: the seqs handed out by the UPDATE (its row lock, as FOR UPDATE),
# the rows inserted with them, the lane touched if asked; answers
# (first seq, rev), no row for an unknown session id (nothing written then).
_APPEND_ONE = (
    "WITH inc AS (UPDATE incarnations SET next_seq = next_seq + %(n)s WHERE session_id = %(sid)s"
    " RETURNING next_seq - %(n)s AS first, session_key, rev),"
    " ins AS (INSERT INTO messages (session_id, seq, role, content, extra, created_at, request_id)"
    " SELECT %(sid)s, inc.first + m.n - 1, m.r->>0, m.r->>1, nullif((m.r->2)::jsonb, 'null'),"
    " (m.r->>3)::float8, %(rid)s FROM inc, json_array_elements(%(msgs)s::json) WITH ORDINALITY AS m(r, n)),"
    " touch AS (UPDATE routing r SET updated_at = %(now)s FROM inc WHERE %(touch)s"
    " AND r.session_key = inc.session_key AND r.session_id = %(sid)s)"
    " SELECT first, rev FROM inc")
TURN_ROWS = ("SELECT m.seq, m.role, m.content, m.extra, m.created_at, m.active"
             " FROM prompts p JOIN messages m"
             " ON m.session_id = p.session_id AND m.seq >= coalesce(p.first_seq, 0)"
             " WHERE p.request_id = %(rid)s AND m.request_id = %(rid)s ORDER BY m.seq")

# The live rows from the last live non-tool row on: as on SQLite.
_TAIL = (rows.MESSAGE_SELECT + " WHERE session_id = %(sid)s AND active AND seq >= coalesce(("
         "SELECT seq FROM messages WHERE session_id = %(sid)s AND active AND role <> 'tool'"
         " ORDER BY seq DESC LIMIT 1), 0) ORDER BY seq")


class PostgresMessages:
    def __init__(self, conn: psycopg.Connection):
        self.conn = conn
        self.send = rows.sender(conn)

    def append(self, items: Sequence[Append]) -> list:
        now = time.time()
        if len(items) == 1 and items[0].messages:
            return [self._append_one(items[0], now)]
        sids = list(dict.fromkeys(item.session_id for item in items))
        found = {r[0]: [r[1], r[2], r[3], False] for r in self.conn.execute(
            "SELECT session_id, next_seq, session_key, rev FROM incarnations"
            " WHERE session_id = ANY(%s) ORDER BY session_id FOR UPDATE", (sids,))}
        out_rows: list[list] = []
        results: list = []
        for item in items:
            st = found.get(item.session_id)
            if st is None:
                results.append(unknown_session(item.session_id))
                continue
            if item.touch_lane:
                st[3] = True
            first = seq = st[0]
            for m in item.messages:
                out_rows.append([item.session_id, seq, m.role, m.content, rows.message_extra(m),
                                 float(m.created_at or now), item.request_id])
                seq += 1
            st[0] = seq
            results.append((first, seq - 1, st[2]))
        if out_rows:
            # No answer awaited for these (the writer's pipeline): only the
            # seqs above came from the server, under the row locks.
            self.send(_INSERT, (json_rows(out_rows),))
            self.send(_NEXT_SEQ, (json_rows([[sid, st[0]] for sid, st in found.items()]),))
            touched = [[st[1], sid] for sid, st in found.items() if st[3]]
            if touched:
                self.send(_TOUCH, (now, json_rows(touched)))
        return results

    def _append_one(self, item: Append, now: float) -> tuple[int, int, int] | Exception:
        msgs = item.messages
        row = self.conn.execute(_APPEND_ONE, {
            "n": len(msgs), "sid": item.session_id, "rid": item.request_id, "now": now, "touch": item.touch_lane,
            "msgs": json_rows([[m.role, m.content, rows.message_extra(m), float(m.created_at or now)]
                               for m in msgs])}).fetchone()
        if row is None:
            return unknown_session(item.session_id)
        return (row[0], row[0] + len(msgs) - 1, row[1])

    def hide_live(self, session_id: str, reason: str) -> int:
        return rows.count(self.conn, "UPDATE messages SET active = false, hidden_by = %s"
                          " WHERE session_id = %s AND active", (reason, session_id))

    def hide_from(self, session_id: str, seq: int, reason: str) -> int:
        return rows.count(self.conn, "UPDATE messages SET active = false, hidden_by = %s"
                          " WHERE session_id = %s AND active AND seq >= %s", (reason, session_id, seq))

    def hide_request(self, session_id: str, request_id: str, reason: str) -> int:
        return rows.count(
            self.conn,
            "UPDATE messages SET active = false, hidden_by = %(reason)s WHERE session_id = %(sid)s"
            " AND seq >= coalesce((SELECT first_seq FROM prompts WHERE request_id = %(rid)s), 0)"
            " AND request_id = %(rid)s AND active",
            {"reason": reason, "sid": session_id, "rid": request_id})

    def last_user(self, session_id: str, n: int) -> list[tuple[int, str]]:
        return [tuple(r) for r in self.conn.execute(
            "SELECT seq, content FROM messages WHERE session_id = %s AND active AND role = 'user'"
            " AND NOT coalesce((extra->>'synthetic')::boolean, false)"
            " ORDER BY seq DESC LIMIT %s", (session_id, n))]

    def of_request(self, request_id: str) -> list[Message]:
        return [rows.message(r) for r in self.conn.execute(TURN_ROWS, {"rid": request_id})]

    def lock(self, session_ids: Sequence[str]) -> None:
        # Its own statement, answered: a READ COMMITTED read after it takes a
        # snapshot with the commit of whoever held the lock before.
        self.conn.execute("SELECT 1 FROM incarnations WHERE session_id = ANY(%s) ORDER BY session_id"
                          " FOR UPDATE", (list(session_ids),)).fetchall()

    def tail(self, session_id: str) -> list[Message]:
        return [rows.message(r) for r in self.conn.execute(_TAIL, {"sid": session_id})]

    def tail_request(self, session_id: str) -> str | None:
        row = self.conn.execute("SELECT request_id FROM messages WHERE session_id = %s AND active"
                                " AND role <> 'tool' ORDER BY seq DESC LIMIT 1", (session_id,)).fetchone()
        return row[0] if row else None

    def index_pending(self, limit: int | None = None) -> int:
        return 0  # the tsvector column is computed on insert

    def delete_sessions(self, session_ids: list[str]) -> None:
        self.send("DELETE FROM messages WHERE session_id = ANY(%s)", (session_ids,))

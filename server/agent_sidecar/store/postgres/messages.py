"""The PostgreSQL transcript repository (interface.MessageRepo).

As on SQLite: append-only rows, hiding instead of deleting, a turn's rows
found from the first seq its ledger row records. Seqs are handed out under the
incarnation's row lock (``SELECT … FOR UPDATE``), so appends from several
sidecars to one incarnation never collide. The full-text index is a generated
column: nothing to catch up (``index_pending`` is 0).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import psycopg

from ..interface import unknown_session
from ..records import Append, Message
from . import rows

_INSERT = ("INSERT INTO messages (session_id, seq, role, content, extra, created_at, request_id)"
           " VALUES (%s, %s, %s, %s, %s, %s, %s)")
TURN_ROWS = ("SELECT m.seq, m.role, m.content, m.extra, m.created_at, m.active"
             " FROM prompts p JOIN messages m"
             " ON m.session_id = p.session_id AND m.seq >= coalesce(p.first_seq, 0)"
             " WHERE p.request_id = %(rid)s AND m.request_id = %(rid)s ORDER BY m.seq")


class PostgresMessages:
    def __init__(self, conn: psycopg.Connection):
        self.conn = conn

    def append(self, items: Sequence[Append]) -> list:
        now = time.time()
        sids = list(dict.fromkeys(item.session_id for item in items))
        found = {r[0]: [r[1], r[2], r[3], False] for r in self.conn.execute(
            "SELECT session_id, next_seq, session_key, rev FROM incarnations"
            " WHERE session_id = ANY(%s) ORDER BY session_id FOR UPDATE", (sids,))}
        out_rows: list[tuple] = []
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
                out_rows.append((item.session_id, seq, m.role, m.content, rows.message_extra(m),
                                 m.created_at or now, item.request_id))
                seq += 1
            st[0] = seq
            results.append((first, seq - 1, st[2]))
        if out_rows:
            with self.conn.cursor() as cur:
                cur.executemany(_INSERT, out_rows)
                cur.executemany("UPDATE incarnations SET next_seq = %s WHERE session_id = %s",
                                [(st[0], sid) for sid, st in found.items()])
                touched = [(now, st[1], sid) for sid, st in found.items() if st[3]]
                if touched:
                    cur.executemany("UPDATE routing SET updated_at = %s WHERE session_key = %s"
                                    " AND session_id = %s", touched)
        return results

    def hide_live(self, session_id: str, reason: str) -> int:
        return self.conn.execute("UPDATE messages SET active = false, hidden_by = %s"
                                 " WHERE session_id = %s AND active", (reason, session_id)).rowcount

    def hide_from(self, session_id: str, seq: int, reason: str) -> int:
        return self.conn.execute("UPDATE messages SET active = false, hidden_by = %s"
                                 " WHERE session_id = %s AND active AND seq >= %s",
                                 (reason, session_id, seq)).rowcount

    def hide_request(self, session_id: str, request_id: str, reason: str) -> int:
        return self.conn.execute(
            "UPDATE messages SET active = false, hidden_by = %(reason)s WHERE session_id = %(sid)s"
            " AND seq >= coalesce((SELECT first_seq FROM prompts WHERE request_id = %(rid)s), 0)"
            " AND request_id = %(rid)s AND active",
            {"reason": reason, "sid": session_id, "rid": request_id}).rowcount

    def last_user(self, session_id: str, n: int) -> list[tuple[int, str]]:
        return [tuple(r) for r in self.conn.execute(
            "SELECT seq, content FROM messages WHERE session_id = %s AND active AND role = 'user'"
            " ORDER BY seq DESC LIMIT %s", (session_id, n))]

    def of_request(self, request_id: str) -> list[Message]:
        return [rows.message(r) for r in self.conn.execute(TURN_ROWS, {"rid": request_id})]

    def index_pending(self, limit: int | None = None) -> int:
        return 0  # the tsvector column is computed on insert

    def delete_sessions(self, session_ids: list[str]) -> None:
        self.conn.execute("DELETE FROM messages WHERE session_id = ANY(%s)", (session_ids,))

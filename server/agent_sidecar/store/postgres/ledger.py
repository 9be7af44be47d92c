"""PostgreSQL repositories of the prompt ledger, the queue mirror and the
activity frames (unit_of_work.LedgerRepo, QueueRepo, FrameRepo).

Frame cursors grow with commit order across the cluster: the first frame
insert of a transaction takes a transaction-scoped advisory lock (every
sidecar's frame inserts queue on it until the holder commits), and ids are
handed out under it, so a transaction that commits later never shows a lower
cursor than one already visible. A watcher reading ``id > cursor`` in order
can therefore never skip a frame that commits later.
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson
import psycopg
from psycopg.types.json import Jsonb

from ..records import LedgerEntry, NewFrame, OpenPrompt, QueueSlot
from ..statements import one
from . import rows
from .codec import json_rows
from .connection import FRAMES_LOCK

_INSERT_LEDGER = ("INSERT INTO prompts (request_id, session_key, session_id, platform, status, delivery,"
                  " text, payload, created_at, started_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
                  " ON CONFLICT DO NOTHING RETURNING true")
# One request's frames, found through its ledger row (as on SQLite).
REQUEST_FRAMES = ("FROM frames WHERE session_key = (SELECT session_key FROM prompts WHERE request_id = %(rid)s)"
                  " AND id >= (SELECT coalesce(first_frame, 0) FROM prompts WHERE request_id = %(rid)s)"
                  " AND request_id = %(rid)s")
# One statement: the ids handed out (the sequence moved on by n at once, under
# FRAMES_LOCK) and the rows (codec.json_rows, in order) inserted with them;
# answers the first id. The CTE ``ids`` calls volatile functions, so it runs
# once (and is materialized).
_INSERT_FRAMES = (
    "WITH ids AS (SELECT setval('frames_id_seq', nextval('frames_id_seq') + %(n)s - 1) - %(n)s + 1 AS first),"
    " ins AS (INSERT INTO frames (id, request_id, seq, session_key, session_id, platform, at, kind, body)"
    " SELECT ids.first + f.n - 1, f.r->>0, (f.r->>1)::bigint, f.r->>2, f.r->>3, f.r->>4,"
    " (f.r->>5)::float8, f.r->>6, nullif((f.r->7)::jsonb, 'null')"
    " FROM ids, json_array_elements(%(rows)s::json) WITH ORDINALITY AS f(r, n))"
    " SELECT first FROM ids")


class PostgresLedger:
    def __init__(self, conn: psycopg.Connection):
        self.conn = conn
        self.send = rows.sender(conn)

    def get(self, request_id: str) -> LedgerEntry | None:
        row = self.conn.execute(rows.LEDGER_SELECT + " WHERE request_id = %s", (request_id,)).fetchone()
        return rows.ledger(row) if row else None

    def insert(self, e: LedgerEntry) -> bool:
        return self.conn.execute(_INSERT_LEDGER, (
            e.request_id, e.session_key, e.session_id, e.platform, e.status, e.delivery, e.text,
            Jsonb(e.payload), e.created_at, e.started_at)).fetchone() is not None

    def forget(self, request_id: str) -> None:
        self.send(f"DELETE {REQUEST_FRAMES}", {"rid": request_id})
        self.send("DELETE FROM prompts WHERE request_id = %s", (request_id,))

    def mark_started(self, request_id: str, session_id: str, at: float, first_seq: int,
                     from_queue: bool) -> None:
        if from_queue:
            self.send("UPDATE prompts SET status = 'running', started_at = %s, session_id = %s,"
                              " first_seq = %s WHERE request_id = %s", (at, session_id, first_seq, request_id))
            self.send("DELETE FROM prompt_queue WHERE request_id = %s", (request_id,))
        else:
            self.send("UPDATE prompts SET started_at = %s, session_id = %s, first_seq = %s"
                              " WHERE request_id = %s", (at, session_id, first_seq, request_id))

    def set_first_frame(self, request_id: str, cursor: int, first_seq: int | None) -> None:
        self.send("UPDATE prompts SET first_frame = %s, first_seq = %s WHERE request_id = %s",
                          (cursor, first_seq, request_id))

    def close(self, request_id: str, status: str, reason: str, last_seq: int, at: float) -> None:
        self.send("UPDATE prompts SET status = %s, finished_at = %s, reason = %s, last_seq = %s"
                          " WHERE request_id = %s", (status, at, reason or None, last_seq, request_id))

    def open_prompts(self, keys: Sequence[str] | None = None) -> list[OpenPrompt]:
        cols = ", ".join("p." + c for c in rows.LEDGER_COLUMNS)
        sql = (f"SELECT {cols}, q.slot, q.position FROM prompts p"
               " LEFT JOIN prompt_queue q ON q.request_id = p.request_id"
               " WHERE p.status IN ('queued', 'running')")
        params: tuple = ()
        if keys is not None:
            sql += " AND p.session_key = ANY(%s)"
            params = (list(keys),)
        n = len(rows.LEDGER_COLUMNS)
        found = self.conn.execute(sql + " ORDER BY p.session_key, p.created_at", params).fetchall()
        return [OpenPrompt(rows.ledger(r[:n]), r[n], r[n + 1]) for r in found]

    def ids_with_prefix(self, prefix: str) -> list[str]:
        pattern = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        return [r[0] for r in self.conn.execute("SELECT request_id FROM prompts WHERE request_id LIKE %s",
                                                (pattern,))]

    def recent(self, since: float, limit: int) -> list[tuple[str, float, str]]:
        return [tuple(r) for r in self.conn.execute(
            "SELECT request_id, created_at, session_key FROM prompts WHERE created_at >= %s"
            " ORDER BY created_at DESC LIMIT %s", (since, limit))]

    def delete_closed_before(self, cutoff: float, limit: int) -> int:
        return rows.count(self.conn,
            "DELETE FROM prompts WHERE request_id = ANY(ARRAY(SELECT request_id FROM prompts"
            " WHERE created_at < %s AND status NOT IN ('queued', 'running') LIMIT %s))",
            (cutoff, limit))

    def delete_key(self, key: str) -> None:
        self.send("DELETE FROM prompt_queue WHERE session_key = %s", (key,))
        self.send("DELETE FROM prompts WHERE session_key = %s", (key,))


class PostgresQueue:
    def __init__(self, conn: psycopg.Connection):
        self.conn = conn
        self.send = rows.sender(conn)

    def insert(self, s: QueueSlot) -> None:
        self.send("INSERT INTO prompt_queue (request_id, session_key, slot, position, enqueued_at)"
                          " VALUES (%s, %s, %s, %s, %s)",
                          (s.request_id, s.session_key, s.slot, s.position, s.enqueued_at))

    def remove(self, request_id: str) -> None:
        self.send("DELETE FROM prompt_queue WHERE request_id = %s", (request_id,))


class PostgresFrames:
    def __init__(self, conn: psycopg.Connection):
        self.conn = conn
        self.send = rows.sender(conn)
        self.written = 0  # the highest cursor this transaction inserted (0: none)
        self.ordered = False  # this transaction holds FRAMES_LOCK

    def begin(self) -> None:
        self.written = 0
        self.ordered = False

    def mark(self) -> tuple[int, bool]:
        """What ``undone`` needs to go back to (at a savepoint)."""
        return self.written, self.ordered

    def undone(self, mark: tuple[int, bool]) -> None:
        """Rolled back to the savepoint ``mark`` was taken at: FRAMES_LOCK, if
        taken since, was released with it and is taken again at the next insert."""
        self.written, self.ordered = mark

    def order(self) -> None:
        """Take FRAMES_LOCK for the rest of the transaction (once): frame
        cursors then commit in order. Lease rows are locked only after it
        (cluster.py), so two sidecars' writers never wait on each other in a
        circle (one holding the frames lock, the other a lease row)."""
        if not self.ordered:
            self.send("SELECT pg_advisory_xact_lock(%s)", (FRAMES_LOCK,))
            self.ordered = True

    def insert(self, new: Sequence[NewFrame]) -> int:
        self.order()  # the first frame of this transaction: in commit order
        n = len(new)
        data = json_rows([[rid, seq, key, sid, platform, float(at), kind, orjson.Fragment(body) if body else None]
                          for rid, seq, key, sid, platform, at, kind, body in new])
        first = one(self.conn.execute(_INSERT_FRAMES, {"n": n, "rows": data}).fetchone())[0]
        self.written = first + n - 1
        return first

    def last_seq(self, request_id: str) -> int:
        return one(self.conn.execute(f"SELECT max(seq) {REQUEST_FRAMES}", {"rid": request_id}).fetchone())[0] or 0

    def delete_before(self, at: float, limit: int) -> int:
        cutoff = self._cutoff_id(at)
        if not cutoff:
            return 0
        return rows.count(self.conn,
            "DELETE FROM frames WHERE id = ANY(ARRAY(SELECT id FROM frames WHERE id < %s ORDER BY id LIMIT %s))",
            (cutoff, limit))

    def _cutoff_id(self, at: float) -> int:
        """The smallest frame id with ``at >= at``: a binary search over ids
        (they grow with time), each probe a primary-key lookup, so retention
        needs no index on ``at`` (one more per frame insert) and never reads
        the frames it keeps (as store/sqlite/ledger.py's cutoff_id)."""
        lo, hi = one(self.conn.execute(
            "SELECT (SELECT min(id) FROM frames), (SELECT max(id) FROM frames)").fetchone())
        if lo is None:
            return 0
        while lo < hi:
            mid = (lo + hi) // 2
            row = self.conn.execute("SELECT id, at FROM frames WHERE id >= %s ORDER BY id LIMIT 1",
                                    (mid,)).fetchone()
            if row is None or row[1] >= at:
                hi = mid
            else:
                lo = row[0] + 1
        row = self.conn.execute("SELECT at FROM frames WHERE id = %s", (lo,)).fetchone()
        return lo if row is None or row[0] >= at else lo + 1

    def delete_key(self, key: str) -> None:
        self.send("DELETE FROM frames WHERE session_key = %s", (key,))

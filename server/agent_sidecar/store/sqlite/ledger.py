"""SQLite repositories of the prompt ledger, the queue mirror and the activity
frames (unit_of_work.LedgerRepo, QueueRepo, FrameRepo).

A request's frames are found through its ledger row: its session key and
first frame id bound a range of the key's frames (frame_keys.py). There is no
index on the request id (ids are random, so one would cost a random b-tree
page per turn in every commit; migration 4). Frame ids are the global cursor:
AUTOINCREMENT, so a cursor once handed out is never handed out again, and rows
inserted by one executemany get consecutive ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import apsw
import orjson

from ..records import LedgerEntry, NewFrame, OpenPrompt, QueueSlot
from ..statements import one
from . import frame_keys, rows

INSERT_FRAME = ("INSERT INTO frames (request_id, seq, session_key, session_id, platform, at, kind, body)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
_INSERT_LEDGER = ("INSERT INTO prompts (request_id, session_key, session_id, platform, status, delivery,"
                  " text, payload, created_at, started_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                  " ON CONFLICT DO NOTHING")


class SqliteLedger:
    def __init__(self, conn: apsw.Connection):
        self.conn = conn
        self._inserted: tuple[str, int] = ("", 0)  # (request id, rowid) of the last insert

    def get(self, request_id: str) -> LedgerEntry | None:
        row = self.conn.execute(rows.LEDGER_SELECT + " WHERE request_id = ?", (request_id,)).fetchone()
        return rows.ledger(row) if row else None

    def insert(self, e: LedgerEntry) -> bool:
        self.conn.execute(_INSERT_LEDGER, (e.request_id, e.session_key, e.session_id, e.platform,
                                           e.status, e.delivery, e.text, orjson.dumps(e.payload),
                                           e.created_at, e.started_at))
        if self.conn.changes() != 1:
            return False
        self._inserted = (e.request_id, self.conn.last_insert_rowid())
        return True

    def forget(self, request_id: str) -> None:
        # Its frames before the row they are found by.
        frame_keys.delete_ids(self.conn, [r[0] for r in frame_keys.of_request(self.conn, request_id,
                                                                              columns="f.id")])
        self.conn.execute("DELETE FROM prompts WHERE request_id = ?", (request_id,))

    def mark_started(self, request_id: str, session_id: str, at: float, first_seq: int,
                     from_queue: bool) -> None:
        if from_queue:  # it waited: its ledger row and queue row change state now
            self.conn.execute("UPDATE prompts SET status = 'running', started_at = ?, session_id = ?,"
                              " first_seq = ? WHERE request_id = ?", (at, session_id, first_seq, request_id))
            self.conn.execute("DELETE FROM prompt_queue WHERE request_id = ?", (request_id,))
        else:  # accepted as running: only the start time (and no index) changes
            self.conn.execute("UPDATE prompts SET started_at = ?, session_id = ?, first_seq = ?"
                              " WHERE request_id = ?", (at, session_id, first_seq, request_id))

    def set_first_frame(self, request_id: str, cursor: int, first_seq: int | None) -> None:
        rid, rowid = self._inserted
        if rid == request_id:  # just inserted: by rowid, one b-tree fewer
            self.conn.execute("UPDATE prompts SET first_frame = ?, first_seq = ? WHERE rowid = ?",
                              (cursor, first_seq, rowid))
        else:
            self.conn.execute("UPDATE prompts SET first_frame = ?, first_seq = ? WHERE request_id = ?",
                              (cursor, first_seq, request_id))

    def close(self, request_id: str, status: str, reason: str, last_seq: int, at: float) -> None:
        self.conn.execute("UPDATE prompts SET status = ?, finished_at = ?, reason = ?, last_seq = ?"
                          " WHERE request_id = ?", (status, at, reason or None, last_seq, request_id))

    def open_prompts(self, keys: Sequence[str] | None = None) -> list[OpenPrompt]:
        cols = ", ".join("p." + c for c in rows.LEDGER_COLUMNS)
        found: list[tuple[Any, ...]] = self.conn.execute(
            f"SELECT {cols}, q.slot, q.position FROM prompts p"
            " LEFT JOIN prompt_queue q ON q.request_id = p.request_id"
            " WHERE p.status IN ('queued', 'running') ORDER BY p.session_key, p.created_at").fetchall()
        n = len(rows.LEDGER_COLUMNS)
        out = [OpenPrompt(rows.ledger(r[:n]), r[n], r[n + 1]) for r in found]
        return out if keys is None else [o for o in out if o.entry.session_key in set(keys)]

    def ids_with_prefix(self, prefix: str) -> list[str]:
        return [r[0] for r in self.conn.execute(
            "SELECT request_id FROM prompts WHERE request_id >= ? AND request_id < ?",
            (prefix, prefix + "\uffff"))]

    def recent(self, since: float, limit: int) -> list[tuple[str, float, str]]:
        return [tuple(r) for r in self.conn.execute(
            "SELECT request_id, created_at, session_key FROM prompts WHERE created_at >= ?"
            " ORDER BY created_at DESC LIMIT ?", (since, limit))]

    def delete_closed_before(self, cutoff: float, limit: int) -> int:
        self.conn.execute(
            "DELETE FROM prompts WHERE request_id IN (SELECT request_id FROM prompts"
            " WHERE created_at < ? AND status NOT IN ('queued', 'running') LIMIT ?)", (cutoff, limit))
        return self.conn.changes()

    def delete_key(self, key: str) -> None:
        self.conn.execute("DELETE FROM prompt_queue WHERE session_key = ?", (key,))
        self.conn.execute("DELETE FROM prompts WHERE session_key = ?", (key,))


class SqliteQueue:
    def __init__(self, conn: apsw.Connection):
        self.conn = conn

    def insert(self, s: QueueSlot) -> None:
        self.conn.execute("INSERT INTO prompt_queue (request_id, session_key, slot, position, enqueued_at)"
                          " VALUES (?, ?, ?, ?, ?)", (s.request_id, s.session_key, s.slot, s.position,
                                                      s.enqueued_at))

    def remove(self, request_id: str) -> None:
        self.conn.execute("DELETE FROM prompt_queue WHERE request_id = ?", (request_id,))


class SqliteFrames:
    """``key_batch``: frames inserted between two passes of the key index
    (frame_keys.py), counted in this process; the pass runs inside the insert
    that reaches it."""

    def __init__(self, conn: apsw.Connection, key_batch: int = frame_keys.KEY_BATCH):
        self.conn = conn
        self.key_batch = key_batch
        self._unkeyed: int | None = None  # read from the store at the first insert

    def insert(self, new: Sequence[NewFrame]) -> int:
        if len(new) == 1:
            self.conn.execute(INSERT_FRAME, new[0])
        else:
            self.conn.executemany(INSERT_FRAME, new)
        first = self.conn.last_insert_rowid() - len(new) + 1
        if self._unkeyed is None:
            self._unkeyed = frame_keys.unkeyed(self.conn)
        else:
            self._unkeyed += len(new)
        if self._unkeyed >= self.key_batch:
            frame_keys.index_pending(self.conn)
            self._unkeyed = 0
        return first

    def last_seq(self, request_id: str) -> int:
        seqs = frame_keys.of_request(self.conn, request_id, columns="f.seq")
        return max((s for (s,) in seqs), default=0)

    def delete_before(self, at: float, limit: int) -> int:
        cutoff = cutoff_id(self.conn, at)
        if not cutoff:
            return 0
        last = one(self.conn.execute("SELECT max(id), count(*) FROM (SELECT id FROM frames WHERE id < ?"
                                     " ORDER BY id LIMIT ?)", (cutoff, limit)).fetchone())
        if not last[1]:
            return 0
        frame_keys.delete_through(self.conn, last[0])
        return last[1]

    def delete_key(self, key: str) -> None:
        frame_keys.delete_key(self.conn, key)


def cutoff_id(conn: apsw.Connection, cutoff: float) -> int:
    """The smallest frame id with ``at >= cutoff``: a binary search over ids
    (they grow with time), each probe a primary-key lookup, so retention needs
    no index on ``at`` and never scans the table."""
    # Two subqueries, each one step to an end of the rowid b-tree (a combined
    # min/max would scan the whole table).
    lo, hi = one(conn.execute("SELECT (SELECT min(id) FROM frames), (SELECT max(id) FROM frames)").fetchone())
    if lo is None:
        return 0
    while lo < hi:
        mid = (lo + hi) // 2
        row = conn.execute("SELECT id, at FROM frames WHERE id >= ? ORDER BY id LIMIT 1", (mid,)).fetchone()
        if row is None or row[1] >= cutoff:
            hi = mid
        else:
            lo = row[0] + 1
    row = conn.execute("SELECT at FROM frames WHERE id = ?", (lo,)).fetchone()
    return lo if row is None or row[0] >= cutoff else lo + 1

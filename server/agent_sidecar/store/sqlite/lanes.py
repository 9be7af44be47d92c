"""SQLite repositories of the lanes: routing rows, incarnations, stuck-loop
counters, turn state (unit_of_work.RoutingRepo and friends).

Statements are built once per shape and cached: a patch of the same columns
is the same SQL text, so SQLite's statement cache finds it prepared.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import apsw
import orjson

from ..records import Incarnation, LaneHead, RoutingPatch, SessionEntry, UsageDelta
from ..statements import ENTRY_SELECT, RoutingPatches, one, usage_update
from . import rows

_INSERT_ROUTING = ("INSERT INTO routing (" + ", ".join(rows.ROUTING_FIELDS) + ") VALUES ("
                   + ", ".join("?" for _ in rows.ROUTING_FIELDS) + ") ON CONFLICT DO NOTHING")


class SqliteRouting:
    def __init__(self, conn: apsw.Connection):
        self.conn = conn
        self._patches = RoutingPatches("?", rows.column_value)

    def get(self, key: str) -> SessionEntry | None:
        row = self.conn.execute(ENTRY_SELECT + " WHERE r.session_key = ?", (key,)).fetchone()
        return rows.entry(row) if row else None

    def head(self, key: str) -> LaneHead | None:
        row = self.conn.execute("SELECT session_id, suspended, resume_pending, created_at, origin"
                                " FROM routing WHERE session_key = ?", (key,)).fetchone()
        if row is None:
            return None
        return LaneHead(row[0], bool(row[1]), bool(row[2]), row[3],
                        orjson.loads(row[4]) if row[4] else None)

    def insert(self, entry: SessionEntry) -> bool:
        self.conn.execute(_INSERT_ROUTING, tuple(rows.column_value(f, getattr(entry, f))
                                                 for f in rows.ROUTING_FIELDS))
        return self.conn.changes() == 1

    def patch(self, key: str, patch: RoutingPatch, *, session_id: str | None = None,
              if_current: RoutingPatch | None = None) -> None:
        guarded = if_current.changes() if if_current is not None else {}
        self.conn.execute(*self._patches.statement(key, patch.changes(), guarded, session_id))

    def add_usage(self, key: str, d: UsageDelta, updated_at: float | None,
                  session_id: str | None = None) -> None:
        self.conn.execute(*usage_update("?", "min", d, updated_at, key, session_id))

    def keys_active_since(self, since: float, keys: Sequence[str] | None = None) -> list[str]:
        found = [r[0] for r in self.conn.execute(
            "SELECT session_key FROM routing WHERE updated_at >= ? AND suspended = 0"
            " AND resume_pending = 0", (since,))]
        return found if keys is None else [k for k in found if k in set(keys)]

    def resume_candidates(self, since: float, keys: Sequence[str] | None = None) -> list[SessionEntry]:
        # Through the partial index on pending resumes.
        found = [rows.entry(r) for r in self.conn.execute(
            ENTRY_SELECT + " WHERE r.resume_pending = 1 AND r.updated_at >= ?"
            " AND r.suspended = 0", (since,))]
        return found if keys is None else [e for e in found if e.session_key in set(keys)]

    def idle_before(self, cutoff: float) -> list[str]:
        return [r[0] for r in self.conn.execute(
            "SELECT session_key FROM routing WHERE updated_at < ? AND suspended = 0 AND running = 0",
            (cutoff,))]

    def clear_running(self, keys: Sequence[str] | None = None) -> None:
        if keys is None:
            self.conn.execute("UPDATE routing SET running = 0 WHERE running = 1")
        else:
            self.conn.executemany("UPDATE routing SET running = 0 WHERE session_key = ? AND running = 1",
                                  [(k,) for k in keys])

    def delete(self, key: str) -> bool:
        self.conn.execute("DELETE FROM routing WHERE session_key = ?", (key,))
        return self.conn.changes() == 1

    def count(self) -> int:
        return one(self.conn.execute("SELECT count(*) FROM routing").fetchone())[0]


_INCARNATION = "SELECT session_id, session_key, created_at, ended_at, end_reason, turn_count, next_seq, rev" \
               " FROM incarnations WHERE session_id = ?"


class SqliteIncarnations:
    def __init__(self, conn: apsw.Connection):
        self.conn = conn

    def insert(self, session_id: str, key: str, created_at: float) -> None:
        self.conn.execute("INSERT INTO incarnations (session_id, session_key, created_at)"
                          " VALUES (?, ?, ?)", (session_id, key, created_at))

    def get(self, session_id: str) -> Incarnation | None:
        row = self.conn.execute(_INCARNATION, (session_id,)).fetchone()
        return Incarnation(*row) if row else None

    def end(self, session_id: str, reason: str, at: float) -> Incarnation | None:
        self.conn.execute("UPDATE incarnations SET ended_at = ?, end_reason = ?"
                          " WHERE session_id = ? AND ended_at IS NULL", (at, reason, session_id))
        return self.get(session_id)

    def reopen(self, session_id: str) -> None:
        self.conn.execute("UPDATE incarnations SET ended_at = NULL, end_reason = NULL"
                          " WHERE session_id = ?", (session_id,))

    def add_turn(self, session_id: str) -> None:
        self.conn.execute("UPDATE incarnations SET turn_count = turn_count + 1 WHERE session_id = ?",
                          (session_id,))

    def bump_rev(self, session_id: str) -> None:
        self.conn.execute("UPDATE incarnations SET rev = rev + 1 WHERE session_id = ?", (session_id,))

    def of_key(self, key: str) -> list[str]:
        return [r[0] for r in self.conn.execute(
            "SELECT session_id FROM incarnations WHERE session_key = ?", (key,))]


class SqliteRestarts:
    def __init__(self, conn: apsw.Connection):
        self.conn = conn

    def keep_only(self, keys: Iterable[str]) -> None:
        self.conn.execute("DELETE FROM restart_counts WHERE session_key NOT IN"
                          " (SELECT value FROM json_each(?))", (orjson.dumps(list(keys)),))

    def increment(self, key: str, at: float) -> int:
        self.conn.execute("INSERT INTO restart_counts (session_key, count, updated_at) VALUES (?, 1, ?)"
                          " ON CONFLICT (session_key) DO UPDATE SET count = count + 1, updated_at = ?",
                          (key, at, at))
        return one(self.conn.execute("SELECT count FROM restart_counts WHERE session_key = ?",
                                     (key,)).fetchone())[0]

    def reset(self, key: str) -> None:
        self.conn.execute("DELETE FROM restart_counts WHERE session_key = ?", (key,))


class SqliteTurnState:
    def __init__(self, conn: apsw.Connection):
        self.conn = conn

    def put(self, session_id: str, request_id: str, at: float, state: dict[str, Any]) -> None:
        self.conn.execute("INSERT INTO turn_state (session_id, request_id, updated_at, state)"
                          " VALUES (?, ?, ?, ?) ON CONFLICT (session_id) DO UPDATE SET"
                          " request_id = excluded.request_id, updated_at = excluded.updated_at,"
                          " state = excluded.state", (session_id, request_id, at, orjson.dumps(state)))

"""PostgreSQL repositories of the lanes: routing rows, incarnations,
stuck-loop counters, turn state (unit_of_work.RoutingRepo and friends).

Isolation against the other sidecars of the cluster comes from row locks:
``routing.get`` reads the row ``FOR UPDATE``, so a job's read-then-write of a
lane (get-or-create, reset, the flags of a turn's end) is atomic against every
other writer; a racing insert of the same key meets ON CONFLICT.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from ..records import Incarnation, LaneHead, RoutingPatch, SessionEntry, UsageDelta
from ..statements import ENTRY_SELECT, RoutingPatches, one, usage_update
from . import rows

_INSERT_ROUTING = ("INSERT INTO routing (" + ", ".join(rows.ROUTING_FIELDS) + ") VALUES ("
                   + ", ".join("%s" for _ in rows.ROUTING_FIELDS) + ") ON CONFLICT DO NOTHING RETURNING true")


class PostgresRouting:
    def __init__(self, conn: psycopg.Connection):
        self.conn = conn
        self.send = rows.sender(conn)
        self._patches = RoutingPatches("%s", rows.column_value)

    def get(self, key: str) -> SessionEntry | None:
        row = self.conn.execute(ENTRY_SELECT + " WHERE r.session_key = %s FOR UPDATE OF r",
                                (key,)).fetchone()
        return rows.entry(row) if row else None

    def head(self, key: str) -> LaneHead | None:
        row = self.conn.execute("SELECT session_id, suspended, resume_pending, created_at, origin"
                                " FROM routing WHERE session_key = %s FOR UPDATE", (key,)).fetchone()
        return LaneHead(*row) if row else None

    def insert(self, entry: SessionEntry) -> bool:
        cur = self.conn.execute(_INSERT_ROUTING, tuple(rows.column_value(f, getattr(entry, f))
                                                       for f in rows.ROUTING_FIELDS))
        return cur.fetchone() is not None

    def patch(self, key: str, patch: RoutingPatch, *, session_id: str | None = None,
              if_current: RoutingPatch | None = None) -> None:
        guarded = if_current.changes() if if_current is not None else {}
        self.send(*self._patches.statement(key, patch.changes(), guarded, session_id))  # no answer awaited

    def add_usage(self, key: str, d: UsageDelta, updated_at: float | None,
                  session_id: str | None = None) -> None:
        self.send(*usage_update("%s", "LEAST", d, updated_at, key, session_id))

    def keys_active_since(self, since: float, keys: Sequence[str] | None = None) -> list[str]:
        sql = "SELECT session_key FROM routing WHERE updated_at >= %s AND NOT suspended AND NOT resume_pending"
        if keys is None:
            return [r[0] for r in self.conn.execute(sql, (since,))]
        return [r[0] for r in self.conn.execute(sql + " AND session_key = ANY(%s)", (since, list(keys)))]

    def resume_candidates(self, since: float, keys: Sequence[str] | None = None) -> list[SessionEntry]:
        sql = ENTRY_SELECT + " WHERE r.resume_pending AND r.updated_at >= %s AND NOT r.suspended"
        if keys is None:
            return [rows.entry(r) for r in self.conn.execute(sql, (since,))]
        return [rows.entry(r) for r in self.conn.execute(sql + " AND r.session_key = ANY(%s)",
                                                          (since, list(keys)))]

    def idle_before(self, cutoff: float) -> list[str]:
        return [r[0] for r in self.conn.execute(
            "SELECT session_key FROM routing WHERE updated_at < %s AND NOT suspended AND NOT running",
            (cutoff,))]

    def clear_running(self, keys: Sequence[str] | None = None) -> None:
        if keys is None:
            self.send("UPDATE routing SET running = false WHERE running")
        else:
            self.send("UPDATE routing SET running = false WHERE running AND session_key = ANY(%s)",
                              (list(keys),))

    def delete(self, key: str) -> bool:
        return self.conn.execute("DELETE FROM routing WHERE session_key = %s RETURNING true",
                                 (key,)).fetchone() is not None

    def count(self) -> int:
        return one(self.conn.execute("SELECT count(*) FROM routing").fetchone())[0]


_INCARNATION = ("SELECT session_id, session_key, created_at, ended_at, end_reason, turn_count, next_seq,"
                " rev FROM incarnations WHERE session_id = %s")


class PostgresIncarnations:
    def __init__(self, conn: psycopg.Connection):
        self.conn = conn
        self.send = rows.sender(conn)

    def insert(self, session_id: str, key: str, created_at: float) -> None:
        self.send("INSERT INTO incarnations (session_id, session_key, created_at)"
                          " VALUES (%s, %s, %s)", (session_id, key, created_at))

    def get(self, session_id: str) -> Incarnation | None:
        row = self.conn.execute(_INCARNATION, (session_id,)).fetchone()
        return Incarnation(*row) if row else None

    def end(self, session_id: str, reason: str, at: float) -> Incarnation | None:
        row = self.conn.execute(
            "UPDATE incarnations SET ended_at = coalesce(ended_at, %s),"
            " end_reason = coalesce(end_reason, %s) WHERE session_id = %s"
            " RETURNING session_id, session_key, created_at, ended_at, end_reason, turn_count,"
            " next_seq, rev", (at, reason, session_id)).fetchone()
        return Incarnation(*row) if row else None

    def reopen(self, session_id: str) -> None:
        self.send("UPDATE incarnations SET ended_at = NULL, end_reason = NULL"
                          " WHERE session_id = %s", (session_id,))

    def add_turn(self, session_id: str) -> None:
        self.send("UPDATE incarnations SET turn_count = turn_count + 1 WHERE session_id = %s",
                          (session_id,))

    def bump_rev(self, session_id: str) -> None:
        self.send("UPDATE incarnations SET rev = rev + 1 WHERE session_id = %s", (session_id,))

    def of_key(self, key: str) -> list[str]:
        return [r[0] for r in self.conn.execute(
            "SELECT session_id FROM incarnations WHERE session_key = %s", (key,))]


class PostgresRestarts:
    def __init__(self, conn: psycopg.Connection):
        self.conn = conn
        self.send = rows.sender(conn)

    def keep_only(self, keys: Iterable[str]) -> None:
        self.send("DELETE FROM restart_counts WHERE NOT (session_key = ANY(%s))", (list(keys),))

    def increment(self, key: str, at: float) -> int:
        return one(self.conn.execute(
            "INSERT INTO restart_counts AS r (session_key, count, updated_at) VALUES (%s, 1, %s)"
            " ON CONFLICT (session_key) DO UPDATE SET count = r.count + 1, updated_at = excluded.updated_at"
            " RETURNING count", (key, at)).fetchone())[0]

    def reset(self, key: str) -> None:
        self.send("DELETE FROM restart_counts WHERE session_key = %s", (key,))


class PostgresTurnState:
    def __init__(self, conn: psycopg.Connection):
        self.conn = conn
        self.send = rows.sender(conn)

    def put(self, session_id: str, request_id: str, at: float, state: dict[str, Any]) -> None:
        self.send("INSERT INTO turn_state (session_id, request_id, updated_at, state)"
                          " VALUES (%s, %s, %s, %s) ON CONFLICT (session_id) DO UPDATE SET"
                          " request_id = excluded.request_id, updated_at = excluded.updated_at,"
                          " state = excluded.state", (session_id, request_id, at, Jsonb(state)))

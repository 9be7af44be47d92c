"""The SQLite unit of work: every repository of unit_of_work.UnitOfWork over the
writer process's one connection.

Atomicity and isolation come from the writer process: one job at a time on
one connection, inside the group's ``BEGIN IMMEDIATE`` transaction and the
job's own savepoint (store/writer/group.py). ``routing.get`` needs no row
lock: nothing else writes while a job runs.
"""

from __future__ import annotations

import contextlib
import time

import apsw

from .connection import check_headroom, is_fault
from .lanes import SqliteIncarnations, SqliteRestarts, SqliteRouting, SqliteTurnState
from .ledger import SqliteFrames, SqliteLedger, SqliteQueue
from .messages import SqliteMessages

_LANE_TABLES = ("routing", "incarnations", "messages", "turn_state", "frames", "frame_keys", "prompts",
                "prompt_queue", "restart_counts")


class SqliteUnitOfWork:
    def __init__(self, conn: apsw.Connection):
        self.conn = conn
        self.routing = SqliteRouting(conn)
        self.incarnations = SqliteIncarnations(conn)
        self.messages = SqliteMessages(conn)
        self.ledger = SqliteLedger(conn)
        self.queue = SqliteQueue(conn)
        self.frames = SqliteFrames(conn)
        self.restarts = SqliteRestarts(conn)
        self.turn_state = SqliteTurnState(conn)
        self.leases = None  # one sidecar per file: no cluster, no leases
        self.nodes = None
        self.node_id = ""

    @contextlib.contextmanager
    def savepoint(self):
        """A nested atomic step inside the job: undone alone if it raises."""
        with self.conn:
            yield

    def is_fault(self, e: BaseException) -> bool:
        return is_fault(e)

    def delete_lane(self, key: str) -> None:
        sids = self.incarnations.of_key(key)
        self.messages.delete_sessions(sids)
        for sid in sids:
            self.conn.execute("DELETE FROM turn_state WHERE session_id = ?", (sid,))
        self.conn.execute("DELETE FROM incarnations WHERE session_key = ?", (key,))
        self.frames.delete_key(key)
        self.ledger.delete_key(key)
        self.restarts.reset(key)
        self.routing.delete(key)

    def clear_all(self) -> int:
        n = self.routing.count()
        self.conn.execute("INSERT INTO messages_fts (messages_fts) VALUES ('delete-all')")
        self.messages.set_index_mark(0)  # nothing indexed: the delete trigger stays quiet
        for table in _LANE_TABLES:
            self.conn.execute(f"DELETE FROM {table}")
        return n

    def index_messages(self, limit: int | None = None) -> int:
        return self.messages.index_pending(limit)

    def announce(self, op: str, keys) -> None:
        """One sidecar per file: nobody else to tell."""

    def probe(self) -> None:
        """A retry round's write: one real row, so its commit needs the WAL to
        take a page as every write does; and, on a filesystem that ran full,
        some headroom (connection.check_headroom)."""
        check_headroom(self.conn.filename)
        self.conn.execute("INSERT INTO meta (key, value) VALUES ('store_probe', ?)"
                          " ON CONFLICT (key) DO UPDATE SET value = excluded.value", (time.time(),))

"""The PostgreSQL unit of work: every repository of unit_of_work.UnitOfWork over
the writer process's connection, inside its transaction (connection.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import orjson
import psycopg

from . import rows
from .cluster import PostgresLeases, PostgresNodes
from .connection import CONTROL_CHANNEL, aborted, announce_payload, forget_prepared, is_fault, settle
from .lanes import PostgresIncarnations, PostgresRestarts, PostgresRouting, PostgresTurnState
from .ledger import PostgresFrames, PostgresLedger, PostgresQueue
from .messages import PostgresMessages

NOTIFY_BYTES = 7000  # a NOTIFY payload must stay under 8000 bytes: more keys, more notifications
_LANE_TABLES = ("routing", "incarnations", "messages", "turn_state", "frames", "prompts",
                "prompt_queue", "restart_counts", "leases")
# Every table, none read: fails while one is missing or out of the role's reach (connection.DAMAGE).
_EVERY_TABLE = " UNION ALL ".join(f"(SELECT 1 FROM {t} LIMIT 0)" for t in (*_LANE_TABLES, "meta", "nodes"))


class PostgresUnitOfWork:
    def __init__(self, conn: psycopg.Connection, node_id: str = ""):
        self.node_id = node_id
        self.pipeline: psycopg.Pipeline | None = None  # the writer's group runs in pipeline mode
        self._savepoints = 0
        self.bind(conn)

    def bind(self, conn: psycopg.Connection) -> None:
        """Every repository on ``conn`` (the writer's connection; again after it reconnected)."""
        self.conn = conn
        self.send = rows.sender(conn)
        self.routing = PostgresRouting(conn)
        self.incarnations = PostgresIncarnations(conn)
        self.messages = PostgresMessages(conn)
        self.ledger = PostgresLedger(conn)
        self.queue = PostgresQueue(conn)
        self.frames = PostgresFrames(conn)
        self.restarts = PostgresRestarts(conn)
        self.turn_state = PostgresTurnState(conn)
        self.leases = PostgresLeases(conn, self.frames.order)
        self.nodes = PostgresNodes(conn)

    def begin(self, pipeline: psycopg.Pipeline | None = None) -> None:
        """A new transaction of the writer process (in ``pipeline`` mode)."""
        self.pipeline = pipeline
        self._savepoints = 0
        self.frames.begin()

    def end(self) -> None:
        self.pipeline = None

    @contextlib.contextmanager
    def savepoint(self):
        """In the writer's pipeline: plain SAVEPOINT / RELEASE with one sync at
        the end, so the block's errors are raised inside the block (psycopg's
        nested transaction() syncs on the way in and out: four round trips)."""
        pipeline = self.pipeline
        mark = self.frames.mark()
        if pipeline is None:
            try:
                with self.conn.transaction():
                    yield
            except BaseException:
                self.frames.undone(mark)
                raise
            return
        self._savepoints += 1
        name = f"uow_{self._savepoints}"
        self.send(f"SAVEPOINT {name}")
        try:
            yield
            self.send(f"RELEASE SAVEPOINT {name}")
            pipeline.sync()
        except BaseException:
            self.frames.undone(mark)
            settle(pipeline)
            failed = aborted(self.conn)
            self.send(f"ROLLBACK TO SAVEPOINT {name}")
            if failed:
                forget_prepared(self.conn)
            self.send(f"RELEASE SAVEPOINT {name}")
            pipeline.sync()
            raise

    def is_fault(self, e: BaseException) -> bool:
        return is_fault(e)

    def delete_lane(self, key: str) -> None:
        sids = self.incarnations.of_key(key)
        self.messages.delete_sessions(sids)
        self.send("DELETE FROM turn_state WHERE session_id = ANY(%s)", (sids,))
        self.send("DELETE FROM incarnations WHERE session_key = %s", (key,))
        self.frames.delete_key(key)
        self.ledger.delete_key(key)
        self.restarts.reset(key)
        self.routing.delete(key)

    def clear_all(self) -> int:
        n = self.routing.count()
        self.send("TRUNCATE " + ", ".join(t for t in _LANE_TABLES if t != "leases"))
        return n

    def index_messages(self, limit: int | None = None) -> int:
        return 0

    def probe(self) -> None:
        """One row written, and every table looked at: a schema damaged by hand
        keeps the store failing until it is repaired, instead of a write
        that happens to miss the damage calling it writable again."""
        self.send(_EVERY_TABLE)
        self.send("INSERT INTO meta (key, value) VALUES ('store_probe', to_jsonb(extract(epoch"
                          " FROM now()))) ON CONFLICT (key) DO UPDATE SET value = excluded.value")

    def announce(self, op: str, keys: Sequence[str]) -> None:
        """NOTIFY the control channel: delivered to every listening sidecar at
        COMMIT, never for a transaction (or savepoint) rolled back. Many keys
        are split over several payloads, each under PostgreSQL's limit."""
        for chunk in _chunks(list(keys), NOTIFY_BYTES):
            self.send("SELECT pg_notify(%s, %s)",
                              (CONTROL_CHANNEL, announce_payload(op, chunk, self.node_id)))


def _chunks(keys: list[str], budget: int) -> list[list[str]]:
    """``keys`` in runs whose JSON stays within ``budget`` bytes (at least one
    run, empty for no keys)."""
    out: list[list[str]] = [[]]
    size = 0
    for key in keys:
        n = len(orjson.dumps(key)) + 1
        if out[-1] and size + n > budget:
            out.append([])
            size = 0
        out[-1].append(key)
        size += n
    return out

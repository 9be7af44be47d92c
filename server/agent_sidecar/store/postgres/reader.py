"""What a worker process reads from a PostgreSQL store (interface.TranscriptReader):
one autocommit connection per worker, opened on first use.

A connection the server lost (a restart, an outage, a failover, an operator's
pg_terminate_backend) is only found out by using it: its first statement
fails. The read then runs once more on a new connection, so the first turn a
worker runs after the database came back does not fail for the connection it
opened before. If the database cannot be reached at all the read raises
``StoreUnavailable``: the turn fails STORE_UNAVAILABLE (retry later), not as a
model failure."""

from __future__ import annotations

import logging
from typing import Any

import psycopg

from . import reads
from .connection import connect, is_fault, unavailable

log = logging.getLogger("agent_sidecar.store")


class PostgresTranscriptReader:
    def __init__(self, dsn: str):
        self.dsn = dsn
        self._conn: psycopg.Connection | None = None

    def load_for_model(self, session_id: str) -> list[dict[str, Any]]:
        for last in (False, True):
            try:
                return reads.load_for_model(self._connection(), session_id)
            except psycopg.Error as e:
                if not is_fault(e):
                    raise
                fresh = self._conn is None
                self.close()
                if last or fresh:  # a new connection failed too: the database is out of reach
                    log.warning("store read failed", extra={"error": f"{type(e).__name__}: {e}"})
                    raise unavailable(e) from None
        raise AssertionError("unreachable")

    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = None
            self._conn = connect(self.dsn, autocommit=True)
        return self._conn

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass


def open_reader(dsn: str) -> PostgresTranscriptReader:
    return PostgresTranscriptReader(dsn)

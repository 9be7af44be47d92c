"""What a worker process reads from a PostgreSQL store (interface.TranscriptReader):
one autocommit connection per worker, opened on first use, reopened after a
lost connection."""

from __future__ import annotations

from typing import Any

import psycopg

from . import reads
from .connection import connect


class PostgresTranscriptReader:
    def __init__(self, dsn: str):
        self.dsn = dsn
        self._conn: psycopg.Connection | None = None

    def load_for_model(self, session_id: str) -> list[dict[str, Any]]:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self.dsn, autocommit=True)
        return reads.load_for_model(self._conn, session_id)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def open_reader(dsn: str) -> PostgresTranscriptReader:
    return PostgresTranscriptReader(dsn)

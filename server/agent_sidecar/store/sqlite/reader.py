"""What a worker process reads from an SQLite store (interface.TranscriptReader):
a live transcript in the model's chat shape, when its agent cache misses. One
read-only connection per worker, opened on first use."""

from __future__ import annotations

from typing import Any

import apsw

from . import reads
from .connection import open_reader as _open


class SqliteTranscriptReader:
    def __init__(self, path: str):
        self.path = path
        self._conn: apsw.Connection | None = None

    def load_for_model(self, session_id: str) -> list[dict[str, Any]]:
        if self._conn is None:
            self._conn = _open(self.path)
        with self._conn:
            messages = reads.load_for_model(self._conn, session_id)
        return messages

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def open_reader(path: str) -> SqliteTranscriptReader:
    """The worker's entry (SqliteStore.reader_spec)."""
    return SqliteTranscriptReader(path)

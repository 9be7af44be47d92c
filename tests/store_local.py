"""A store opened in the test process, for tests of store jobs and of the
SQLite backend itself: a real, migrated SQLite file, jobs run on its unit of
work the way the writer process runs them (one transaction each), reads
through the backend's own read functions."""

from __future__ import annotations

import contextlib
from pathlib import Path

from agent_sidecar.store.sqlite import reads
from agent_sidecar.store.sqlite.connection import open_writer
from agent_sidecar.store.sqlite.schema import migrate
from agent_sidecar.store.sqlite.uow import SqliteUnitOfWork


class LocalStore:
    def __init__(self, path: Path | str):
        self.conn = open_writer(str(path))
        migrate(self.conn)
        self.uow = SqliteUnitOfWork(self.conn)

    def job(self, fn, *args):
        """``fn(uow, *args)`` in a transaction of its own; its result."""
        with self.conn:
            return fn(self.uow, *args)

    def read(self, name: str, *args):
        """``store.sqlite.reads.<name>(conn, *args)``: what the Store's read returns."""
        with self.conn:
            return getattr(reads, name)(self.conn, *args)

    def close(self) -> None:
        self.conn.close()


@contextlib.contextmanager
def local_store(path: Path | str):
    s = LocalStore(path)
    try:
        yield s
    finally:
        s.close()

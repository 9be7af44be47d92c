"""``Store``: the writer plus reader connections, opened on one database file.

Reads come in two speeds. ``read(fn)`` runs on the calling thread with that
thread's own read-only connection: indexed lookups take microseconds, so the
event loop does them inline rather than paying a thread hop. ``read_async(fn)``
runs on a small thread pool for reads that may touch many rows (transcripts,
search, listings), so a large read never stalls the loop.

The store sits behind this small interface (run / read) so that a PostgreSQL
backend with per-session leases can come later (DECISIONS.md, "Scale beyond one
machine") without touching the domain code above it.
"""

from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import apsw

from .db import open_reader, open_writer
from .migrations import migrate
from .writer import GroupCommitWriter, StoreClosed

__all__ = ["Store", "StoreClosed"]


class Store:
    def __init__(self, path: str, synchronous: str = "FULL", read_threads: int = 4):
        self.path = os.fspath(path)
        conn = open_writer(self.path, synchronous)
        self.migrated = migrate(conn)  # before the writer thread takes the connection
        self.writer = GroupCommitWriter(conn)
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(max_workers=read_threads, thread_name_prefix="store-read")
        self._readers: list[apsw.Connection] = []
        self._readers_lock = threading.Lock()

    # -- writes -----------------------------------------------------------

    def submit(self, fn: Callable[[apsw.Connection], Any]) -> asyncio.Future:
        return self.writer.submit(fn)

    async def write(self, fn: Callable[[apsw.Connection], Any]) -> Any:
        return await self.writer.submit(fn)

    # -- reads ------------------------------------------------------------

    def _reader(self) -> apsw.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = open_reader(self.path)
            self._local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    def read(self, fn: Callable[[apsw.Connection], Any]) -> Any:
        """A short read on this thread's reader, in one read transaction."""
        conn = self._reader()
        with conn:
            return fn(conn)

    async def read_async(self, fn: Callable[[apsw.Connection], Any]) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self.read, fn)

    # -- lifecycle ----------------------------------------------------------

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        with self._readers_lock:
            for conn in self._readers:
                try:
                    conn.close()
                except apsw.Error:
                    pass
            self._readers.clear()
        self.writer.close()

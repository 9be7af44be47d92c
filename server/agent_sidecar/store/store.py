"""``Store``: the writer process plus reader connections, on one database file.

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
from .faults import StoreUnavailable, is_store_fault, unavailable
from .migrations import migrate
from .writer import GroupCommitWriter, StoreClosed

__all__ = ["Store", "StoreClosed", "StoreUnavailable"]


class Store:
    """``await start()`` before writing; ``await close()`` at the end."""

    def __init__(self, path: str, synchronous: str = "FULL", read_threads: int = 4,
                 log_format: str = "json", log_level: str = "info",
                 on_lost: Callable[[], None] | None = None):
        self.path = os.fspath(path)
        conn = open_writer(self.path, synchronous)
        try:
            self.migrated = migrate(conn)  # before the writer process opens it
        finally:
            conn.close()
        self.writer = GroupCommitWriter(self.path, synchronous, log_format, log_level, on_lost)
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(max_workers=read_threads, thread_name_prefix="store-read")
        self._readers: list[apsw.Connection] = []
        self._readers_lock = threading.Lock()

    async def start(self) -> None:
        """Spawn the writer process (before any gRPC thread exists)."""
        await self.writer.start()

    # -- writes -----------------------------------------------------------

    def submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future:
        """``fn(conn, *args)`` in the writer process: ``fn`` must be a
        module-level function and ``args`` picklable plain data."""
        return self.writer.submit(fn, *args)

    def send_now(self, fn: Callable[..., Any], args: tuple,
                 on_done: Callable[[bool, Any], None], retry: bool = False) -> None:
        """``submit`` for aggregators; see GroupCommitWriter.send_now."""
        self.writer.send_now(fn, args, on_done, retry)

    async def write(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await self.writer.submit(fn, *args)

    async def barrier(self) -> None:
        """Returns once every write submitted before it has committed."""
        await self.writer.submit(_nothing)

    # -- when it cannot write (faults.py) --------------------------------------

    @property
    def fault(self) -> StoreUnavailable | None:
        """What keeps the store from writing now, or None when it can."""
        return self.writer.faults.fault

    def check_writable(self) -> None:
        """Raise StoreUnavailable while the store is failing: for callers that
        would change state in memory before their first write."""
        if self.writer.closed:
            raise StoreClosed("the store is closed")
        self.writer.faults.refuse()

    def watch_faults(self, listener: Callable[[StoreUnavailable | None], None]) -> None:
        """``listener(fault)`` when the store starts failing, ``listener(None)``
        when it can write again."""
        self.writer.faults.listen(listener)

    def add_retrier(self, retrier: Callable[[], None]) -> None:
        """``retrier()`` at each retry round while the store is failing; it
        re-sends what it holds with ``send_now(..., retry=True)``."""
        self.writer.faults.add_retrier(retrier)

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
        """A short read on this thread's reader, in one read transaction. A
        store fault (an I/O error) surfaces as StoreUnavailable, as for writes."""
        conn = self._reader()
        try:
            with conn:
                return fn(conn)
        except apsw.Error as e:
            if is_store_fault(e):
                raise unavailable(e) from e
            raise

    async def read_async(self, fn: Callable[[apsw.Connection], Any]) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self.read, fn)

    # -- lifecycle ----------------------------------------------------------

    async def close(self) -> None:
        self._pool.shutdown(wait=True)
        with self._readers_lock:
            for conn in self._readers:
                try:
                    conn.close()
                except apsw.Error:
                    pass
            self._readers.clear()
        await self.writer.close()


def _nothing(conn) -> None:
    return None

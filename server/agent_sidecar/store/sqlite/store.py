"""``SqliteStore``: the embedded backend — one database file, the writer
process for every write, read-only connections for reads (interface.Store).

Reads come in two speeds. Indexed lookups (an entry, a ledger row) take
microseconds, so they run inline on the event loop's thread with that
thread's own read-only connection, rather than paying a thread hop. Reads that
may touch many rows (transcripts, search, listings, frame replays) run on a
small thread pool, so a large read never stalls the loop. Every read is one
snapshot (one read transaction). A store fault on a read (an I/O error)
surfaces as StoreUnavailable, as for writes.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import apsw

from ..interface import StoreOpenError
from ..jobs import index_messages
from ..records import FrameRecord, LedgerEntry, Message, SearchHit, SessionEntry, StoreStats
from ..writer.backed import WriterBacked
from ..writer.client import CommitStats, GroupCommitWriter
from . import reads
from .connection import DAMAGE, is_fault, open_reader, open_writer, unavailable
from .schema import migrate


class SqliteStore(WriterBacked):
    """``await start()`` before writing; ``await close()`` at the end."""

    def __init__(self, path: str, synchronous: str = "FULL", *, preload: tuple[str, ...] = (),
                 read_threads: int = 4, log_format: str = "json", log_level: str = "info",
                 library_log_level: str = "warning", on_lost: Callable[[], None] | None = None):
        self.path = os.fspath(path)
        try:
            conn = open_writer(self.path, synchronous)
            try:
                self.migrated = migrate(conn)  # before the writer process opens it
            finally:
                conn.close()
        except apsw.Error as e:  # a file that is no store, a full disk, a locked file
            if is_fault(e) and not isinstance(e, DAMAGE):  # damage found at open: no retry cures it
                raise unavailable(e) from None
            raise StoreOpenError(f"cannot open the store {self.path}: {e}") from None
        self.writer = GroupCommitWriter(
            ("agent_sidecar.store.sqlite.connection:open_backend", (self.path, synchronous)),
            preload, log_format, log_level, library_log_level, on_lost)
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(max_workers=read_threads, thread_name_prefix="store-read")
        self._readers: list[apsw.Connection] = []
        self._readers_lock = threading.Lock()

    async def start(self) -> None:
        """Spawn the writer process (before any gRPC thread exists)."""
        await self.writer.start()

    # -- writes: WriterBacked (store/writer/backed.py) ----------------------------------

    # -- reads -----------------------------------------------------------------------------

    def _reader(self) -> apsw.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = open_reader(self.path)
            self._local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    def _read(self, fn: Callable[..., Any], *args: Any) -> Any:
        conn = self._reader()
        try:
            with conn:
                return fn(conn, *args)
        except apsw.Error as e:
            if is_fault(e):
                raise unavailable(e) from None
            raise

    async def _read_off_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._read, fn, *args)

    async def entry(self, key: str) -> SessionEntry | None:
        return self._read(reads.entry, key)

    async def session_key_of(self, session_id: str) -> str | None:
        return self._read(reads.session_key_of, session_id)

    async def list_entries(self, *, platform: str = "", active_since: float | None = None,
                           after: tuple[float, str] | None = None, limit: int = 100) -> list[SessionEntry]:
        return await self._read_off_loop(reads.list_entries, platform, active_since, after, limit)

    async def transcript(self, session_id: str, *, include_rewound: bool = False, after_seq: int = 0,
                         limit: int | None = None) -> list[Message]:
        return await self._read_off_loop(reads.transcript, session_id, include_rewound, after_seq, limit)

    async def search(self, query: str, *, session_key: str = "", limit: int = 20) -> list[SearchHit]:
        """Every message written before the call is searchable: the index
        catches up first (skipped while the store cannot write: the search
        then answers from the index as it is)."""
        if self.writable:
            await self.write(index_messages)
        return await self._read_off_loop(reads.search, query, session_key, limit)

    async def ledger(self, request_id: str) -> LedgerEntry | None:
        return self._read(reads.ledger, request_id)

    async def lease_holder(self, key: str) -> None:
        return None  # one sidecar per file: every lane is its own

    async def recent_requests(self, since: float, limit: int) -> list[tuple[str, float, str]]:
        return await self._read_off_loop(reads.recent_requests, since, limit)

    async def request_frames(self, request_id: str, after_seq: int = 0, *, after_cursor: int = 0,
                             limit: int = 0) -> list[FrameRecord]:
        return await self._read_off_loop(reads.request_frames, request_id, after_seq, after_cursor, limit)

    async def last_frame_cursor(self) -> int:
        return self._read(reads.last_frame_cursor)

    async def frames_after(self, cursor: int, *, session_key: str = "", platform: str = "",
                           limit: int = 1000) -> list[FrameRecord]:
        return await self._read_off_loop(reads.frames_after, cursor, session_key, platform, limit)

    async def stats(self) -> StoreStats:
        size = 0
        for path in (self.path, self.path + "-wal"):
            try:
                size += os.stat(path).st_size
            except OSError:
                pass
        return StoreStats("sqlite", size, await self._read_off_loop(reads.fts_backlog))

    @property
    def commit_stats(self) -> CommitStats:
        return self.writer.stats

    def reader_spec(self) -> tuple:
        """What a worker process opens to read transcripts (reader.py)."""
        return ("agent_sidecar.store.sqlite.reader:open_reader", (self.path,))

    # -- lifecycle ----------------------------------------------------------------------------

    async def close(self, timeout: float = 30.0) -> None:
        self._pool.shutdown(wait=True)
        with self._readers_lock:
            for conn in self._readers:
                try:
                    conn.close()
                except apsw.Error:
                    pass
            self._readers.clear()
        await self.writer.close(timeout)

"""``PostgresStore``: the store on a PostgreSQL database several sidecars share
(interface.Store).

Writes go through this sidecar's writer process (store/writer/: group commit,
one transaction per group, a savepoint per job) on its own connection; reads
through a pool of asyncio connections (pool.py), each read one statement.
Every sidecar of a cluster runs the same migrations at start (serialised by an
advisory lock: once). ``follow_cluster`` yields the highest frame cursor of each
commit any sidecar made and the announces of deletes (LISTEN/NOTIFY), for the
cluster tail (cluster/tail.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg_pool import PoolTimeout

from ..faults import StoreUnavailable
from ..interface import StoreOpenError
from ..records import FrameRecord, LeaseHolder, LedgerEntry, Message, SearchHit, SessionEntry, StoreStats
from ..writer.backed import WriterBacked
from ..writer.client import CommitStats, GroupCommitWriter
from . import reads
from .connection import (
    CHANNEL,
    CONTROL_CHANNEL,
    connect,
    connect_async,
    read_announce,
    server_refused,
    unavailable,
    unbounded,
    unbounded_async,
)
from .pool import ReadPool
from .schema import migrate

if TYPE_CHECKING:
    from ..records import ClusterOp

log = logging.getLogger("agent_sidecar.store")


class PostgresStore(WriterBacked):
    """``await start()`` before writing; ``await close()`` at the end."""

    def __init__(self, dsn: str, *, node_id: str = "", pool_size: int = 4,
                 preload: tuple[str, ...] = (), log_format: str = "json", log_level: str = "info",
                 library_log_level: str = "warning", on_lost: Callable[[], None] | None = None):
        self.dsn, self.node_id = dsn, node_id
        try:
            with connect(dsn, autocommit=True) as conn:
                refused = server_refused(conn)
                if refused is not None:
                    raise StoreOpenError(f"cannot open the PostgreSQL store: {refused}")
                unbounded(conn)  # a migration waits for the sidecar migrating before it, whatever the role says
                self.migrated = migrate(conn)
        except psycopg.OperationalError as e:
            raise StoreOpenError(f"cannot reach the PostgreSQL store: {e}") from None
        except psycopg.Error as e:
            raise StoreOpenError(f"cannot open the PostgreSQL store: {e}") from None
        self.writer = GroupCommitWriter(
            ("agent_sidecar.store.postgres.writer:open_backend", (dsn, node_id)),
            preload, log_format, log_level, library_log_level, on_lost)
        self._pool = ReadPool(dsn, pool_size, lambda: self.fault is not None)
        self.watch_faults(self._writes_changed)

    def _writes_changed(self, fault: StoreUnavailable | None) -> None:
        if fault is None:  # the database answers the writer again: reads wait for their connection
            self._pool.revive()

    async def start(self) -> None:
        """The writer and the reads' first connection. A database that takes
        no more connections (``max_connections``, a role's or a database's
        connection limit) ends the start with its reason (StoreOpenError)."""
        try:
            await asyncio.gather(self.writer.start(), self._pool.open())
        except PoolTimeout as e:
            raise StoreOpenError(f"cannot reach the PostgreSQL store: no read connection opened ({e})") from None

    # -- writes: WriterBacked (store/writer/backed.py) ----------------------------------

    # -- reads ------------------------------------------------------------------------------

    async def _read(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await self._pool.run(fn, *args)

    async def entry(self, key: str) -> SessionEntry | None:
        return await self._read(reads.entry, key)

    async def session_key_of(self, session_id: str) -> str | None:
        return await self._read(reads.session_key_of, session_id)

    async def list_entries(self, *, platform: str = "", active_since: float | None = None,
                           after: tuple[float, str] | None = None, limit: int = 100) -> list[SessionEntry]:
        return await self._read(reads.list_entries, platform, active_since, after, limit)

    async def transcript(self, session_id: str, *, include_rewound: bool = False, after_seq: int = 0,
                         limit: int | None = None) -> list[Message]:
        return await self._read(reads.transcript, session_id, include_rewound, after_seq, limit)

    async def search(self, query: str, *, session_key: str = "", limit: int = 20) -> list[SearchHit]:
        return await self._read(reads.search, query, session_key, limit)

    async def ledger(self, request_id: str) -> LedgerEntry | None:
        return await self._read(reads.ledger, request_id)

    async def lease_holder(self, key: str) -> LeaseHolder | None:
        return await self._read(reads.lease_holder, key)

    async def known_requests(self, request_ids: list[str]) -> set[str]:
        return await self._read(reads.known_requests, request_ids)

    async def reset_requests(self, request_ids: list[str]) -> set[str]:
        return await self._read(reads.reset_requests, request_ids)

    async def stopped_requests(self, request_ids: list[str], stuck_after: int) -> set[str]:
        return await self._read(reads.stopped_requests, request_ids, stuck_after)

    async def revoked_leases(self, keys: list[str]) -> set[str]:
        return await self._read(reads.revoked_leases, keys)

    async def recent_requests(self, since: float, limit: int) -> list[tuple[str, float, str]]:
        return await self._read(reads.recent_requests, since, limit)

    async def request_frames(self, request_id: str, after_seq: int = 0, *, after_cursor: int = 0,
                             limit: int = 0) -> list[FrameRecord]:
        return await self._read(reads.request_frames, request_id, after_seq, after_cursor, limit)

    async def frames_after(self, cursor: int, *, session_key: str = "", platform: str = "",
                           limit: int = 1000) -> list[FrameRecord]:
        return await self._read(reads.frames_after, cursor, session_key, platform, limit)

    async def stats(self) -> StoreStats:
        """The database's size; no index backlog (the tsvector column is written with each row)."""
        return StoreStats("postgres", await self._read(reads.database_size), 0)

    @property
    def commit_stats(self) -> CommitStats:
        return self.writer.stats

    def reader_spec(self) -> tuple:
        return ("agent_sidecar.store.postgres.reader:open_reader", (self.dsn,))

    async def last_frame_cursor(self) -> int:
        return await self._read(reads.last_frame_cursor)

    async def follow_cluster(self, idle_s: float) -> AsyncGenerator[int | ClusterOp, None]:
        """What every sidecar of the cluster commits (interface.SharedStore):
        a dedicated connection LISTENs on the frames and the control channels.
        Each ``idle_s`` it checks that the connection still answers (a lost
        one raises StoreUnavailable, even a silent one: the check is bounded)
        and yields 0, the caller's periodic catch-up."""
        try:
            conn = await connect_async(self.dsn, autocommit=True,
                                       application_name=follower_name(self.node_id))
        except Exception as e:
            raise unavailable(e) from None
        try:
            await unbounded_async(conn)  # it idles by design between notifications
            await conn.execute(f"LISTEN {CHANNEL}")
            await conn.execute(f"LISTEN {CONTROL_CHANNEL}")
            yield 0  # listening: whatever committed before is read by cursor
            while True:
                async for note in conn.notifies(timeout=idle_s):
                    if note.channel == CHANNEL:
                        yield int(note.payload)
                    else:
                        op = read_announce(note.payload)
                        if op is not None:
                            yield op
                async with asyncio.timeout(max(idle_s, 1.0)):
                    await conn.execute("SELECT 1")
                yield 0
        except (psycopg.Error, TimeoutError, OSError) as e:
            raise unavailable(e) from None
        finally:
            await conn.close()

    async def close(self, timeout: float = 30.0) -> None:
        await self._pool.close()
        await self.writer.close(timeout)


def follower_name(node_id: str) -> str:
    """The ``application_name`` of a sidecar's listening connection (pg_stat_activity)."""
    return f"agent-sidecar-follow:{node_id}"[:63]

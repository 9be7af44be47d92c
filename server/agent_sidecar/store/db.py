"""Opening connections: one place that sets the pragmas every connection needs."""

from __future__ import annotations

import apsw

# A writer that finds the database locked (doctor running, a reader checkpointing)
# waits this long before "database is locked" could surface; it never should.
BUSY_TIMEOUT_MS = 10_000


def open_writer(path: str, synchronous: str = "FULL") -> apsw.Connection:
    """The one read-write connection. WAL so readers never block it; ``synchronous``
    FULL (default) fsyncs the WAL on every commit, NORMAL leaves the last commits to
    the OS on power loss but still loses nothing on a process crash."""
    if synchronous.upper() not in ("FULL", "NORMAL"):
        raise ValueError("store.synchronous must be FULL or NORMAL")
    conn = apsw.Connection(path)
    conn.setbusytimeout(BUSY_TIMEOUT_MS)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous.upper()}")
    conn.execute("PRAGMA foreign_keys=OFF")
    conn.execute("PRAGMA temp_store=MEMORY")
    # SQLite's own PASSIVE autocheckpoint (every 1000 WAL pages) runs on the
    # committing connection, which is always the writer process's: readers never pay
    # for it. A 10x larger WAL measured slower: readers look pages up in a bigger
    # WAL index, and the fsyncs of a growing file cost more.
    conn.execute("PRAGMA wal_autocheckpoint=1000")
    # 32 MB of page cache (default 2 MB): the writer's random index leaves stay
    # cached instead of being read back from the OS on every commit.
    conn.execute("PRAGMA cache_size=-32768")
    return conn


def open_reader(path: str) -> apsw.Connection:
    """A read-only connection. Readers see the last committed state (WAL snapshot
    per statement or per explicit read transaction)."""
    conn = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    conn.setbusytimeout(BUSY_TIMEOUT_MS)
    conn.execute("PRAGMA query_only=1")
    return conn

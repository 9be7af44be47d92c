"""Opening SQLite connections (one place that sets the pragmas every connection
needs), and the writer process's side of the backend (``SqliteWriter``)."""

from __future__ import annotations

import errno
import os

import apsw

from ..faults import StoreUnavailable, is_store_fault
from ..faults import unavailable as store_failed

# A writer that finds the database locked (doctor running, a reader checkpointing)
# waits this long before "database is locked" could surface; it never should.
BUSY_TIMEOUT_MS = 10_000
# The driver's exceptions that mean "the store cannot write now" (faults.py).
# A damaged file (CorruptError, NotADBError) is one too: a call that reads or
# writes its damaged pages is refused STORE_UNAVAILABLE and health goes
# NOT_SERVING, as for a full disk, instead of INTERNAL; `agent-sidecar doctor`
# says what is damaged and how to recover.
DAMAGE = (apsw.CorruptError, apsw.NotADBError)
DRIVER_FAULTS = (apsw.FullError, apsw.IOError, apsw.ReadOnlyError, apsw.CantOpenError,
                 apsw.BusyError, *DAMAGE)
HEADROOM_BYTES = 4 << 20  # wal_autocheckpoint (1000 pages of 4 KiB): the WAL's size between checkpoints


def open_writer(path: str, synchronous: str = "FULL", *, one_thread: bool = False) -> apsw.Connection:
    """The one read-write connection. WAL so readers never block it; ``synchronous``
    FULL (default) fsyncs the WAL on every commit, NORMAL leaves the last commits to
    the OS on power loss but still loses nothing on a process crash.

    ``one_thread``: the connection of a process that has one thread (the store
    writer's: tests/store/test_store_writer.py checks it has), so SQLite's
    per-connection mutex is left out (``SQLITE_OPEN_NOMUTEX``), which every
    statement's prepare, bind, step and reset took and released. SQLite then
    requires that no two threads use the connection at once, and neither apsw nor
    SQLite checks it: a process that starts a thread must not pass it."""
    if synchronous.upper() not in ("FULL", "NORMAL"):
        raise ValueError("store.synchronous must be FULL or NORMAL")
    flags = apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE
    conn = apsw.Connection(path, flags=(flags | apsw.SQLITE_OPEN_NOMUTEX) if one_thread else flags)
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


def is_fault(e: BaseException) -> bool:
    return is_store_fault(e, DRIVER_FAULTS)


# What a caller is told when another process keeps the file locked past the busy
# timeout (DECISIONS.md: "database is locked" never reaches a user; the writer
# process logs the driver's own text with its "store commit failed" line).
BUSY = (f"the store is busy: another process has held the SQLite write lock for over"
        f" {BUSY_TIMEOUT_MS // 1000} s; retry later")


# What a caller is told of the other faults: the product's words, never SQLite's ("database
# or disk is full", "disk I/O error", "database disk image is malformed"); the log keeps those.
_FULL, _IO = "its disk is full", "its disk failed to read or write (an I/O error)"
_SAID = ((apsw.FullError, _FULL), (apsw.IOError, _IO), (apsw.ReadOnlyError, "its file cannot be written (read-only)"),
         (apsw.CantOpenError, "its file cannot be opened"),
         (DAMAGE, "its file is damaged (agent-sidecar doctor says what is damaged and how to recover)"))
_SAID_ERRNO = {errno.ENOSPC: _FULL, errno.EDQUOT: "its disk quota is used up", errno.EIO: _IO,
               errno.EROFS: "its file cannot be written (a read-only filesystem)"}


def unavailable(e: BaseException) -> StoreUnavailable:
    """A store fault of this backend as callers get it: in the product's
    words (a lock held past the busy timeout, a full disk, an I/O error, a
    damaged file), SQLite's own text as the error's ``cause``, for the log."""
    if isinstance(e, StoreUnavailable):
        return e
    cause = f"{type(e).__name__}: {e}"
    if isinstance(e, apsw.BusyError):
        return StoreUnavailable(BUSY, cause)
    what = _SAID_ERRNO.get(e.errno) if isinstance(e, OSError) and e.errno is not None else None
    for kind, words in _SAID:
        if what is None and isinstance(e, kind):
            what = words
    return StoreUnavailable(f"the store is unavailable: {what}; retry later", cause) if what else store_failed(e)


def check_headroom(path: str) -> None:
    """A small commit can succeed on a full disk (into WAL space a failed
    commit had allocated), and a store called writable again while the next
    write fails would flap; so a retry round's probe fails until the
    filesystem has room for a WAL's worth of pages between checkpoints
    (HEADROOM_BYTES, at most a tenth of a small filesystem)."""
    try:
        st = os.statvfs(os.path.dirname(os.path.abspath(path)))
    except OSError:  # no figures here: the commit alone decides
        return
    free, size = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    if free < min(HEADROOM_BYTES, size // 10):
        raise OSError(errno.ENOSPC, f"only {free} bytes free on the store's filesystem")


class SqliteWriter:
    """The writer process's backend: one connection, ``BEGIN IMMEDIATE``, a
    savepoint per job (process.WriterBackend)."""

    def __init__(self, path: str, synchronous: str):
        self.path = path
        self.conn = open_writer(path, synchronous, one_thread=True)  # this process has one thread

    def begin(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def commit(self) -> None:
        self.conn.execute("COMMIT")

    def rollback(self) -> None:
        self.conn.execute("ROLLBACK")

    def savepoint(self) -> None:
        self.conn.execute("SAVEPOINT job")

    def release(self) -> None:
        self.conn.execute("RELEASE job")

    def rollback_to(self) -> None:
        self.conn.execute("ROLLBACK TO job")

    def unit_of_work(self):
        from .uow import SqliteUnitOfWork
        return SqliteUnitOfWork(self.conn)

    def is_fault(self, e: BaseException) -> bool:
        return is_fault(e)

    def unavailable(self, e: BaseException) -> StoreUnavailable:
        return unavailable(e)

    def transient(self, e: BaseException) -> bool:
        return False  # one writer: nothing to conflict with

    def close(self) -> None:
        """The WAL checkpointed into the file and truncated, as a clean stop
        leaves it; when that cannot be done the log says why (what the WAL
        holds is durable: the next start's checkpoint takes it)."""
        import logging
        try:
            self.conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_TRUNCATE)
        except (apsw.BusyError, apsw.LockedError) as e:  # another connection reading, or writing past the busy timeout
            logging.getLogger("agent_sidecar.store").warning(
                "final WAL checkpoint incomplete: another connection held the database",
                extra={"error": str(e)})
        except apsw.Error as e:  # the disk: full, failing, read-only, a file size limit
            logging.getLogger("agent_sidecar.store").warning(
                "final WAL checkpoint failed", extra={"error": f"{type(e).__name__}: {e}"})
        self.conn.close()


def open_backend(path: str, synchronous: str) -> SqliteWriter:
    """The writer process's entry (process.writer_main's ``backend``)."""
    return SqliteWriter(path, synchronous)

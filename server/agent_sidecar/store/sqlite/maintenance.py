"""Maintenance of an SQLite store, sidecar running or not (``agent-sidecar
doctor``): integrity, the full-text index's check and rebuild, a checkpoint,
a summary. Canonical rows are never touched: the index is derived and can be
dropped and rebuilt from ``messages`` at any time.

A store another writer keeps locked past the busy timeout raises
``StoreLocked`` (nothing was checked or changed); a file that is no store
raises ``NotAStore``; a store whose pages are damaged fails its integrity
check, and a step that cannot read past the damage raises ``StoreDamaged``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

import apsw

from ... import data_dir_lock
from ..statements import one
from .backup import BackupError, backup
from .connection import BUSY_TIMEOUT_MS, DAMAGE
from .messages import SqliteMessages
from .schema import FTS_SCHEMA, MIGRATIONS, applied_versions, migrate

BATCH = 5000


class StoreLocked(RuntimeError):
    """Another writer held the store past the busy timeout."""


class NotAStore(RuntimeError):
    """The file cannot be opened as a store."""


class StoreDamaged(RuntimeError):
    """SQLite found the file's pages damaged where a step had to read them."""


class SqliteMaintenance:
    def __init__(self, db_path: str):
        self.path = db_path
        try:
            self.conn = apsw.Connection(db_path)
            self.conn.setbusytimeout(BUSY_TIMEOUT_MS)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self._refuse_to_migrate_a_running_store()
            migrate(self.conn)
        except apsw.BusyError:
            raise StoreLocked(self._locked()) from None
        except apsw.Error as e:
            raise NotAStore(f"cannot open {db_path}: {e}") from None
        self.messages = SqliteMessages(self.conn)

    def _refuse_to_migrate_a_running_store(self) -> None:
        """A store that lacks migrations of this release while a sidecar runs on
        it belongs to an older running release (this one installed over it, the
        service not restarted yet): migrating it would change its tables under
        that sidecar. Nothing is checked or changed; its own restart migrates it."""
        pending = sorted({v for v, _, _ in MIGRATIONS} - applied_versions(self.conn))
        if pending and self._sidecar_running():
            self.conn.close()
            raise StoreLocked(f"the sidecar running on {self.path} is an older release (its store lacks"
                              f" migration(s) {', '.join(map(str, pending))} of this one): nothing was checked"
                              " or changed; restart it as this release first, or use its own doctor")

    def _locked(self) -> str:
        return (f"{self.path} stayed locked by another writer for {BUSY_TIMEOUT_MS // 1000} s;"
                " nothing was checked or changed, try again")

    def _guard(self, fn: Callable, *args):
        try:
            return fn(*args)
        except apsw.BusyError:
            raise StoreLocked(self._locked()) from None
        except DAMAGE as e:
            raise StoreDamaged(f"{self.path} is damaged ({e}); restore it from a backup, or salvage"
                               f" what is readable with `sqlite3 {self.path} .recover`") from None

    def integrity(self) -> list[str]:
        """SQLite's integrity check of the whole file: ``["ok"]`` when healthy,
        else what it found (damage that stops the check itself included)."""
        try:
            return self._guard(lambda: [r[0] for r in self.conn.execute("PRAGMA integrity_check")])
        except StoreDamaged as e:
            return [str(e)]

    def fts_check(self) -> tuple[bool, str]:
        """FTS5's own integrity check, which compares the index with every
        message. The sidecar indexes in batches, so the messages it has not
        indexed yet go in first, in the same write transaction: nothing can
        add one between the catch-up and the check.

        That transaction holds the store's write lock for the whole check,
        which grows with the index (about 16 s for 2 million messages): next
        to a running sidecar its writer would wait, and past its busy timeout
        refuse writes (STORE_UNAVAILABLE). So with a sidecar on the data dir
        the check runs on a snapshot of the store (backup.py: a read
        transaction only) in a temporary directory beside it, removed after."""
        if not self._sidecar_running():
            return self._guard(self._fts_check)
        with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(self.path)),
                                         prefix=".doctor-") as tmp:
            snapshot = os.path.join(tmp, "snapshot.db")
            try:
                backup(self.path, snapshot)
            except BackupError as e:
                raise StoreLocked(f"cannot check the full-text index of the running sidecar's store: no snapshot"
                                  f" of it ({e}); stop the sidecar and run doctor again") from None
            copy = SqliteMaintenance(snapshot)
            try:
                return copy._guard(copy._fts_check)
            finally:
                copy.close()

    def _sidecar_running(self) -> bool:
        """A sidecar holds its data dir's lock while it runs (data_dir_lock.py)."""
        return data_dir_lock.held(os.path.dirname(os.path.abspath(self.path)))

    def _fts_check(self) -> tuple[bool, str]:
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except apsw.BusyError:
            raise
        except apsw.Error as e:
            return False, str(e)
        try:
            self.messages.index_pending()
            self.conn.execute("INSERT INTO messages_fts (messages_fts, rank) VALUES ('integrity-check', 1)")
        except apsw.BusyError:
            self.conn.execute("ROLLBACK")
            raise
        except apsw.Error as e:
            self.conn.execute("ROLLBACK")
            return False, str(e)
        self.conn.execute("COMMIT")
        return True, "ok"

    def message_count(self) -> int:
        return self._guard(lambda: one(self.conn.execute("SELECT count(*) FROM messages").fetchone())[0])

    def rebuild_fts(self, advance: Callable[[int], None] | None = None) -> int:
        """Drop and rebuild the derived index in batches (``advance(n)`` after
        each); returns the rows indexed."""
        return self._guard(self._rebuild_fts, advance)

    def _rebuild_fts(self, advance) -> int:
        with self.conn:
            self.conn.execute("DROP TRIGGER IF EXISTS messages_fts_insert")
            self.conn.execute("DROP TRIGGER IF EXISTS messages_fts_delete")
            self.conn.execute("DROP TABLE IF EXISTS messages_fts")
            self.conn.execute(FTS_SCHEMA)  # indexed up to id 0
        done = 0
        while True:
            with self.conn:
                n = self.messages.index_pending(BATCH)
            if not n:
                return done
            done += n
            if advance is not None:
                advance(n)

    def checkpoint(self) -> tuple[int, int]:
        """A PASSIVE WAL checkpoint: (pages in the WAL, pages checkpointed)."""
        return self._guard(self.conn.wal_checkpoint, None, apsw.SQLITE_CHECKPOINT_PASSIVE)

    def summary(self) -> dict[str, int]:
        return self._guard(self._summary)

    def _summary(self) -> dict[str, int]:
        def count(table):
            return one(self.conn.execute(f"SELECT count(*) FROM {table}").fetchone())[0]
        out = {t: count(t) for t in ("routing", "incarnations", "messages", "frames", "prompts",
                                     "prompt_queue")}
        out["db_bytes"] = os.path.getsize(self.path)
        wal = self.path + "-wal"
        out["wal_bytes"] = os.path.getsize(wal) if os.path.exists(wal) else 0
        return out

    def close(self) -> None:
        self.conn.close()

"""The store seen from a test, through the storage interface rather than its SQL.

* ``StoreView(sc)``: what a data dir's store holds, read with the interface's
  typed reads (``Store.entry``, ``ledger``, ``request_frames``, ``transcript``…,
  as the SQLite backend answers them: store/sqlite/reads.py) and the read
  operations of its unit of work (``ledger.open_prompts``, ``messages.of_request``…),
  each call on a fresh read-only connection: one snapshot per call, next to a
  running sidecar or on a stopped one's data dir. It never migrates or writes.
  For what the API cannot show (a request's ledger status, the rows one turn
  wrote, what a stopped sidecar left behind).
* ``LocalStore(path)``: a real, migrated SQLite file opened in the test
  process, for tests of store jobs: jobs run on its unit of work the way the
  writer process runs them (one transaction each), reads through the
  backend's own read functions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent_sidecar.store.records import FrameRecord, LedgerEntry, Message, OpenPrompt, SessionEntry
from agent_sidecar.store.sqlite import reads
from agent_sidecar.store.sqlite.connection import open_reader, open_writer
from agent_sidecar.store.sqlite.schema import migrate
from agent_sidecar.store.sqlite.uow import SqliteUnitOfWork

ALL = 1 << 30  # "no limit" for the paged reads


def db_path(where) -> str:
    """The store file of a Sidecar (its data dir) or a path."""
    data_dir = getattr(where, "data_dir", None)
    return str(Path(data_dir) / "sidecar.db") if data_dir is not None else str(where)


class StoreView:
    def __init__(self, where):
        self.path = db_path(where)

    def _read(self, fn: Callable[..., Any], *args: Any) -> Any:
        conn = open_reader(self.path)
        try:
            with conn:
                return fn(conn, *args)
        finally:
            conn.close()

    def _uow(self, op: Callable[[SqliteUnitOfWork], Any]) -> Any:
        return self._read(lambda conn: op(SqliteUnitOfWork(conn)))

    # -- lanes -----------------------------------------------------------------------------

    def entry(self, key: str) -> SessionEntry | None:
        return self._read(reads.entry, key)

    def entries(self, platform: str = "") -> list[SessionEntry]:
        """Every lane (of this platform)."""
        return self._read(reads.list_entries, platform, None, None, ALL)

    def restart_count(self, key: str) -> int:
        """The lane's stuck-loop counter (consecutive restarts with a turn in flight).
        The storage interface has no read of it (RestartRepo only writes), so
        this (with turn_state_rows) queries the SQLite schema: the only such
        reads outside tests/store/."""
        def count(conn):
            row = conn.execute("SELECT count FROM restart_counts WHERE session_key = ?",
                               (key,)).fetchone()
            return row[0] if row else 0
        return self._read(count)

    def turn_state_rows(self, session_id: str) -> int:
        """How many saved turn states the incarnation has. No interface read
        either (TurnStateRepo only writes): a query of the schema, as restart_count."""
        return self._read(lambda conn: conn.execute(
            "SELECT count(*) FROM turn_state WHERE session_id = ?", (session_id,)).fetchone()[0])

    def restart_counts(self) -> int:
        """How many lanes have a stuck-loop counter (see restart_count)."""
        return self._read(lambda conn: conn.execute("SELECT count(*) FROM restart_counts").fetchone()[0])

    def session_key_of(self, session_id: str) -> str | None:
        """The lane of an incarnation, None when the store has no such incarnation."""
        return self._read(reads.session_key_of, session_id)

    # -- transcripts -------------------------------------------------------------------------

    def transcript(self, session_id: str, include_rewound: bool = False) -> list[Message]:
        return self._read(reads.transcript, session_id, include_rewound, 0, None)

    def turn_rows(self, request_id: str) -> list[Message]:
        """The transcript rows one turn wrote (hidden ones too), in seq order."""
        return self._uow(lambda uow: uow.messages.of_request(request_id))

    def user_rows(self, request_id: str) -> int:
        return sum(m.role == "user" for m in self.turn_rows(request_id))

    # -- the ledger and frames -----------------------------------------------------------------

    def ledger(self, request_id: str) -> LedgerEntry | None:
        return self._read(reads.ledger, request_id)

    def status(self, request_id: str) -> str | None:
        """The request's ledger status (queued, running, completed…), None when not in it."""
        e = self.ledger(request_id)
        return e.status if e else None

    def open_prompts(self) -> list[OpenPrompt]:
        """Every queued or running ledger row, with its queue slot."""
        return self._uow(lambda uow: uow.ledger.open_prompts())

    def request_ids(self, prefix: str) -> list[str]:
        """The ledger's request ids that start with ``prefix``, oldest first."""
        ids = self._uow(lambda uow: uow.ledger.ids_with_prefix(prefix))
        return sorted(ids, key=lambda r: self.ledger(r).created_at)

    def resume_turns(self, session_id: str) -> list[LedgerEntry]:
        """The session's auto-resume turns (``resume:SID:N``), oldest first."""
        return [self.ledger(r) for r in self.request_ids(f"resume:{session_id}:")]

    def requests_of(self, key: str) -> list[str]:
        """Every request id the ledger holds for a lane."""
        return [r for r, _, k in self._read(reads.recent_requests, 0.0, ALL) if k == key]

    def request_frames(self, request_id: str) -> list[FrameRecord]:
        """The request's persisted frames (what WatchActivity replays), in seq order."""
        return self._read(reads.request_frames, request_id, 0)

    def kinds(self, request_id: str) -> list[str]:
        return [f.kind for f in self.request_frames(request_id)]

    def frames_after(self, cursor: int = 0, *, session_key: str = "", platform: str = "") -> list[FrameRecord]:
        return self._read(reads.frames_after, cursor, session_key, platform, ALL)

    def last_cursor(self, platform: str) -> int:
        """The cursor of the newest persisted frame of a platform (0 when none)."""
        return max((f.cursor for f in self.frames_after(platform=platform)), default=0)


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


def query(where, sql: str, args: tuple = ()) -> list[tuple]:
    """Rows of one SQL statement against a data dir's store file (sidecar running or
    not). Only for tests of the SQLite backend itself (tests/store/): everything
    else reads through StoreView or the API."""
    import sqlite3
    from contextlib import closing
    with closing(sqlite3.connect(db_path(where), timeout=10)) as conn:
        return conn.execute(sql, args).fetchall()

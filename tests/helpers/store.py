"""The store seen from a test, through the storage interface rather than its SQL.

* ``StoreView(sc)``: what a data dir's store holds, read with the interface's
  typed reads (``Store.entry``, ``ledger``, ``request_frames``, ``transcript``…,
  as the backend itself answers them: store/sqlite/reads.py or
  store/postgres/reads.py) and the read operations of its unit of work
  (``ledger.open_prompts``, ``messages.of_request``…), each call on a fresh
  connection: one snapshot per call, next to a running sidecar or on a stopped
  one's store. It never migrates or writes. For what the API cannot show (a
  request's ledger status, the rows one turn wrote, what a stopped sidecar
  left behind).
* ``LocalStore(where)``: a real, migrated store opened in the test process, for
  tests of store jobs: jobs run on its unit of work the way the writer process
  runs them (one transaction each), reads through the backend's own read
  functions. ``where`` is a Sidecar (its store), a data dir or a file path.

Both follow the backend the tests run on (``pytest --backend``): a Sidecar's
own store, else the SQLite file at the path, or on PostgreSQL the database of
that path (helpers.pg).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent_sidecar.store.records import FrameRecord, LedgerEntry, Message, OpenPrompt, SessionEntry

from . import pg

ALL = 1 << 30  # "no limit" for the paged reads


def db_path(where) -> str:
    """The store file of a Sidecar (its data dir) or a path."""
    data_dir = getattr(where, "data_dir", None)
    return str(Path(data_dir) / "sidecar.db") if data_dir is not None else str(where)


def store_dsn(where) -> str | None:
    """The PostgreSQL database of a Sidecar or a path, None for an SQLite file."""
    dsn = getattr(where, "store_dsn", None)
    if dsn is not None or hasattr(where, "store_dsn"):
        return dsn
    server = pg.active()
    return server.database_for(where) if server is not None else None


class _SqliteSide:
    """Reads of an SQLite file, each on a fresh read-only connection."""

    def __init__(self, path: str):
        from agent_sidecar.store.sqlite import reads
        self.path, self.reads = path, reads

    def read(self, name: str, *args: Any) -> Any:
        return self.run(lambda conn: getattr(self.reads, name)(conn, *args))

    def run(self, fn: Callable[[Any], Any]) -> Any:
        from agent_sidecar.store.sqlite.connection import open_reader
        conn = open_reader(self.path)
        try:
            with conn:
                return fn(conn)
        finally:
            conn.close()

    def uow(self, op: Callable[[Any], Any]) -> Any:
        from agent_sidecar.store.sqlite.uow import SqliteUnitOfWork
        return self.run(lambda conn: op(SqliteUnitOfWork(conn)))

    def scalar(self, sql: str, args: tuple) -> Any:
        row = self.run(lambda conn: conn.execute(sql.replace("%s", "?"), args).fetchone())
        return row[0] if row else None


class _PostgresSide:
    """Reads of a PostgreSQL database, each on a fresh connection in a
    read-only transaction (the backend's reads are coroutines: each runs on a
    loop of its own)."""

    def __init__(self, dsn: str):
        from agent_sidecar.store.postgres import reads
        self.dsn, self.reads = dsn, reads

    def read(self, name: str, *args: Any) -> Any:
        from agent_sidecar.store.postgres.connection import connect_async

        async def go():
            async with await connect_async(self.dsn, autocommit=True) as conn:
                return await getattr(self.reads, name)(conn, *args)
        return asyncio.run(go())

    def run(self, fn: Callable[[Any], Any]) -> Any:
        from agent_sidecar.store.postgres.connection import connect
        with connect(self.dsn, autocommit=True) as conn:
            with conn.transaction():
                conn.execute("SET TRANSACTION READ ONLY")
                return fn(conn)

    def uow(self, op: Callable[[Any], Any]) -> Any:
        from agent_sidecar.store.postgres.uow import PostgresUnitOfWork
        return self.run(lambda conn: op(PostgresUnitOfWork(conn)))

    def scalar(self, sql: str, args: tuple) -> Any:
        row = self.run(lambda conn: conn.execute(sql, args).fetchone())
        return row[0] if row else None


def _side(where) -> _SqliteSide | _PostgresSide:
    dsn = store_dsn(where)
    return _PostgresSide(dsn) if dsn else _SqliteSide(db_path(where))


class StoreView:
    def __init__(self, where):
        self._side = _side(where)
        self.backend = "postgres" if isinstance(self._side, _PostgresSide) else "sqlite"

    def _read(self, name: str, *args: Any) -> Any:
        return self._side.read(name, *args)

    def _uow(self, op: Callable[[Any], Any]) -> Any:
        return self._side.uow(op)

    # -- lanes -----------------------------------------------------------------------------

    def entry(self, key: str) -> SessionEntry | None:
        return self._read("entry", key)

    def entries(self, platform: str = "") -> list[SessionEntry]:
        """Every lane (of this platform)."""
        return self._read("list_entries", platform, None, None, ALL)

    def restart_count(self, key: str) -> int:
        """The lane's stuck-loop counter (consecutive restarts with a turn in flight).
        The storage interface has no read of it (RestartRepo only writes), so
        this (with turn_state_rows) queries the schema (one statement, the same
        on both backends): the only such reads outside tests/store/."""
        return self._side.scalar("SELECT count FROM restart_counts WHERE session_key = %s", (key,)) or 0

    def turn_state_rows(self, session_id: str) -> int:
        """How many saved turn states the incarnation has. No interface read
        either (TurnStateRepo only writes): a query of the schema, as restart_count."""
        return self._side.scalar("SELECT count(*) FROM turn_state WHERE session_id = %s", (session_id,))

    def restart_counts(self) -> int:
        """How many lanes have a stuck-loop counter (see restart_count)."""
        return self._side.scalar("SELECT count(*) FROM restart_counts", ())

    def session_key_of(self, session_id: str) -> str | None:
        """The lane of an incarnation, None when the store has no such incarnation."""
        return self._read("session_key_of", session_id)

    # -- transcripts -------------------------------------------------------------------------

    def transcript(self, session_id: str, include_rewound: bool = False) -> list[Message]:
        return self._read("transcript", session_id, include_rewound, 0, None)

    def turn_rows(self, request_id: str) -> list[Message]:
        """The transcript rows one turn wrote (hidden ones too), in seq order."""
        return self._uow(lambda uow: uow.messages.of_request(request_id))

    def turns_rows(self, request_ids: list[str]) -> dict[str, tuple[str, list[Message]]]:
        """For many turns at once (one connection): per request id the ledger
        holds, the incarnation its turn ran in and the rows it wrote there
        (hidden ones too), in seq order."""
        def read(uow) -> dict[str, tuple[str, list[Message]]]:
            out = {}
            for rid in request_ids:
                entry = uow.ledger.get(rid)
                if entry is not None:
                    out[rid] = (entry.session_id, uow.messages.of_request(rid))
            return out
        return self._uow(read)

    def user_rows(self, request_id: str) -> int:
        return sum(m.role == "user" for m in self.turn_rows(request_id))

    # -- the ledger and frames -----------------------------------------------------------------

    def ledger(self, request_id: str) -> LedgerEntry | None:
        return self._read("ledger", request_id)

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
        return [r for r, _, k in self._read("recent_requests", 0.0, ALL) if k == key]

    def request_frames(self, request_id: str) -> list[FrameRecord]:
        """The request's persisted frames (what WatchActivity replays), in seq order."""
        return self._read("request_frames", request_id, 0)

    def kinds(self, request_id: str) -> list[str]:
        return [f.kind for f in self.request_frames(request_id)]

    def frames_after(self, cursor: int = 0, *, session_key: str = "", platform: str = "") -> list[FrameRecord]:
        return self._read("frames_after", cursor, session_key, platform, ALL)

    def lease_holder(self, key: str):
        """The live lease on a lane (a cluster's store, PostgreSQL), None when
        nobody holds one: free, let go or run out."""
        return self._read("lease_holder", key)

    def lanes_held_by(self, node_id: str) -> list[str]:
        """The lanes whose lease names this node and that it did not let go (a
        cluster's store): held, or left to run out by a node that went away."""
        return self._uow(lambda uow: uow.leases.of_node(node_id))

    def last_cursor(self, platform: str) -> int:
        """The cursor of the newest persisted frame of a platform (0 when none)."""
        return max((f.cursor for f in self.frames_after(platform=platform)), default=0)


class LocalStore:
    def __init__(self, where):
        dsn = store_dsn(where)
        self.backend = "postgres" if dsn else "sqlite"
        if dsn:
            from agent_sidecar.store.postgres.connection import connect
            from agent_sidecar.store.postgres.schema import migrate
            from agent_sidecar.store.postgres.uow import PostgresUnitOfWork
            self.conn = connect(dsn, autocommit=True)
            migrate(self.conn)
            self.uow = PostgresUnitOfWork(self.conn)
            self._side: _SqliteSide | _PostgresSide = _PostgresSide(dsn)
        else:
            from agent_sidecar.store.sqlite.connection import open_writer
            from agent_sidecar.store.sqlite.schema import migrate
            from agent_sidecar.store.sqlite.uow import SqliteUnitOfWork
            self.conn = open_writer(db_path(where))
            migrate(self.conn)
            self.uow = SqliteUnitOfWork(self.conn)
            self._side = _SqliteSide(db_path(where))

    def job(self, fn, *args):
        """``fn(uow, *args)`` in a transaction of its own; its result."""
        if self.backend == "postgres":
            self.uow.begin()
            with self.conn.transaction():
                return fn(self.uow, *args)
        with self.conn:
            return fn(self.uow, *args)

    def read(self, name: str, *args):
        """``store.<backend>.reads.<name>(conn, *args)``: what the Store's read returns."""
        return self._side.read(name, *args)

    def reader_spec(self) -> tuple:
        """What a worker process opens to read this store (Store.reader_spec)."""
        if self.backend == "postgres":
            return ("agent_sidecar.store.postgres.reader:open_reader", (self._side.dsn,))
        return ("agent_sidecar.store.sqlite.reader:open_reader", (self._side.path,))

    def close(self) -> None:
        self.conn.close()


def local_store(where) -> contextlib.closing[LocalStore]:
    """A LocalStore for a ``with`` block, closed at its end."""
    return contextlib.closing(LocalStore(where))


@contextlib.asynccontextmanager
async def opened_store(where, *, writes: bool = False, **kw):
    """The backend's own ``Store`` on ``where``'s store, in the test's event
    loop, for tests of code that takes a Store: its reads, and its writes with
    ``writes`` (the writer process started). ``kw``: the backend's options."""
    dsn = store_dsn(where)
    if dsn:
        from agent_sidecar.store.postgres.store import PostgresStore
        store = PostgresStore(dsn, **kw)
        await store.start()  # its reads need the pool that start opens
    else:
        from agent_sidecar.store.sqlite.store import SqliteStore
        store = SqliteStore(db_path(where), **kw)  # migrated; its reads need no writer process
        if writes:
            await store.start()
    try:
        yield store
    finally:
        await store.close()


class RawSql:
    """One connection to a store, SQL in the dialect both backends share
    (``?`` placeholders; each statement its own transaction). Not an oracle:
    for setup no API can make (rows made old) and audits of invariants no
    interface read exposes; tests of the SQLite backend itself use ``query``."""

    def __init__(self, where):
        self.dsn = store_dsn(where)
        self.backend = "postgres" if self.dsn else "sqlite"
        if self.dsn:
            from agent_sidecar.store.postgres.connection import connect
            self.conn = connect(self.dsn, autocommit=True)
        else:
            import sqlite3
            self.conn = sqlite3.connect(db_path(where), timeout=10, isolation_level=None)

    def execute(self, sql: str, args: tuple = ()) -> list[tuple]:
        """The statement's rows (none for a write)."""
        if self.dsn:
            sql = sql.replace("%", "%%").replace("?", "%s")
        cur = self.conn.execute(sql, args)
        return list(cur.fetchall()) if cur.description else []

    def close(self) -> None:
        self.conn.close()


def raw_sql(where) -> contextlib.closing[RawSql]:
    """A RawSql for a ``with`` block, closed at its end."""
    return contextlib.closing(RawSql(where))


@contextlib.contextmanager
def writes_held(where):
    """Hold the store's write lock: the sidecar's writes (an accept job's too)
    wait for its release; reads go on. A fault made at the store, not a read of
    it: on SQLite another writer's ``BEGIN IMMEDIATE``, on PostgreSQL every
    table of the schema locked ``IN EXCLUSIVE MODE`` (which blocks writers only)."""
    dsn = store_dsn(where)
    if dsn:
        from agent_sidecar.store.postgres.connection import connect
        with connect(dsn, autocommit=True) as conn:
            with conn.transaction():
                tables = [t for (t,) in conn.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")]
                conn.execute("LOCK TABLE " + ", ".join(f'"{t}"' for t in tables) + " IN EXCLUSIVE MODE")
                yield
        return
    import sqlite3
    from contextlib import closing
    with closing(sqlite3.connect(db_path(where), timeout=10, isolation_level=None)) as db:
        db.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            db.execute("ROLLBACK")


def query(where, sql: str, args: tuple = ()) -> list[tuple]:
    """Rows of one SQL statement against a data dir's store file (sidecar running or
    not). Only for tests of the SQLite backend itself (tests/store/): everything
    else reads through StoreView or the API."""
    import sqlite3
    from contextlib import closing
    with closing(sqlite3.connect(db_path(where), timeout=10)) as conn:
        return conn.execute(sql, args).fetchall()


@contextlib.contextmanager
def frames_refused(where, like: str, request_id: str = ""):
    """The store refuses every frame whose body (its JSON text) is ``LIKE``
    the pattern ``like`` (no quotes in it), of request ``request_id`` only if
    given: a trigger
    on the frames table raises (SQLite's RAISE(ABORT), PostgreSQL's RAISE
    EXCEPTION), an error that is no store fault, so the frame bus's flush
    carrying such a frame fails whole and for good. Dropped on exit."""
    only = f" AND NEW.request_id = '{request_id}'" if request_id else ""
    dsn = store_dsn(where)
    if dsn:
        from agent_sidecar.store.postgres.connection import connect
        with connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE FUNCTION test_refuse_frame() RETURNS trigger LANGUAGE plpgsql AS $$"
                         f" BEGIN IF NEW.body::text LIKE '{like}'{only} THEN"
                         " RAISE EXCEPTION 'this frame is refused'; END IF; RETURN NEW; END $$")
            conn.execute("CREATE TRIGGER test_refuse_frame BEFORE INSERT ON frames"
                         " FOR EACH ROW EXECUTE FUNCTION test_refuse_frame()")
        try:
            yield
        finally:
            with connect(dsn, autocommit=True) as conn:
                conn.execute("DROP TRIGGER test_refuse_frame ON frames")
                conn.execute("DROP FUNCTION test_refuse_frame()")
        return
    import sqlite3
    from contextlib import closing
    with closing(sqlite3.connect(db_path(where), timeout=10, isolation_level=None)) as db:
        db.execute("CREATE TRIGGER test_refuse_frame BEFORE INSERT ON frames"
                   f" WHEN CAST(NEW.body AS TEXT) LIKE '{like}'{only}"
                   " BEGIN SELECT RAISE(ABORT, 'this frame is refused'); END")
    try:
        yield
    finally:
        with closing(sqlite3.connect(db_path(where), timeout=10, isolation_level=None)) as db:
            db.execute("DROP TRIGGER test_refuse_frame")

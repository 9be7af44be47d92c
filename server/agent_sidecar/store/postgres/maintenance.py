"""Maintenance of a PostgreSQL store, sidecars running or not (``agent-sidecar
doctor`` with ``[store] backend = "postgres"``): the schema's indexes, the
full-text index's check and rebuild, a summary. The same operations as
store/sqlite/maintenance.py, in PostgreSQL's terms:

* integrity: every migration applied and every index of the schema valid (an
  index build that was interrupted leaves an invalid one behind, which the
  planner then ignores: lookups would scan);
* the full-text index is derived: ``content_tsv`` is a generated column
  (computed from ``content`` on every insert, so it cannot drift from it) and
  ``messages_fts`` its GIN index; the check probes the index with words of the
  newest messages, the rebuild is ``REINDEX … CONCURRENTLY`` (the sidecars go on
  writing meanwhile) or a new build when the index is missing or invalid;
* the server checkpoints its own WAL: nothing to do here.

Like SQLite's doctor, it migrates the database first, except under a running
older release: a database that lacks migrations of this release while a
sidecar's writer is connected to it (``pg_stat_activity``, whose
``application_name`` every role may read) belongs to sidecars still on an older
release (this one installed beside them, or a node upgraded before the
others); migrating it would change its tables under them. Then nothing is
checked or changed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import psycopg

from ..faults import StoreUnavailable
from ..interface import StoreOpenError
from ..statements import one
from .connection import WRITER_APPLICATION, connect, server_refused, unbounded
from .schema import FTS_INDEX, MIGRATIONS, migrate

_INVALID_INDEXES = (
    "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
    " JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE n.nspname = current_schema() AND NOT (i.indisvalid AND i.indisready) ORDER BY 1")
_FTS_STATE = ("SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
              " JOIN pg_namespace n ON n.oid = c.relnamespace"
              " WHERE n.nspname = current_schema() AND c.relname = 'messages_fts'")
# What an interrupted ``REINDEX … CONCURRENTLY`` of the index leaves behind
# (cancelled, its connection lost, doctor stopped): invalid copies the planner
# ignores and every later write still updates.
_FTS_LEFTOVERS = ("SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                  " JOIN pg_namespace n ON n.oid = c.relnamespace"
                  " WHERE n.nspname = current_schema() AND NOT i.indisvalid"
                  " AND c.relname ~ '^messages_fts_cc(new|old)[0-9]*$' ORDER BY 1")
PROBES = 5
# Other sessions on this database that are a sidecar's writer: one per running sidecar.
_RUNNING_WRITERS = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND application_name = %s AND pid <> pg_backend_pid()")


def _store_errors(method: Callable[..., Any]) -> Callable[..., Any]:
    """A check or repair whose statement the server fails midway (the
    connection lost or ended, the server stopping) raises StoreUnavailable,
    which doctor reports in one line with exit status 1; it ended in a
    traceback. The message is the server's own, not "retry later": what it
    refused may need the operator (a rebuild by a role that does not own
    the index: "must be owner of index messages_fts")."""
    @functools.wraps(method)
    def checked(self, *args: Any, **kw: Any) -> Any:
        try:
            return method(self, *args, **kw)
        except psycopg.Error as e:
            raise StoreUnavailable(f"the PostgreSQL store failed: {e}") from None
    return checked


class PostgresMaintenance:
    def __init__(self, dsn: str):
        try:
            self.conn = connect(dsn, autocommit=True)
            refused = server_refused(self.conn)
            if refused is not None:
                self.conn.close()
                raise StoreOpenError(f"cannot open the PostgreSQL store: {refused}")
            unbounded(self.conn)  # its counts and a rebuild take as long as the tables are big
            self._refuse_to_migrate_under_running_sidecars()
            migrate(self.conn)
        except psycopg.Error as e:
            raise StoreOpenError(f"cannot open the PostgreSQL store: {e}") from None

    def _refuse_to_migrate_under_running_sidecars(self) -> None:
        """Migrations of this release missing while sidecars run on the
        database: they are an older release, and doctor leaves their schema
        alone (StoreOpenError, the connection closed); the first of them to
        restart as this release migrates it."""
        if self.conn.execute("SELECT to_regclass('schema_migrations')").fetchone() == (None,):
            return  # a new database: no sidecar has opened it
        done = {v for (v,) in self.conn.execute("SELECT version FROM schema_migrations")}
        pending = sorted({v for v, _, _ in MIGRATIONS} - done)
        running = one(self.conn.execute(_RUNNING_WRITERS, (WRITER_APPLICATION,)).fetchone())[0] if pending else 0
        if running:
            self.conn.close()
            raise StoreOpenError(
                f"{running} sidecar(s) running on this database are an older release (it lacks migration(s)"
                f" {', '.join(map(str, pending))} of this one): nothing was checked or changed; restart them"
                " as this release first, or use their own doctor")

    @_store_errors
    def integrity(self) -> list[str]:
        """``["ok"]`` when every migration is recorded and every index valid."""
        leftovers = {name for (name,) in self.conn.execute(_FTS_LEFTOVERS)}
        problems = [f"index {name} is not valid" + (" (left by an interrupted rebuild: --rebuild-fts drops it)"
                                                    if name in leftovers else "")
                    for (name,) in self.conn.execute(_INVALID_INDEXES)]
        done = {v for (v,) in self.conn.execute("SELECT version FROM schema_migrations")}
        problems += [f"migration {v} ({name}) not applied" for v, name, _ in MIGRATIONS if v not in done]
        return problems or ["ok"]

    @_store_errors
    def fts_check(self) -> tuple[bool, str]:
        """The index exists, is valid, and finds (through the index alone) the
        newest live messages by a word of their own."""
        state = self.conn.execute(_FTS_STATE).fetchone()
        if state is None:
            return False, "the index messages_fts is missing"
        if not state[0]:
            return False, "the index messages_fts is not valid"
        with self.conn.transaction():
            self.conn.execute("SET LOCAL enable_seqscan = off")
            probes = self.conn.execute(
                "SELECT id, (tsvector_to_array(content_tsv))[1] FROM messages"
                " WHERE active AND content_tsv != ''::tsvector ORDER BY id DESC LIMIT %s", (PROBES,)).fetchall()
            for msg_id, word in probes:
                found = one(self.conn.execute(
                    "SELECT count(*) FROM messages WHERE content_tsv @@ to_tsquery('simple', quote_literal(%s))"
                    " AND id = %s", (word, msg_id)).fetchone())[0]
                if not found:
                    return False, f"message {msg_id} is not found by its word {word!r}"
        return True, "ok"

    @_store_errors
    def message_count(self) -> int:
        return one(self.conn.execute("SELECT count(*) FROM messages").fetchone())[0]

    @_store_errors
    def rebuild_fts(self, advance: Callable[[int], None] | None = None) -> int:
        """Rebuild the index from every message (concurrently with the
        sidecars' writes); returns the rows indexed. The invalid copies an
        earlier rebuild left when it was interrupted are dropped first: they
        made every later integrity check fail, and a new rebuild could not
        mend that (it left its own copies beside them)."""
        for (name,) in self.conn.execute(_FTS_LEFTOVERS).fetchall():
            self.conn.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"')
        state = self.conn.execute(_FTS_STATE).fetchone()
        if state is not None and state[0]:
            self.conn.execute("REINDEX INDEX CONCURRENTLY messages_fts")
        else:
            self.conn.execute("DROP INDEX CONCURRENTLY IF EXISTS messages_fts")
            self.conn.execute(FTS_INDEX.replace("CREATE INDEX", "CREATE INDEX CONCURRENTLY"))
        n = self.message_count()
        if advance is not None:
            advance(n)
        return n

    def checkpoint(self) -> None:
        """The server checkpoints its own WAL."""
        return None

    @_store_errors
    def summary(self) -> dict[str, int]:
        def count(table):
            return one(self.conn.execute(f"SELECT count(*) FROM {table}").fetchone())[0]
        out = {t: count(t) for t in ("routing", "incarnations", "messages", "frames", "prompts",
                                     "prompt_queue")}
        out["db_bytes"] = one(self.conn.execute("SELECT pg_database_size(current_database())").fetchone())[0]
        return out

    def close(self) -> None:
        self.conn.close()

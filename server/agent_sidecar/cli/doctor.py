"""``agent-sidecar doctor``: check and repair the store, sidecar running or not.

- ``PRAGMA integrity_check`` (the whole file);
- the FTS5 index's own integrity check against the canonical ``messages`` rows;
- ``--rebuild-fts``: drop the derived index and its triggers, recreate them,
  and refill from ``messages`` in batches (with progress) — canonical rows are
  never touched;
- a WAL checkpoint;
- a summary: sessions, incarnations, messages, frames, ledger, file sizes.
Exit status 0 when everything checks out (after repair, if asked), 1 otherwise.
"""

from __future__ import annotations

import os
import sys

import apsw

from ..sessions import transcripts as tx
from ..store.db import BUSY_TIMEOUT_MS
from ..store.migrations import FTS_SCHEMA, migrate
from .progress import Progress

BATCH = 5000


def _say(msg: str) -> None:
    print(msg, flush=True)


def fts_ok(conn: apsw.Connection) -> tuple[bool, str]:
    """FTS5's own integrity check, which compares the index with every message.
    The sidecar indexes in batches, so the messages it has not indexed yet go
    in first, in the same write transaction: a running sidecar cannot add one
    between the catch-up and the check."""
    try:
        conn.execute("BEGIN IMMEDIATE")
    except apsw.BusyError:  # another writer holds the store: no verdict, the caller says so
        raise
    except apsw.Error as e:
        return False, str(e)
    try:
        tx.index_pending(conn)
        conn.execute("INSERT INTO messages_fts (messages_fts, rank) VALUES ('integrity-check', 1)")
    except apsw.BusyError:
        conn.execute("ROLLBACK")
        raise
    except apsw.Error as e:
        conn.execute("ROLLBACK")
        return False, str(e)
    conn.execute("COMMIT")
    return True, "ok"


def rebuild_fts(conn: apsw.Connection, progress: bool = True) -> int:
    """Drop and rebuild the derived index; returns rows indexed."""
    total = conn.execute("SELECT count(*) FROM messages").fetchone()[0]
    bar = Progress("rebuilding FTS", total) if progress else None
    with conn:
        conn.execute("DROP TRIGGER IF EXISTS messages_fts_insert")
        conn.execute("DROP TRIGGER IF EXISTS messages_fts_delete")
        conn.execute("DROP TABLE IF EXISTS messages_fts")
        conn.execute(FTS_SCHEMA)  # indexed up to id 0
    done = 0
    while True:
        with conn:
            n = tx.index_pending(conn, BATCH)
        if not n:
            break
        done += n
        if bar:
            bar.advance(n)
    if bar:
        bar.finish()
    return done


def summary(conn: apsw.Connection, db_path: str) -> dict:
    def count(table):
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    out = {t: count(t) for t in ("routing", "incarnations", "messages", "frames", "prompts",
                                 "prompt_queue")}
    out["db_bytes"] = os.path.getsize(db_path)
    wal = db_path + "-wal"
    out["wal_bytes"] = os.path.getsize(wal) if os.path.exists(wal) else 0
    return out


def run(args) -> int:
    db_path = os.path.join(args.data_dir, "sidecar.db")
    if not os.path.exists(db_path):
        print(f"agent-sidecar doctor: no store at {db_path}", file=sys.stderr)
        return 1
    try:
        conn = apsw.Connection(db_path)
        conn.setbusytimeout(BUSY_TIMEOUT_MS)
        conn.execute("PRAGMA journal_mode=WAL")
        migrate(conn)
    except apsw.BusyError:
        return _busy(db_path)
    except apsw.Error as e:
        print(f"agent-sidecar doctor: cannot open {db_path}: {e}", file=sys.stderr)
        return 1
    try:
        return _check(args, conn, db_path)
    except apsw.BusyError:
        return _busy(db_path)
    finally:
        conn.close()


def _busy(db_path: str) -> int:
    print(f"agent-sidecar doctor: {db_path} stayed locked by another writer for "
          f"{BUSY_TIMEOUT_MS // 1000} s; nothing was checked or changed, try again",
          file=sys.stderr)
    return 1


def _check(args, conn: apsw.Connection, db_path: str) -> int:
    healthy = True

    _say("integrity check …")
    result = [r[0] for r in conn.execute("PRAGMA integrity_check")]
    ok = result == ["ok"]
    healthy &= ok
    _say(f"  integrity: {'ok' if ok else '; '.join(result[:5])}")

    ok, detail = fts_ok(conn)
    _say(f"  full-text index: {'ok' if ok else 'INCONSISTENT (' + detail + ')'}")
    if args.rebuild_fts:
        n = rebuild_fts(conn, progress=True)
        ok, detail = fts_ok(conn)
        _say(f"  rebuilt full-text index from {n} messages: {'ok' if ok else detail}")
        # The first integrity check also saw the broken index: judge again.
        result = [r[0] for r in conn.execute("PRAGMA integrity_check")]
        healthy = result == ["ok"]
        _say(f"  integrity after rebuild: {'ok' if healthy else '; '.join(result[:5])}")
    elif not ok:
        _say("  run `agent-sidecar doctor --rebuild-fts` to rebuild it from the messages")
    healthy &= ok

    log_pages, done = conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_PASSIVE)
    _say(f"  WAL checkpoint: {done}/{log_pages} pages")
    s = summary(conn, db_path)
    _say("summary:")
    for k, v in s.items():
        _say(f"  {k:14} {v:>12,}")
    return 0 if healthy else 1

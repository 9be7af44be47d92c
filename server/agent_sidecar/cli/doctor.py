"""``agent-sidecar doctor``: check and repair the store, sidecar running or not.

- the store's integrity check (the whole file);
- the full-text index's own integrity check against the canonical messages;
- ``--rebuild-fts``: drop the derived index, recreate it and refill it from
  the messages in batches (with progress) — canonical rows are never touched;
- a WAL checkpoint;
- a summary: sessions, incarnations, messages, frames, ledger, file sizes.
Exit status 0 when everything checks out (after repair, if asked), 1 otherwise.
The work itself is the backend's (store/sqlite/maintenance.py).
"""

from __future__ import annotations

import os
import sys

from ..store.sqlite.maintenance import NotAStore, SqliteMaintenance, StoreLocked
from .progress import Progress


def _say(msg: str) -> None:
    print(msg, flush=True)


def run(args) -> int:
    db_path = os.path.join(args.data_dir, "sidecar.db")
    if not os.path.exists(db_path):
        print(f"agent-sidecar doctor: no store at {db_path}", file=sys.stderr)
        return 1
    try:
        store = SqliteMaintenance(db_path)
    except (StoreLocked, NotAStore) as e:
        print(f"agent-sidecar doctor: {e}", file=sys.stderr)
        return 1
    try:
        return _check(args, store)
    except StoreLocked as e:
        print(f"agent-sidecar doctor: {e}", file=sys.stderr)
        return 1
    finally:
        store.close()


def _integrity(store: SqliteMaintenance, label: str) -> bool:
    result = store.integrity()
    ok = result == ["ok"]
    _say(f"  {label}: {'ok' if ok else '; '.join(result[:5])}")
    return ok


def _check(args, store: SqliteMaintenance) -> int:
    _say("integrity check …")
    healthy = _integrity(store, "integrity")
    ok, detail = store.fts_check()
    _say(f"  full-text index: {'ok' if ok else 'INCONSISTENT (' + detail + ')'}")
    if args.rebuild_fts:
        bar = Progress("rebuilding FTS", store.message_count())
        n = store.rebuild_fts(bar.advance)
        bar.finish()
        ok, detail = store.fts_check()
        _say(f"  rebuilt full-text index from {n} messages: {'ok' if ok else detail}")
        # The first integrity check also saw the broken index: judge again.
        healthy = _integrity(store, "integrity after rebuild")
    elif not ok:
        _say("  run `agent-sidecar doctor --rebuild-fts` to rebuild it from the messages")
    healthy &= ok
    log_pages, done = store.checkpoint()
    _say(f"  WAL checkpoint: {done}/{log_pages} pages")
    _say("summary:")
    for k, v in store.summary().items():
        _say(f"  {k:14} {v:>12,}")
    return 0 if healthy else 1

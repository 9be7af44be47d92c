"""``agent-sidecar doctor``: check and repair the store, sidecar running or not.

- the store's integrity check (the whole file);
- the full-text index's own integrity check against the canonical messages;
- ``--rebuild-fts``: drop the derived index, recreate it and refill it from
  the messages in batches (with progress) — canonical rows are never touched;
- a WAL checkpoint;
- a summary: sessions, incarnations, messages, frames, ledger, file sizes.
Exit status 0 when everything checks out (after repair, if asked), 2 for a
config it cannot use (as every command), 1 otherwise.
The work itself is the backend's (store/sqlite/maintenance.py, or with
``[store] backend = "postgres"`` in the config or the environment,
store/postgres/maintenance.py: no file, no WAL checkpoint of its own).
"""

from __future__ import annotations

import os

from ..store.sqlite.maintenance import NotAStore, SqliteMaintenance, StoreDamaged, StoreLocked
from .progress import Progress
from .report import error


def _say(msg: str) -> None:
    print(msg, flush=True)


def _open(args):
    """The store ``serve`` with the same config would open: its backend, and
    its data dir (``--data-dir``, else the config's or the environment's
    ``sidecar.data_dir``, else ./data), so that ``doctor --config FILE`` never
    checks another store than the sidecar's."""
    from ..config import load_config
    cfg = load_config(getattr(args, "config", None), data_dir=args.data_dir)
    if cfg.store.backend == "postgres":
        from ..store.postgres.maintenance import PostgresMaintenance
        return PostgresMaintenance(cfg.store.dsn)
    db_path = cfg.db_path
    if not os.path.exists(db_path):
        raise NotAStore(f"no store at {db_path}")
    return SqliteMaintenance(db_path)


def run(args) -> int:
    from ..config import ConfigError
    from ..store.faults import StoreUnavailable
    from ..store.interface import StoreOpenError
    try:
        store = _open(args)
    except ConfigError as e:
        error("doctor", e)
        return 2
    except (StoreLocked, NotAStore, StoreOpenError) as e:
        error("doctor", e)
        return 1
    try:
        return _check(args, store)
    except (StoreLocked, StoreDamaged, StoreUnavailable) as e:
        error("doctor", e)
        return 1
    finally:
        store.close()


def _integrity(store, label: str) -> bool:
    result = store.integrity()
    ok = result == ["ok"]
    _say(f"  {label}: {'ok' if ok else '; '.join(result[:5])}")
    return ok


def _check(args, store) -> int:
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
    pages = store.checkpoint()
    if pages is not None:  # a backend with a WAL of its own (SQLite)
        _say(f"  WAL checkpoint: {pages[1]}/{pages[0]} pages")
    _say("summary:")
    for k, v in store.summary().items():
        _say(f"  {k:14} {v:>12,}")
    return 0 if healthy else 1

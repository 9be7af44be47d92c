"""``agent-sidecar backup FILE``: an online copy of the SQLite store, safe
while the sidecar runs and turns stream (store/sqlite/backup.py has how).

The store is the one ``serve`` with the same options would open: ``--data-dir``,
else the config's ``sidecar.data_dir``, else ./data. A PostgreSQL store is
backed up with PostgreSQL's own tools (pg_dump), not this. Exit status 0 with
the copy in place, 1 when it could not be made (nothing left at FILE), 2 for
a config it cannot use or a PostgreSQL store."""

from __future__ import annotations

from .report import error


def run(args) -> int:
    from ..config import ConfigError, load_config
    from ..store.sqlite.backup import BackupError, backup
    try:
        cfg = load_config(args.config, data_dir=args.data_dir)
    except ConfigError as e:
        error("backup", e)
        return 2
    if cfg.store.backend != "sqlite":
        error("backup", f"the store is {cfg.store.backend}: back it up with its own tools (pg_dump; "
              "docs/operations.md)")
        return 2
    try:
        counts = backup(cfg.db_path, args.file)
    except BackupError as e:
        error("backup", e)
        return 1
    print(f"{cfg.db_path} -> {args.file}: {counts['routing']} session(s), {counts['messages']} message(s),"
          f" {counts['frames']} frame(s), {counts['bytes']:,} bytes; quick check ok")
    return 0

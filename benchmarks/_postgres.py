"""A PostgreSQL server for a benchmark: a scratch one of its own (``initdb``
into a directory of the run, on a free port, stopped at the end), or an
existing one named by a DSN, where only the databases the run created are
dropped at the end.

Why a scratch server by default: a benchmark must not need a database set up
beforehand, and must leave nothing behind. ``initdb`` and ``postgres`` refuse
to run as root, so as root they run as the ``postgres`` user (``runuser``).
Default settings (fsync and synchronous commit on): durable like the SQLite
store's ``synchronous = FULL``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from _common import free_port

from agent_sidecar.bench.procs import parent_pid

PG_BIN = Path("/usr/lib/postgresql/15/bin")


class Postgres:
    """``start()``, then ``create_db(name)`` -> a DSN for it; ``stop()`` at the end."""

    def __init__(self, root: Path, dsn: str | None, options: str = ""):
        self.dsn, self.pgdata, self.made = dsn, root / "pg", []
        self.options = options  # more server settings for a scratch server (``-c name=value`` ...)
        self.own = False  # a server this run started (and stops)

    def _pg(self, tool: str, *args) -> None:
        cmd = [str(PG_BIN / tool), *map(str, args)]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, stdout=subprocess.DEVNULL, check=True)

    def start(self) -> None:
        if self.dsn:
            return
        sock = self.pgdata.parent / "pg-sock"
        for d in (self.pgdata, sock):
            d.mkdir()
            if os.geteuid() == 0:
                shutil.chown(d, "postgres", "postgres")
        os.chmod(self.pgdata.parent, 0o711)  # the postgres user must reach its dirs
        self._pg("initdb", "-D", self.pgdata, "-U", "postgres", "--auth=trust", "-E", "UTF8")
        port = free_port()
        self._pg("pg_ctl", "-D", self.pgdata, "-w", "-l", self.pgdata / "server.log", "-o",
                 f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 {self.options}", "start")
        self.dsn, self.own = f"host=127.0.0.1 port={port} user=postgres dbname=postgres", True

    def _admin(self, *sql: str) -> None:
        import psycopg
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for statement in sql:
                conn.execute(statement)

    def create_db(self, name: str) -> str:
        from psycopg.conninfo import make_conninfo
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', f'CREATE DATABASE "{name}"')
        self.made.append(name)
        return make_conninfo(self.dsn, dbname=name)

    def postmaster_pid(self) -> int | None:
        """The server's root process, if it runs on this machine and /proc shows it."""
        import psycopg
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            root = parent_pid(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
        return root if root and os.path.exists(f"/proc/{root}") else None

    def stop(self) -> None:
        if self.own:
            self._pg("pg_ctl", "-D", self.pgdata, "-m", "fast", "-w", "stop")
        elif self.made and self.dsn:
            self._admin(*(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)' for name in self.made))

"""A real PostgreSQL server for the tests (no mock of it anywhere).

* ``PgServer.from_env()``: the server ``AGENT_SIDECAR_TEST_PG_DSN`` names (CI
  starts one: .ci/run), or else ``PgServer.start_temp()``: ``initdb`` into a
  temporary directory (as the ``postgres`` user when the tests run as root:
  PostgreSQL refuses to run as root), started on a free port with its Unix
  socket in that directory, and stopped and removed by ``close()``.
* One database per sidecar data dir: ``database_for(where)`` names it after the
  data dir's path (a session-unique prefix first, so a stale database of an
  earlier run is never picked up), and creates it on first use as a copy of a
  template migrated once per session (``CREATE DATABASE … TEMPLATE``: a copy
  of files, much faster than running the migrations for every sidecar). A
  sidecar restarted on the same data dir gets the same database back.
* ``database(name)``: a database several sidecars share (cluster tests).

The session's databases are dropped at ``close()`` on a server the tests did
not start themselves. ``python3 tests/helpers/pg.py start DIR`` / ``stop DIR``
(standard library only) is how .ci/run starts the one server of a CI run.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

DSN_ENV = "AGENT_SIDECAR_TEST_PG_DSN"



BIN_ENV = "AGENT_SIDECAR_TEST_PG_BIN"


def hide_settings() -> None:
    """A sidecar reads every ``AGENT_SIDECAR_*`` variable as config and refuses
    one that names no key: the tests' own two move to names it does not read
    (a leading ``_``), inherited by every process the tests start."""
    for name in (DSN_ENV, BIN_ENV):
        if name in os.environ:
            os.environ["_" + name] = os.environ.pop(name)


def _setting(name: str) -> str:
    return os.environ.get(name) or os.environ.get("_" + name) or ""


def _pg_bin() -> Path:
    """``AGENT_SIDECAR_TEST_PG_BIN``, else PostgreSQL 15's (the image's), else
    the newest version the distribution installed."""
    if _setting(BIN_ENV):
        return Path(_setting(BIN_ENV))
    default = Path("/usr/lib/postgresql/15/bin")
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name)
                   if p.parent.parent.name.isdigit() else 0)
    return default if (default / "initdb").exists() or not found else found[-1].parent


PG_BIN = _pg_bin()
# A test server: durability of the server's own disk is not what the tests
# check (a sidecar's crash is; PostgreSQL keeps running), so it skips fsync.
SERVER_SETTINGS = ("fsync=off", "full_page_writes=off", "synchronous_commit=on",
                   "max_connections=300", "shared_buffers=64MB")


def free_port() -> int:
    """A loopback TCP port nothing listens on, for a server a test starts,
    taken below the kernel's ephemeral range: a port that ``bind(0)`` hands
    out is in that range, where any outgoing connection of the run (a gRPC
    client, a PostgreSQL session) may take it as its own local port before the
    server binds it ("address already in use"). Standard library only (this
    module runs as .ci/run's script)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = secrets.SystemRandom()
    for _ in range(200):
        port = rng.randrange(10000, max(low, 10001))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def _as_postgres(args: list[str]) -> list[str]:
    """``args`` as the unprivileged ``postgres`` user when we are root."""
    if os.geteuid() != 0:
        return args
    return ["runuser", "-u", "postgres", "--", *args]


def start_server(root: Path) -> str:
    """initdb into ``root/data`` and start it on a free port, socket in
    ``root``; returns the admin DSN. ``stop_server(root)`` stops it."""
    if not (PG_BIN / "initdb").exists():
        raise RuntimeError(f"no PostgreSQL in {PG_BIN}: install postgresql (apt-get install postgresql), "
                           f"set {BIN_ENV} to its bin directory, or {DSN_ENV} to a server's DSN")
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    data = root / "data"
    subprocess.run(_as_postgres([str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres",
                                 "--auth=trust", "--encoding=UTF8", "--locale=C.UTF-8", "-N"]),
                   check=True, capture_output=True)
    port = free_port()
    opts = " ".join(f"-c {s}" for s in (*SERVER_SETTINGS, f"port={port}", "listen_addresses=127.0.0.1",
                                        f"unix_socket_directories={root}"))
    (root / "server.opts").write_text(opts)  # start_again: the same port and socket
    _pg_ctl_start(root, opts)
    return f"host={root} port={port} user=postgres dbname=postgres"


def _pg_ctl_start(root: Path, opts: str) -> None:
    done = subprocess.run(_as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(root / "data"), "-l",
                                        str(root / "server.log"), "-o", opts, "-w", "-t", "60", "start"]),
                          capture_output=True, text=True)
    if done.returncode != 0:
        log = (root / "server.log").read_text() if (root / "server.log").exists() else ""
        raise RuntimeError(f"PostgreSQL did not start: {done.stdout}{done.stderr}\n{log}")


def start_again(root: Path) -> None:
    """Start a server ``stop_server`` stopped, on the port and socket it had."""
    _pg_ctl_start(root, (root / "server.opts").read_text())


def stop_server(root: Path, mode: str = "fast") -> None:
    """``pg_ctl stop -m mode``: ``fast`` ends every session cleanly (each client
    is told, AdminShutdown); ``immediate`` is a crash (sockets just close,
    crash recovery at the next start)."""
    subprocess.run(_as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(root / "data"), "-m", mode, "-w",
                                 "stop"]), capture_output=True)


class PgServer:
    def __init__(self, admin_dsn: str, root: Path | None = None):
        self.admin_dsn = admin_dsn
        self.root = root  # the temp dir of a server we started (None: given by the environment)
        self.prefix = "t" + secrets.token_hex(4)
        self.template = f"{self.prefix}_template"
        self._created: set[str] = set()
        self._lock = threading.Lock()
        self._template_ready = False
        self._strategy = ""

    @classmethod
    def start_temp(cls) -> PgServer:
        root = Path(tempfile.mkdtemp(prefix="agent-sidecar-pg-"))
        try:
            return cls(start_server(root), root)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise

    @classmethod
    def from_env(cls) -> PgServer:
        dsn = _setting(DSN_ENV)
        return cls(dsn) if dsn else cls.start_temp()

    def dsn(self, dbname: str) -> str:
        from psycopg.conninfo import make_conninfo
        return make_conninfo(self.admin_dsn, dbname=dbname)

    def _admin(self, sql: str) -> None:
        import psycopg
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(sql)

    def terminate_connections(self) -> None:
        """Cut every client's connection (``pg_terminate_backend``), as a
        failover or an operator's kill would; the server stays up."""
        self._admin("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()")

    def _ensure_template(self) -> None:
        if self._template_ready:
            return
        import psycopg

        from agent_sidecar.store.postgres.schema import migrate
        self._admin(f'CREATE DATABASE "{self.template}"')
        self._created.add(self.template)
        with psycopg.connect(self.admin_dsn) as conn:  # a plain file copy per database (15+): the fastest
            self._strategy = " STRATEGY FILE_COPY" if conn.info.server_version >= 150000 else ""
        with psycopg.connect(self.dsn(self.template), autocommit=True) as conn:
            migrate(conn)
        self._template_ready = True

    def database(self, name: str) -> str:
        """The DSN of this session's database ``name``, created (migrated) on first use."""
        import psycopg
        db = f"{self.prefix}_{name}"
        if len(db) > 63 or not db.replace("_", "").isalnum():
            raise ValueError(f"not a usable database name: {name!r}")
        with self._lock:
            if db not in self._created:
                self._ensure_template()
                try:
                    self._admin(f'CREATE DATABASE "{db}" TEMPLATE "{self.template}"{self._strategy}')
                except psycopg.errors.DuplicateDatabase:
                    pass
                self._created.add(db)
        return self.dsn(db)

    def database_for(self, where) -> str:
        """The DSN of the database of a data dir (a Sidecar, its data dir, or
        a path inside it such as its ``sidecar.db``)."""
        return self.database(data_dir_name(where))

    def close(self) -> None:
        if self.root is not None:
            stop_server(self.root)
            shutil.rmtree(self.root, ignore_errors=True)
            return
        from concurrent.futures import ThreadPoolExecutor

        def drop(db: str) -> None:
            try:
                self._admin(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            except Exception:  # best effort: the server may be gone already
                pass
        with ThreadPoolExecutor(4) as pool:  # a few hundred of them: in parallel
            list(pool.map(drop, sorted(self._created - {self.template})))
        drop(self.template)


def data_dir_name(where) -> str:
    """A database name for a data dir: a hash of its absolute path."""
    path = Path(getattr(where, "data_dir", where)).absolute()
    if path.suffix == ".db" and path.name == "sidecar.db":
        path = path.parent
    return "d" + hashlib.sha1(str(path).encode()).hexdigest()[:16]


# The server of the session when the behavioural tests run on PostgreSQL
# (``pytest --backend postgres``; tests/conftest.py sets it), else None.
ACTIVE: PgServer | None = None
SERVER: PgServer | None = None  # the server once started (the pg_server fixture), either backend


def active() -> PgServer | None:
    return ACTIVE


if __name__ == "__main__":
    import sys
    if len(sys.argv) != 3 or sys.argv[1] not in ("start", "stop"):
        sys.exit("usage: pg.py start|stop DIR")
    where = Path(sys.argv[2])
    if sys.argv[1] == "start":
        print(start_server(where))
    else:
        stop_server(where)

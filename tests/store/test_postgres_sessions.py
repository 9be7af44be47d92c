"""The sessions a sidecar keeps open on PostgreSQL by design, under a role's
(or a database's) ``idle_session_timeout``: its writer and its cluster tail's
listening connection are not ended while they wait for work."""

from __future__ import annotations

import secrets

import psycopg
import pytest
from helpers.cluster import Node
from helpers.waiting import wait_until
from psycopg.conninfo import conninfo_to_dict

from agent_sidecar.store.postgres.connection import WRITER_APPLICATION
from agent_sidecar.store.postgres.store import follower_name

pytestmark = pytest.mark.postgres_only("PostgreSQL's per-session settings")


def _pids(admin: psycopg.Connection, db: str) -> dict[str, int]:
    """The sessions of ``db`` by application_name (the unnamed ones left out)."""
    rows = admin.execute("SELECT application_name, pid FROM pg_stat_activity WHERE datname = %s"
                         " AND application_name <> ''", (db,)).fetchall()
    return dict(rows)


def _idle_session_ended(admin: psycopg.Connection, dsn: str) -> None:
    """Opens a session of its own on the database and returns once the
    server has ended it for idling: the timeout has run out since."""
    probe = psycopg.connect(dsn, autocommit=True)
    pid = probe.info.backend_pid
    try:
        wait_until(lambda: admin.execute("SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = %s",
                                         (pid,)).fetchone()[0], 30, what="an idle session ended by the server")
    finally:
        probe.close()


def test_the_role_s_idle_session_timeout_ends_neither_the_writer_nor_the_cluster_tail(pg_server, tmp_path):
    """With ``idle_session_timeout = '1s'`` on the database (as on a role, to
    reap leaked sessions), a node whose writer and tail have nothing to do
    keeps both sessions: the server ended them every second, the tail
    connected again and logged two lines each time, and the writer of a
    quiet sidecar said "store connection lost" at its next write."""
    dsn = pg_server.database("idle_session_timeout")
    db = conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(pg_server.admin_dsn, autocommit=True) as admin:
        if admin.info.server_version < 140000:
            pytest.skip("idle_session_timeout came with PostgreSQL 14")
        admin.execute(f'ALTER DATABASE "{db}" SET idle_session_timeout = \'1s\'')
        with Node(tmp_path / "a", "a", dsn, lease_ttl_s=30).start() as node:  # renewals 10 s apart
            names = (WRITER_APPLICATION, follower_name("a"))
            wait_until(lambda: set(names) <= set(_pids(admin, db)), 30, what="the writer and the tail connected")
            before = {n: _pids(admin, db)[n] for n in names}
            for _ in range(2):
                _idle_session_ended(admin, dsn)
            after = _pids(admin, db)
            assert {n: after.get(n) for n in names} == before, (before, after)
            assert "cluster tail: the store is out of reach" not in node.log()


def test_a_role_that_may_only_read_and_write_the_tables_starts_on_a_migrated_database(pg_server, tmp_path):
    """Least privilege: the schema migrated by its owner, the sidecars run as
    a role with rights on the tables and sequences only, no CREATE on the
    schema. The sidecar starts and a prompt completes. The start used to
    fail "permission denied for schema public", though no migration was due:
    the migrations' own table was created "if not exists" at every start."""
    from helpers.ids import source
    from helpers.streams import prompt_req, run
    from psycopg.conninfo import make_conninfo
    from sidecar_proc import Sidecar
    dsn = pg_server.database("least_privilege")
    role = f"dml_{secrets.token_hex(4)}"
    with psycopg.connect(dsn, autocommit=True) as owner:
        owner.execute(f'CREATE ROLE "{role}" LOGIN')
        owner.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        owner.execute(f'GRANT USAGE ON SCHEMA public TO "{role}"')
        owner.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "{role}"')
        owner.execute(f'GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO "{role}"')
    try:
        with Sidecar(tmp_path / "data", dsn=make_conninfo(dsn, user=role), workers=1).start() as sc:
            assert run(sc.prompts(), prompt_req(text="least privilege", source=source())).end == "completed"
    finally:
        with psycopg.connect(pg_server.admin_dsn, autocommit=True) as admin:
            admin.execute(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'")
        with psycopg.connect(dsn, autocommit=True) as owner:
            owner.execute(f'DROP OWNED BY "{role}"')
            owner.execute(f'DROP ROLE "{role}"')


def test_a_database_whose_transactions_default_to_repeatable_read_fails_no_write(pg_server, tmp_path):
    """``default_transaction_isolation = 'repeatable read'`` (or
    ``serializable``, which some organisations mandate) on the database:
    another session updates a lane's row while the writer's transaction
    waits for it, again at each of the writer's retries. The prompt waits
    and completes: the writer's transactions are READ COMMITTED, which its
    row locks are designed for. It used to fail UNAVAILABLE ("could not
    serialize access due to concurrent update", three times, then a store
    fault), and a two-node cluster under ``serializable`` failed about one
    prompt in fifteen so."""
    from helpers.ids import source
    from helpers.sessions import create
    from helpers.streams import PromptRun, prompt_req
    from sidecar_proc import Sidecar
    dsn = pg_server.database("repeatable_read")
    with psycopg.connect(pg_server.admin_dsn, autocommit=True) as admin:
        admin.execute(f'''ALTER DATABASE "{conninfo_to_dict(dsn)['dbname']}"'''
                      " SET default_transaction_isolation = 'repeatable read'")
    with Sidecar(tmp_path / "data", dsn=dsn, workers=1).start() as sc, \
            psycopg.connect(dsn) as other, psycopg.connect(dsn, autocommit=True) as watch:
        src = source()
        key = create(sc.sessions(), src)[0].session_key
        touch = "UPDATE routing SET updated_at = updated_at WHERE session_key = %s"
        waiting = "SELECT count(*) > 0 FROM pg_locks WHERE NOT granted AND locktype = 'transactionid'"
        other.isolation_level = psycopg.IsolationLevel.READ_COMMITTED  # another sidecar's writer
        other.execute(touch, (key,))
        prompt = PromptRun(sc.prompts(), prompt_req(text="behind another session's update", source=src),
                           timeout=60)
        for _ in range(3):  # the writer's first try and its two retries
            wait_until(lambda: watch.execute(waiting).fetchone()[0] or prompt.done.is_set(), 30,
                       what="the writer waiting for the lane's row")
            other.commit()
            other.execute(touch, (key,))
        other.commit()
        out = prompt.result(60)
        assert out.code.name == "OK" and prompt.end == "completed", (out.code, out.details)

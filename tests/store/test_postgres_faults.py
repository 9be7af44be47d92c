"""The PostgreSQL writer backend (store/postgres/writer.py) under the
process's commit loop (store/writer/group.commit), on a real server, when
the database refuses its writes: every answer is a store fault
(StoreUnavailable: UNAVAILABLE, STORE_UNAVAILABLE for the callers), and the
writer commits again once the database takes writes, without a new
connection; and the reads of a sidecar whose connections the server ended.
The sidecar's own behaviour in the same outages is
tests/cluster/test_db_outage.py's."""

from __future__ import annotations

import secrets
from concurrent.futures import ThreadPoolExecutor

import grpc
import psycopg
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers.ids import source
from helpers.sessions import create
from helpers.streams import PromptRun, prompt_req, run
from helpers.waiting import wait_until
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from sidecar_proc import Sidecar, error_info

from agent_sidecar.store.faults import StoreUnavailable, probe
from agent_sidecar.store.postgres.writer import PostgresWriter
from agent_sidecar.store.writer import group
from agent_sidecar.v1 import session_service_pb2 as spb

pytestmark = pytest.mark.postgres_only("the PostgreSQL backend's connections and schema")
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


def _group(db: PostgresWriter, uow, jobs: int) -> list[tuple[bool, object]]:
    """One group commit of ``jobs`` probe jobs: (ok, result or error) per job."""
    return [(ok, value) for _, ok, value in group.commit(db, uow, [([i], probe, [()]) for i in range(jobs)])]


@pytest.mark.parametrize("uses", range(8))
def test_a_read_only_database_fails_every_job_as_a_store_fault(pg_server, uses):
    """A standby after a failover (``default_transaction_read_only``): the
    jobs fail read-only, a store fault. The statements a failing job's
    pipeline segment skipped used to stay "prepared" in psycopg's cache, so
    depending on how often they had run before (``uses``) the next group
    failed ``prepared statement "_pg3_N" does not exist``: not a store fault,
    an INTERNAL error for its callers, with health still SERVING."""
    db = PostgresWriter(pg_server.database("writer_read_only"), "n")
    try:
        uow = db.unit_of_work()
        for _ in range(uses):
            assert _group(db, uow, 1) == [(True, None)]
        db.conn.execute("SET default_transaction_read_only = on")
        for _ in range(3):
            answers = _group(db, uow, 2)
            assert all(not ok and isinstance(v, StoreUnavailable) and "read-only" in v.message
                       for ok, v in answers), answers
        db.conn.execute("SET default_transaction_read_only = off")
        for _ in range(3):
            assert _group(db, uow, 2) == [(True, None), (True, None)]
    finally:
        db.close()


def _read_connections(dsn: str) -> int:
    """The sidecar's read connections to its database (no application_name:
    the reads' pool, and its workers' transcript readers)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                            " AND application_name = '' AND pid <> pg_backend_pid()").fetchone()[0]


def test_the_first_read_after_every_read_connection_died_answers(pg_server, tmp_path):
    """The server ends every session of the sidecar's reads (a restart, a
    failover, an operator's pg_terminate_backend, a role's
    idle_session_timeout while the sidecar was idle). The next read is
    answered: a read used to run once more after a dead connection, so with
    two or more dead ones in the pool it failed UNAVAILABLE although the
    database answered all along."""
    dsn = pg_server.database("reads_all_died")
    with Sidecar(tmp_path / "data", dsn=dsn, workers=1).start() as sc:
        stub = sc.sessions()
        key = create(stub, source())[0].session_key

        def busy_reads() -> bool:  # concurrent reads make the pool open more connections
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(lambda _: stub.ListSessions(spb.ListSessionsRequest(), timeout=10), range(64)))
            return _read_connections(dsn) >= 3
        wait_until(busy_reads, 30, what="the reads' pool holds three connections or more")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE"
                         " datname = current_database() AND application_name = '' AND pid <> pg_backend_pid()")
        assert stub.GetSession(spb.GetSessionRequest(session_key=key), timeout=10).session.session_key == key


def _health(sc) -> int:
    return health_pb2_grpc.HealthStub(sc.channel()).Check(health_pb2.HealthCheckRequest(), timeout=5).status


def test_a_table_renamed_by_hand_is_a_store_fault_until_it_is_back(pg_server, tmp_path):
    """An operator renames a table of the store: a prompt is refused
    UNAVAILABLE / STORE_UNAVAILABLE naming the missing table (in the
    product's words: the server's, with the statement it failed, stay in the
    log), and health says NOT_SERVING until the table is back; then prompts
    run again, without a restart. It used to answer INTERNAL while health
    said SERVING."""
    dsn = pg_server.database("schema_damaged")
    with Sidecar(tmp_path / "data", dsn=dsn, workers=1).start() as sc:
        src = source()
        assert run(sc.prompts(), prompt_req(text="before", source=src)).end == "completed"
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("ALTER TABLE frames RENAME TO frames_moved")
        out = run(sc.prompts(), prompt_req(text="while it is gone", source=src), timeout=10)
        assert (out.code, out.reason) == (grpc.StatusCode.UNAVAILABLE, "STORE_UNAVAILABLE"), \
            (out.code, out.details)
        assert out.details == ('the store is unavailable: the store\'s PostgreSQL schema is damaged:'
                               ' table "frames" is missing; retry later'), out.details
        wait_until(lambda: _health(sc) == NOT_SERVING, 10, what="health NOT_SERVING")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("ALTER TABLE frames_moved RENAME TO frames")
        wait_until(lambda: _health(sc) == SERVING, 10, what="health SERVING again")
        assert run(sc.prompts(), prompt_req(text="after", source=src)).end == "completed"


def test_a_database_out_of_reach_is_said_in_the_product_s_words(pg_server, tmp_path):
    """The database cannot be reached (here its address refuses every
    connection): a write and a read are refused UNAVAILABLE /
    STORE_UNAVAILABLE saying so in the product's words. They said it in
    psycopg's ('the store failed (connection failed: connection to server at
    "127.0.0.1", port N failed: Connection refused ...)'), the database's
    address included."""
    from helpers.pgproxy import PgProxy
    proxy = PgProxy(pg_server.database("out_of_reach"))
    sc = Sidecar(tmp_path / "data", dsn=proxy.dsn, workers=1).start()
    try:
        create(sc.sessions())
        proxy.close()  # the connections cut, the address refusing new ones
        for call in (lambda: create(sc.sessions()),
                     lambda: sc.sessions().ListSessions(spb.ListSessionsRequest(), timeout=10)):
            with pytest.raises(grpc.RpcError) as ei:
                call()
            err = ei.value
            assert (err.code(), error_info(err)[0]) == (grpc.StatusCode.UNAVAILABLE, "STORE_UNAVAILABLE"), \
                (err.code(), err.details())
            said = err.details()
            assert said.startswith("the store is unavailable: ") and "PostgreSQL" in said, said
            assert "127.0.0.1" not in said and str(proxy.port) not in said, said
    finally:
        sc.stop()
        proxy.close()


def _end_writer_session(dsn: str) -> None:
    """pg_terminate_backend of the sidecar's writer, returning once its session is gone."""
    from agent_sidecar.store.postgres.connection import WRITER_APPLICATION
    with psycopg.connect(dsn, autocommit=True) as conn:
        pid = conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s"
                           " AND datname = current_database()", (WRITER_APPLICATION,)).fetchone()[0]
        assert conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]
        wait_until(lambda: conn.execute("SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = %s",
                                        (pid,)).fetchone()[0], 10, what="the writer's session ended")


def test_a_writer_session_ended_while_idle_fails_no_write(pg_server, tmp_path):
    """The server ends the writer's session while it waits for work (an
    operator's pg_terminate_backend, a pooler's or the role's idle timeout):
    the next write connects again first and commits. It used to fail
    STORE_UNAVAILABLE, the store then failing: health NOT_SERVING, and every
    turn the sidecar was running ended for an outage that was not one."""
    dsn = pg_server.database("writer_ended_idle")
    with Sidecar(tmp_path / "data", dsn=dsn, workers=1).start() as sc:
        src = source()
        for n in range(3):
            assert run(sc.prompts(), prompt_req(text=f"before {n}", source=src)).end == "completed"
            _end_writer_session(dsn)
            out = run(sc.prompts(), prompt_req(text=f"after {n}", source=src), timeout=10)
            assert out.code == grpc.StatusCode.OK, (out.code, out.details)
            assert out.end == "completed"
        assert "the store cannot write" not in sc.log()


def test_the_role_s_lock_and_statement_timeouts_do_not_cut_the_writer_s_waits(pg_server, tmp_path):
    """The database's settings (as a role's would) give every session a
    lock_timeout and a statement_timeout shorter than a wait the writer makes
    by design: another sidecar's commit holding the frames lock. The prompt
    waits for it and completes. It used to fail STORE_UNAVAILABLE (the wait
    cancelled: a store fault, every running turn ended with it)."""
    from agent_sidecar.store.postgres.connection import FRAMES_LOCK
    dsn = pg_server.database("role_timeouts")
    with psycopg.connect(pg_server.admin_dsn, autocommit=True) as conn:
        name = conninfo_to_dict(dsn)["dbname"]
        for setting in ("lock_timeout = '100ms'", "statement_timeout = '300ms'"):
            conn.execute(f'ALTER DATABASE "{name}" SET {setting}')
    with Sidecar(tmp_path / "data", dsn=dsn, workers=1).start() as sc:
        src = source()
        assert run(sc.prompts(), prompt_req(text="before", source=src)).end == "completed"
        with psycopg.connect(dsn) as holder:  # another sidecar's commit, for a moment
            holder.execute("SET statement_timeout = 0")
            holder.execute("SELECT pg_advisory_xact_lock(%s)", (FRAMES_LOCK,))
            waiting = PromptRun(sc.prompts(), prompt_req(text="behind the lock", source=src), timeout=30)
            wait_until(lambda: holder.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                                              " AND NOT granted").fetchone()[0] > 0, 10,
                       what="the writer waiting for the frames lock")
            holder.execute("SELECT pg_sleep(0.5)")  # longer than either timeout
        out = waiting.result(30)
        assert out.code == grpc.StatusCode.OK, (out.code, out.details)
        assert waiting.end == "completed"
        assert "the store cannot write" not in sc.log()


def test_a_start_the_database_refuses_connections_to_says_why(pg_server, tmp_path):
    """The database takes no more of this role's connections (its
    connection limit, as with max_connections exhausted by others): the
    start ends, exit 1, "cannot start" with the server's reason and no
    traceback. The writer process used to die with a traceback, and the
    sidecar said only that it "exited before saying hello"."""
    from helpers.cli import cli
    role, db = f"limited_{secrets.token_hex(4)}", f"{pg_server.prefix}_connection_limit"
    with psycopg.connect(pg_server.admin_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 1')
        conn.execute(f'CREATE DATABASE "{db}" OWNER "{role}" TEMPLATE template0')
    try:
        cfg = tmp_path / "c.toml"
        cfg.write_text(f'[store]\nbackend = "postgres"\n'
                       f'dsn = "{make_conninfo(pg_server.admin_dsn, user=role, dbname=db)}"\n')
        r = cli("serve", "--data-dir", str(tmp_path / "data"), "--config", str(cfg), "--workers", "1",
                "--log-format", "text", timeout=60)
    finally:
        with psycopg.connect(pg_server.admin_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            conn.execute(f'DROP ROLE "{role}"')
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "Traceback" not in out, out
    assert "cannot start" in out and "too many connections" in out, out


def _short_timeouts(pg_server, name: str) -> str:
    """A database whose sessions get a lock_timeout and a statement_timeout
    of a fraction of a second (as a role's ``ALTER ROLE … SET`` would give)."""
    dsn = pg_server.database(name)
    with psycopg.connect(pg_server.admin_dsn, autocommit=True) as conn:
        db = conninfo_to_dict(dsn)["dbname"]
        for setting in ("lock_timeout = '100ms'", "statement_timeout = '300ms'"):
            conn.execute(f'ALTER DATABASE "{db}" SET {setting}')
    return dsn


def _hold_until_waited_for(holder: psycopg.Connection) -> None:
    """Once another session waits for a lock ``holder``'s transaction holds,
    hold it past either of ``_short_timeouts``' (the caller's commit lets go)."""
    wait_until(lambda: holder.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()[0] > 0,
               30, what="another session waiting for the lock")
    holder.execute("SELECT pg_sleep(0.5)")


def test_the_role_s_timeouts_do_not_cut_a_start_s_wait_for_another_sidecar_s_migrations(pg_server, tmp_path):
    """A sidecar starts while another holds the migrations' lock (it starts
    at the same moment and migrates), on a database whose role or settings
    give every session short lock and statement timeouts: the start waits
    for it and serves. The wait used to be cut short, and the start ended
    ``cannot reach the PostgreSQL store: canceling statement due to
    statement timeout``."""
    from agent_sidecar.store.postgres.schema import MIGRATION_LOCK
    dsn = _short_timeouts(pg_server, "migrate_timeouts")
    with psycopg.connect(dsn) as holder, ThreadPoolExecutor(1) as pool:
        holder.execute("SET statement_timeout = 0")
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        starting = pool.submit(Sidecar(tmp_path / "data", dsn=dsn, workers=1).start, 60)
        _hold_until_waited_for(holder)
        holder.commit()
        with starting.result() as sc:
            assert run(sc.prompts(), prompt_req(text="after", source=source())).end == "completed"


def test_the_role_s_timeouts_do_not_cut_doctor_s_rebuild_of_the_full_text_index(pg_server, tmp_path):
    """``doctor --rebuild-fts`` on a database whose sessions get short
    timeouts, while a transaction holds a lock the rebuild must wait for:
    the rebuild waits and succeeds. It used to end in a traceback (the
    wait, or on a big table the rebuild itself, cancelled by the timeout),
    as did a plain ``doctor`` whose counts took longer than it."""
    from helpers.cli import cli
    dsn = _short_timeouts(pg_server, "doctor_timeouts")
    env = {"AGENT_SIDECAR_STORE__BACKEND": "postgres", "AGENT_SIDECAR_STORE__DSN": dsn}
    with psycopg.connect(dsn) as holder, ThreadPoolExecutor(1) as pool:
        holder.execute("SET statement_timeout = 0")
        holder.execute("LOCK TABLE messages IN SHARE UPDATE EXCLUSIVE MODE")
        doctoring = pool.submit(cli, "doctor", "--data-dir", str(tmp_path / "data"), "--rebuild-fts", env=env)
        _hold_until_waited_for(holder)
        holder.commit()
        r = doctoring.result()
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "Traceback" not in out, out
    assert "rebuilt full-text index from 0 messages: ok" in out, out


def test_a_start_and_doctor_on_a_server_that_takes_no_writes_say_so_and_how_to_reach_the_primary(
        pg_server, tmp_path):
    """The DSN leads to a server that takes no writes (a standby, a primary
    come back as one; here ``default_transaction_read_only``, as a standby
    answers): ``serve`` and ``doctor`` end, exit 1, in one line that says so
    and names ``target_session_attrs=read-write``. They used to say "cannot
    execute CREATE TABLE in a read-only transaction", the migrations'
    first statement, with no word of the DSN."""
    from helpers.cli import cli
    dsn = pg_server.database("read_only_start")
    with psycopg.connect(pg_server.admin_dsn, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{conninfo_to_dict(dsn)["dbname"]}" SET default_transaction_read_only = on')
    env = {"AGENT_SIDECAR_STORE__BACKEND": "postgres", "AGENT_SIDECAR_STORE__DSN": dsn}
    for args in (["serve", "--workers", "1", "--log-format", "text"], ["doctor"]):
        r = cli(*args, "--data-dir", str(tmp_path / "data"), env=env)
        out = r.stdout + r.stderr
        assert r.returncode == 1 and "Traceback" not in out, (args, out)
        (line,) = [x for x in out.splitlines() if "cannot open the PostgreSQL store" in x]
        assert "takes no writes" in line and "target_session_attrs=read-write" in line, (args, out)


def test_doctor_whose_session_the_server_ends_midway_says_so_in_one_line(pg_server, tmp_path):
    """The server ends doctor's session while its ``--rebuild-fts`` waits
    for a lock (an operator's pg_terminate_backend, a restart, a failover):
    doctor says the store failed and why, exit 1. It ended in a traceback."""
    from helpers.cli import cli
    dsn = pg_server.database("doctor_ended")
    env = {"AGENT_SIDECAR_STORE__BACKEND": "postgres", "AGENT_SIDECAR_STORE__DSN": dsn}
    with psycopg.connect(dsn) as holder, psycopg.connect(dsn, autocommit=True) as admin, \
            ThreadPoolExecutor(1) as pool:
        holder.execute("LOCK TABLE messages IN SHARE UPDATE EXCLUSIVE MODE")
        doctoring = pool.submit(cli, "doctor", "--data-dir", str(tmp_path / "data"), "--rebuild-fts", env=env)
        waiting = "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        wait_until(lambda: admin.execute(waiting).fetchone() is not None, 30, what="doctor waiting for the lock")
        admin.execute(f"SELECT pg_terminate_backend(pid) FROM ({waiting}) w")
        r = doctoring.result()
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "Traceback" not in out, out
    assert "agent-sidecar doctor: the PostgreSQL store failed: terminating connection due to administrator command" \
        in out, out


def test_an_operator_s_cancel_of_the_writer_s_statement_fails_no_turn(pg_server, tmp_path):
    """An operator cancels the writer's statement (pg_cancel_backend of a
    query seen waiting in pg_stat_activity; here for the frames lock another
    sidecar's commit holds): the writer runs its group again and the prompt
    completes. The cancel used to be a store fault: the prompt failed
    UNAVAILABLE, health went NOT_SERVING and every running turn ended."""
    from agent_sidecar.store.postgres.connection import FRAMES_LOCK, WRITER_APPLICATION
    dsn = pg_server.database("writer_cancelled")
    with Sidecar(tmp_path / "data", dsn=dsn, workers=1).start() as sc:
        src = source()
        assert run(sc.prompts(), prompt_req(text="before", source=src)).end == "completed"
        with psycopg.connect(dsn) as holder, psycopg.connect(dsn, autocommit=True) as admin:
            holder.execute("SELECT pg_advisory_xact_lock(%s)", (FRAMES_LOCK,))
            waiting = PromptRun(sc.prompts(), prompt_req(text="behind the lock", source=src), timeout=30)
            writer = ("SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                      " AND application_name = %s AND wait_event_type = 'Lock'")
            wait_until(lambda: admin.execute(writer, (WRITER_APPLICATION,)).fetchone() is not None, 10,
                       what="the writer waiting for the frames lock")
            assert admin.execute(f"SELECT pg_cancel_backend(pid) FROM ({writer}) w",
                                 (WRITER_APPLICATION,)).fetchone() == (True,)
            wait_until(lambda: admin.execute(writer, (WRITER_APPLICATION,)).fetchone() is not None, 10,
                       what="the writer waiting for the frames lock again")
        out = waiting.result(30)
        assert out.code == grpc.StatusCode.OK, (out.code, out.details)
        assert waiting.end == "completed"
        assert "the store cannot write" not in sc.log()

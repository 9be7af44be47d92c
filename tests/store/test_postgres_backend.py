"""The PostgreSQL backend itself (store/postgres/), on a real server: its
numbered migrations, that every lookup and list of the request path goes
through an index, what the log says the store is, and its connections (lost,
never answering, a server too old). Its text and full-text index:
test_postgres_text.py. A test of a backend may use its SQL; the behaviour of
the sidecar on PostgreSQL is the behavioural suite's (``--backend postgres``)."""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import pytest
from psycopg.conninfo import make_conninfo

from agent_sidecar.store.postgres import reads
from agent_sidecar.store.postgres.connection import connect, connect_async
from agent_sidecar.store.postgres.schema import MIGRATIONS, migrate
from agent_sidecar.store.postgres.uow import PostgresUnitOfWork
from agent_sidecar.store.records import Append, LedgerEntry, Message, QueueSlot, RoutingPatch, SessionEntry, UsageDelta

pytestmark = pytest.mark.postgres_only("the PostgreSQL backend's own schema, plans and text")

# Tables that grow with use: a scan of one of them on the request path is a defect.
BIG = {"routing", "incarnations", "messages", "prompts", "prompt_queue", "frames", "turn_state", "leases"}
LANES, MESSAGES_PER_LANE, PROMPTS_PER_LANE, FRAMES_PER_PROMPT = 2000, 10, 4, 5
NOW = time.time()


def test_migrations_are_numbered_and_run_once_by_sidecars_starting_together(pg_server):
    assert [v for v, _, _ in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1))
    dsn = pg_server.dsn(_fresh_database(pg_server, "migrate"))
    applied: list[list[int]] = []

    def one():
        with connect(dsn, autocommit=True) as conn:
            applied.append(migrate(conn))
    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(applied, key=len) == [[], [], [], [v for v, _, _ in MIGRATIONS]]
    with connect(dsn, autocommit=True) as conn:
        assert [r[0] for r in conn.execute("SELECT version FROM schema_migrations ORDER BY 1")] == \
            [v for v, _, _ in MIGRATIONS]
        assert migrate(conn) == []


def _fresh_database(server, name: str) -> str:
    """An empty database (not from the migrated template)."""
    db = f"{server.prefix}_{name}"
    with connect(server.admin_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db}"')
        conn.execute(f'CREATE DATABASE "{db}" TEMPLATE template0')
    server._created.add(db)
    return db


# -- every lookup and list through an index ------------------------------------------------------

class Explaining:
    """A connection that EXPLAINs every statement before running it and keeps
    the relations each plan reads whole (Seq Scan). Sequential scans are
    disabled on it, so a plan keeps one only where no index can serve the
    statement at all, whatever the tables' sizes and statistics."""

    def __init__(self, conn):
        self.conn = conn
        self.scans: dict[str, set[str]] = {}
        self.unkeyed: dict[str, set[str]] = {}  # relations read with no index condition (see unkeyed_scans)
        conn.execute("SET enable_seqscan = off")
        self.partial = {r[0] for r in conn.execute(
            "SELECT indexrelid::regclass::text FROM pg_index WHERE indpred IS NOT NULL")}

    def explain(self, sql: str, params) -> None:
        if not sql.lstrip().upper().startswith(("SELECT", "INSERT", "UPDATE", "DELETE", "WITH", "(")):
            return
        plan = self.conn.execute("EXPLAIN (FORMAT JSON) " + sql, params).fetchone()[0]
        self.scans[sql] = set(seq_scans(plan[0]["Plan"]))
        self.unkeyed[sql] = set(unkeyed_scans(plan[0]["Plan"], self.partial))

    def execute(self, sql, params=None, **kw):
        self.explain(sql, params)
        return self.conn.execute(sql, params, **kw)

    def cursor(self):
        outer = self

        class Cursor:
            def __init__(self):
                self.cur = outer.conn.cursor()

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.cur.close()

            def execute(self, sql, params=None, **kw):
                outer.explain(sql, params)
                return self.cur.execute(sql, params, **kw)

            def executemany(self, sql, rows):
                rows = list(rows)
                if rows:
                    outer.explain(sql, rows[0])
                return self.cur.executemany(sql, rows)
        return Cursor()

    def transaction(self):
        return self.conn.transaction()


class ExplainingAsync:
    def __init__(self, conn, into: Explaining):
        self.conn, self.into = conn, into

    async def start(self) -> ExplainingAsync:
        await self.conn.execute("SET enable_seqscan = off")
        return self

    async def execute(self, sql, params=None):
        if sql.lstrip().upper().startswith("SELECT"):
            cur = await self.conn.execute("EXPLAIN (FORMAT JSON) " + sql, params)
            self.into.scans[sql] = set(seq_scans((await cur.fetchone())[0][0]["Plan"]))
        return await self.conn.execute(sql, params)


def seq_scans(node: dict):
    if node.get("Node Type") == "Seq Scan":
        yield node["Relation Name"]
    for child in node.get("Plans", ()):
        yield from seq_scans(child)


def unkeyed_scans(node: dict, partial: set[str]):
    """Relations a plan reads whole: a Seq Scan, or (what ``enable_seqscan =
    off`` turns a seq scan into) an index scan with no index condition on an
    index that is not partial. A partial index is a small set by design
    (open ledger rows, lanes marked resume_pending)."""
    kind = node.get("Node Type")
    if kind == "Seq Scan" or (kind in ("Index Scan", "Index Only Scan") and "Index Cond" not in node
                              and node.get("Index Name") not in partial):
        yield node["Relation Name"]
    for child in node.get("Plans", ()):
        yield from unkeyed_scans(child, partial)


POPULATE = f"""
INSERT INTO routing (session_key, session_id, profile, platform, chat_type, created_at, updated_at,
                     suspended, resume_pending, running)
SELECT 'agent:main:p' || (i % 3) || ':dm:' || i, 's' || i, 'main', 'p' || (i % 3), 'dm',
       {NOW} - 40 * 86400 + i * 600, {NOW} - 40 * 86400 + i * 600, i % 97 = 0, i % 89 = 0, i % 83 = 0
FROM generate_series(1, {LANES}) i;
INSERT INTO incarnations (session_id, session_key, created_at, next_seq)
SELECT session_id, session_key, created_at, {MESSAGES_PER_LANE} + 1 FROM routing;
INSERT INTO messages (session_id, seq, role, content, created_at, request_id)
SELECT 's' || i, n, CASE WHEN n % 2 = 1 THEN 'user' ELSE 'assistant' END,
       'word' || (i * 7 + n) % 1000 || ' lane' || i || ' filler text number ' || n,
       {NOW} - 40 * 86400 + i * 600 + n, 'r' || i || '-' || ((n + 1) / 2 % {PROMPTS_PER_LANE})
FROM generate_series(1, {LANES}) i, generate_series(1, {MESSAGES_PER_LANE}) n;
INSERT INTO prompts (request_id, session_key, session_id, platform, status, delivery, text, created_at,
                     started_at, finished_at, first_frame, first_seq)
SELECT 'r' || i || '-' || k, 'agent:main:p' || (i % 3) || ':dm:' || i, 's' || i, 'p' || (i % 3),
       CASE WHEN i % 5 = 0 AND k = 3 THEN 'queued' ELSE 'completed' END, 3, 'hello',
       {NOW} - 40 * 86400 + i * 600 + k, {NOW} - 40 * 86400 + i * 600 + k, {NOW} - 40 * 86400 + i * 600 + k,
       ((i - 1) * {PROMPTS_PER_LANE} + k) * {FRAMES_PER_PROMPT} + 1, k * 2 + 1
FROM generate_series(1, {LANES}) i, generate_series(0, {PROMPTS_PER_LANE - 1}) k;
INSERT INTO prompt_queue (request_id, session_key, slot, position, enqueued_at)
SELECT request_id, session_key, 'fifo', 1, created_at FROM prompts WHERE status = 'queued';
INSERT INTO frames (id, request_id, seq, session_key, session_id, platform, at, kind, body)
SELECT p.first_frame + f - 1, p.request_id, f, p.session_key, p.session_id, p.platform, p.created_at + f,
       CASE WHEN f = 1 THEN 'accepted' ELSE 'text_delta' END, '{{"text": "x"}}'::jsonb
FROM prompts p, generate_series(1, {FRAMES_PER_PROMPT}) f;
SELECT setval('frames_id_seq', (SELECT max(id) FROM frames));
INSERT INTO turn_state (session_id, request_id, updated_at, state)
SELECT session_id, 'r', created_at, '{{}}'::jsonb FROM routing;
INSERT INTO leases (session_key, node_id, epoch, expires_at, address, released)
SELECT 'agent:main:p' || (i % 3) || ':dm:' || i, 'n' || (i % 3), 1 + i % 5,
       now() + CASE WHEN i % 4 = 0 THEN interval '-1 hour' ELSE interval '1 hour' END, 'addr', i % 7 = 0
FROM generate_series(1, {LANES}) i;
INSERT INTO nodes (node_id, address) VALUES ('n0', 'addr'), ('n1', 'addr'), ('n2', 'addr');
ANALYZE;
"""


@pytest.fixture(scope="module")
def big_store(pg_server):
    dsn = pg_server.database("big")
    with connect(dsn, autocommit=True) as conn:
        conn.execute(POPULATE)
    return dsn


def lane(i: int) -> tuple[str, str]:
    return f"agent:main:p{i % 3}:dm:{i}", f"s{i}"


def exercise_writes(uow: PostgresUnitOfWork) -> None:
    """Every repository operation of the request path and the restore, once."""
    key, sid = lane(1500)
    other_key, other_sid = lane(1600)
    rid = "r1500-1"
    r, inc, msgs, led, q, fr = (uow.routing, uow.incarnations, uow.messages, uow.ledger, uow.queue,
                                uow.frames)
    r.get(key)
    r.head(key)
    r.insert(SessionEntry("agent:main:p0:dm:new", "s-new", "main", "p0", "dm", NOW, NOW))
    r.patch(key, RoutingPatch(running=True), session_id=sid, if_current=RoutingPatch(resume_pending=False))
    r.add_usage(key, UsageDelta(input_tokens=3, last_prompt_tokens=3, cost_status="ok"), NOW)
    r.keys_active_since(NOW - 3600)
    r.resume_candidates(NOW - 3600)
    r.idle_before(NOW - 39 * 86400)
    r.clear_running()
    inc.insert("s-new", "agent:main:p0:dm:new", NOW)
    inc.get(sid)
    inc.end(sid, "reset", NOW)
    inc.reopen(sid)
    inc.add_turn(sid)
    inc.bump_rev(sid)
    inc.of_key(key)
    msgs.append([Append(sid, (Message(role="user", content="hi"),), request_id=rid),
                 Append(other_sid, (Message(role="user", content="yo"),), request_id=None)])
    msgs.hide_from(sid, 9, "rewind")
    msgs.hide_request(sid, rid, "rollback")
    msgs.last_user(sid, 2)
    msgs.of_request(rid)
    msgs.hide_live(other_sid, "reset")
    led.get(rid)
    led.insert(LedgerEntry("r-new", key, sid, "p1", "queued", 3, "hello", {}, NOW))
    q.insert(QueueSlot("r-new", key, "fifo", 2, NOW))
    led.mark_started("r-new", sid, NOW, 12, True)
    led.mark_started(rid, sid, NOW, 12, False)
    cursor = fr.insert([("r-new", 1, key, sid, "p1", NOW, "accepted", b'{"queue_position": 0}')])
    led.set_first_frame("r-new", cursor, 12)
    fr.last_seq("r-new")
    led.close("r-new", "completed", "", 1, NOW)
    q.remove("r-new")
    led.open_prompts()
    led.open_prompts([key])
    led.ids_with_prefix("r1500-")
    led.recent(NOW - 60, 100)
    led.delete_closed_before(NOW - 39 * 86400, 100)
    led.forget(rid)
    fr.delete_before(NOW - 39 * 86400, 100)
    uow.restarts.increment(key, NOW)
    uow.restarts.reset(key)
    uow.turn_state.put(sid, rid, NOW, {"n": 1})
    uow.delete_lane(other_key)
    exercise_leases(uow)


def exercise_leases(uow: PostgresUnitOfWork) -> None:
    """Every operation of the cluster's leases and node rows, once."""
    key, held_elsewhere = lane(1500)[0], lane(1501)[0]  # a lease run out; one another node holds
    leases = uow.leases
    leases.take(key, "n0", "addr", 30)
    leases.take(held_elsewhere, "n-new", "addr", 30)  # refused: who holds it is read back
    leases.fenced("n0", {key: 2, held_elsewhere: 3})
    leases.renew("n0", [key, held_elsewhere], 30)
    leases.of_node("n1")
    leases.orphaned(50)  # both branches: open ledger rows, lanes marked resume_pending
    leases.expire(key, "n0", 2)
    leases.release(key, "n0", 2)
    leases.revoke([key])
    leases.revoked([key, held_elsewhere])
    uow.nodes.arrive("n0", "addr")
    uow.nodes.leave("n0")


async def exercise_reads(conn) -> None:
    key, sid = lane(1500)
    await reads.entry(conn, key)
    await reads.session_key_of(conn, sid)
    await reads.list_entries(conn, "", None, None, 50)
    await reads.list_entries(conn, "p1", None, None, 50)
    await reads.list_entries(conn, "", NOW - 86400, (NOW - 3600, key), 50)
    await reads.transcript(conn, sid, False, 0, None)
    await reads.transcript(conn, sid, True, 4, 100)
    await reads.search(conn, "word123", "", 20)
    await reads.search(conn, "word123 filler", key, 20)
    await reads.ledger(conn, "r1500-2")
    await reads.recent_requests(conn, NOW - 3600, 100)
    await reads.request_frames(conn, "r1500-2", 0)
    await reads.request_frames(conn, "r1500-2", 2, 39_000, 256)  # a replay's next page
    await reads.frames_after(conn, 39_000, key, "", 1000)
    await reads.frames_after(conn, 39_000, "", "p1", 1000)
    await reads.frames_after(conn, 39_000, "", "", 1000)


def test_every_lookup_and_list_goes_through_an_index(big_store):
    with connect(big_store, autocommit=True) as raw:
        conn = Explaining(raw)
        with raw.transaction(force_rollback=True):
            uow = PostgresUnitOfWork(conn)
            uow.begin()
            exercise_writes(uow)
        reads.load_for_model(conn, lane(1500)[1])

    async def go():
        async with await connect_async(big_store, autocommit=True) as aconn:
            await exercise_reads(await ExplainingAsync(aconn, conn).start())
    asyncio.run(go())
    assert len(conn.scans) >= 50, f"only {len(conn.scans)} statements seen"
    scans = {sql: sorted(tables & BIG) for sql, tables in conn.scans.items() if tables & BIG}
    assert not scans, "\n".join(f"Seq Scan on {t}: {sql}" for sql, t in scans.items())
    # The cluster's statements run on every node every few seconds (renewals,
    # the reaper): none may read a table whole, not even along an index.
    cluster = [sql for sql in conn.unkeyed if "leases" in sql or "nodes" in sql]
    assert len(cluster) >= 10, cluster
    whole = {sql: sorted(conn.unkeyed[sql] & (BIG | {"nodes"})) for sql in cluster
             if conn.unkeyed[sql] & (BIG | {"nodes"})}
    assert not whole, "\n".join(f"{t} read whole: {sql}" for sql, t in whole.items())


# -- what the log says the store is ---------------------------------------------------------------

def test_the_serving_line_names_postgres_and_the_dsn_without_its_password(pg_server, tmp_path):
    """The log line is the behaviour here: it says what the store is, and never a secret,
    the client key's password (sslpassword, unused without TLS) included: it was logged."""
    from helpers.logs import log_lines
    from sidecar_proc import Sidecar
    secret = "not-the-servers-password"  # the tests' server trusts local connections: any will do
    key_secret = "not-the-client-keys-password"
    dsn = make_conninfo(pg_server.database("serving_line"), password=secret, sslpassword=key_secret)
    sc = Sidecar(tmp_path / "data", dsn=dsn).start()
    try:
        (line,) = log_lines(sc, "serving")
    finally:
        sc.stop()
    assert line["db"].startswith("postgres ") and "dbname=" in line["db"], line
    assert "sidecar.db" not in line["db"] and "password" not in line["db"] and secret not in sc.log()
    assert key_secret not in sc.log(), line


@pytest.mark.parametrize("dsn, pieces", [
    ("postgresql://agent:50%off-Secret@127.0.0.1:1/agent", ["50%off-Secret", "off-Secret"]),
    ("host=127.0.0.1 port=1 user=agent password=first Secondhalf", ["Secondhalf"]),
])
def test_a_dsn_libpq_cannot_read_is_refused_without_quoting_its_password(tmp_path, dsn, pieces):
    """libpq's complaint about a DSN quotes the piece it could not read: a
    URI password with a bare ``%`` (an invalid percent-encoding) came out
    whole in the ``cannot start`` line and doctor's message, the second word
    of an unquoted password with a space too. Both now say why without it."""
    from helpers.cli import cli
    env = {"AGENT_SIDECAR_STORE__BACKEND": "postgres", "AGENT_SIDECAR_STORE__DSN": dsn}
    for args in (["serve", "--data-dir", str(tmp_path / "data"), "--workers", "1"],
                 ["doctor", "--data-dir", str(tmp_path / "data")]):
        r = cli(*args, env=env)
        out = r.stdout + r.stderr
        assert r.returncode == 1 and "cannot open the PostgreSQL store" in out, (args, out)
        assert "store.dsn is not a connection string libpq can read" in out, out
        assert not [p for p in pieces if p in out], out



def test_the_writer_connects_again_after_its_connection_is_lost(pg_server, tmp_path):
    """The server ends the writer's session (a restart, a failover, an
    operator's pg_terminate_backend): writes fail as a store fault for a moment,
    then the writer has a new connection and prompts run again, without a
    restart of the sidecar."""
    import psycopg
    from helpers.ids import source
    from helpers.streams import prompt_req, run
    from helpers.waiting import wait_until
    from sidecar_proc import Sidecar

    from agent_sidecar.store.postgres.connection import WRITER_APPLICATION
    dsn = pg_server.database("writer_reconnects")
    with Sidecar(tmp_path / "data", dsn=dsn).start() as sc:
        src = source()
        assert run(sc.prompts(), prompt_req(text="before", source=src)).end == "completed"
        with psycopg.connect(dsn, autocommit=True) as conn:
            cut = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                               " WHERE application_name = %s AND datname = current_database()",
                               (WRITER_APPLICATION,)).fetchone()[0]
        assert cut == 1

        def answered() -> bool:
            out = run(sc.prompts(), prompt_req(text="after", source=src), timeout=10)
            return out.code == grpc.StatusCode.OK and out.end == "completed" and out.text() == "after"
        wait_until(answered, 30, what="a prompt completed after the writer's connection was cut")


def test_a_server_that_accepts_and_never_answers_ends_the_start_instead_of_holding_it(tmp_path):
    """A PostgreSQL address that takes connections and never answers (a hung
    host, a half-open route): the start ends, exit status 1 and "cannot reach
    the PostgreSQL store", after the connect timeout. It used to print nothing
    for psycopg's default of over two minutes (this test's 60 s run out)."""
    import socket

    from helpers.cli import cli
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(8)  # the kernel completes the handshake; nobody reads
        cfg = tmp_path / "c.toml"
        cfg.write_text('[store]\nbackend = "postgres"\n'
                       f'dsn = "host=127.0.0.1 port={mute.getsockname()[1]} user=x dbname=y"\n')
        r = cli("serve", "--data-dir", str(tmp_path / "data"), "--config", str(cfg), "--workers", "1",
                "--log-format", "text", timeout=60)
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "Traceback" not in out, out
    assert "cannot reach the PostgreSQL store" in out and "timeout" in out, out


def test_a_server_older_than_13_is_refused_by_name_and_this_one_is_not(pg_server):
    """The writer needs pg_current_xact_id and pg_xact_status (13): an older
    server is refused at start with the reason, not at the first commit."""
    from agent_sidecar.store.postgres.connection import version_refused
    assert version_refused(120015) == "PostgreSQL 13 or later is needed; this server is 12 (120015)"
    assert version_refused(90624) == "PostgreSQL 13 or later is needed; this server is 9.6 (90624)"
    with connect(pg_server.admin_dsn, autocommit=True) as conn:
        assert version_refused(conn.info.server_version) is None

"""A tool call is answered once, whichever nodes the answers are sent to
(sessions/transcripts.py ``check_answers``): AppendMessages runs on the node
it reaches, so two sidecars' writers may check one transcript at the same
moment. Each check reads the transcript under its incarnation's row lock, in
a statement after the lock is granted, so the second reads what the first
appended. Made deterministic by holding that row lock from the test while
both nodes' appends queue behind it: two real sidecars on one real
PostgreSQL database."""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor

import grpc
import psycopg
from helpers.cluster import Cluster
from helpers.config import echo
from helpers.sessions import msg, seed, transcript
from helpers.waiting import wait_until

from agent_sidecar.v1 import session_service_pb2 as spb

CALL = '[{"id": "c1", "type": "function", "function": {"name": "t.x", "arguments": "{}"}}]'


@contextlib.contextmanager
def incarnation_locked(dsn: str, session_id: str):
    """A transaction of the test's own holding the incarnation's row lock
    until the block ends (then it commits)."""
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT 1 FROM incarnations WHERE session_id = %s FOR UPDATE", (session_id,))
        yield
        conn.commit()


def lock_waits(dsn: str) -> int:
    """Sessions of the database waiting for a lock another transaction holds."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                            " AND wait_event_type = 'Lock'").fetchone()[0]


def test_one_call_answered_on_two_nodes_at_once_takes_one_answer(tmp_path, cluster_dsn):
    with Cluster(tmp_path, cluster_dsn, n=2, config=echo("main")) as c:
        s = seed(c["a"].sessions(), messages=[msg("user", "do it"), msg("assistant", "", tool_calls_json=CALL)])

        def answer(node) -> grpc.StatusCode:
            try:
                node.sessions().AppendMessages(spb.AppendMessagesRequest(
                    session_id=s.session_id, messages=[msg("tool", node.node_id, tool_call_id="c1")]), timeout=30)
                return grpc.StatusCode.OK
            except grpc.RpcError as e:
                assert "messages[0].tool_call_id" in e.details(), e.details()
                return e.code()
        with ThreadPoolExecutor(2) as pool:
            with incarnation_locked(c.dsn, s.session_id):
                answers = [pool.submit(answer, node) for node in c]
                wait_until(lambda: lock_waits(c.dsn) == 2, timeout=30, what="both nodes' appends waiting")
            codes = sorted(a.result(30).name for a in answers)
        assert codes == ["INVALID_ARGUMENT", "OK"]
        assert [m.tool_call_id for m in transcript(c["b"].sessions(), s.session_id)].count("c1") == 1

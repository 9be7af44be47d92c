"""ClearAllSessions and DeleteSession act on every node of a cluster (issue
16): the node that ran the call revokes the lanes' leases and announces it in
the delete's own transaction (NOTIFY on the control channel), and every other
node drops what it held of those lanes: a turn it runs or queues stops without
writing (the fence would refuse it; its stream ends CANCELLED), so no row of a
cleared session comes back; its cached agents are evicted, the request ids it
remembers are forgotten (a reuse runs a new turn instead of replaying a
deleted one). Two real sidecars on one real PostgreSQL database."""

from __future__ import annotations

import contextlib

import grpc
import psycopg
import pytest
from helpers.cluster import Cluster
from helpers.config import echo, scripted
from helpers.ids import source, words
from helpers.sessions import get_session, rpc_error, transcript
from helpers.store import StoreView
from helpers.streams import QUEUE, TERMINAL, PromptRun, assert_well_formed, kind_of, prompt_req, run, watch
from helpers.tools import AB_SCHEMA, ToolHost
from helpers.waiting import wait_until
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from agent_sidecar.api.session_service import CLEAR_ALL_CONFIRM
from agent_sidecar.errors import CANCELLED, LANE_MOVED
from agent_sidecar.store.postgres.store import follower_name
from agent_sidecar.v1 import session_service_pb2 as spb

PROFILES = echo("main") + echo("slow", 20)


@pytest.fixture
def cl(tmp_path, cluster_dsn):
    with Cluster(tmp_path, cluster_dsn, n=2, config=PROFILES) as c:
        yield c


def assert_runs_anew(node, req, old) -> None:
    """The same request id (and session) as ``old`` on ``node``, once that node
    has heard of the delete: a new turn in a new session, not a replay of the
    deleted one (REQUEST_NOT_FOUND: a replay changes nothing, so it is asked again)."""
    def anew():
        out = run(node.prompts(), req)
        return out if out.code == grpc.StatusCode.OK else None
    again = wait_until(anew, 10, interval=0.05, what=f"{req.request_id} to run anew on {node.node_id}")
    assert_well_formed(again)
    assert again.session_id != old.session_id and again.key == old.key
    assert [m.content for m in transcript(node.sessions(), again.session_id)] == [req.text, req.text]


def test_clear_all_on_one_node_clears_every_node(cl):
    a, b = cl["a"], cl["b"]
    idle_req = prompt_req(text="an idle session on b")
    idle = run(b.prompts(), idle_req)
    src = source()
    busy = PromptRun(b.prompts(), text=words(400), src=src, profile="slow")
    busy.wait_for("text_delta")
    queued = PromptRun(b.prompts(), prompt_req(text="waiting", source=src, profile="slow", delivery=QUEUE))
    queued.wait_for("accepted")

    r = a.sessions().ClearAllSessions(spb.ClearAllSessionsRequest(confirm=CLEAR_ALL_CONFIRM), timeout=10)
    assert r.sessions_deleted == 2

    # b's turns stop without writing (their session is gone, frames and all): CANCELLED.
    for stream in (busy, queued):
        stream.result(30)
        assert (stream.code, stream.reason) == (grpc.StatusCode.CANCELLED, CANCELLED), stream.kinds()
    # Nothing of the cleared sessions comes back once b's turns have ended, on any node.
    for node in (a, b):
        for key in (idle.key, busy.key):
            with rpc_error(grpc.StatusCode.NOT_FOUND):
                get_session(node.sessions(), key)
        assert list(node.sessions().ListSessions(spb.ListSessionsRequest(), timeout=10).sessions) == []
        for rid in (idle.request_id, busy.request_id, queued.request_id):
            assert watch(node.prompts(), request_id=rid, timeout=10).code == grpc.StatusCode.NOT_FOUND
    store = StoreView(a)
    assert store.entries() == [] and store.frames_after(0) == [] and store.open_prompts() == []
    for sid in (idle.session_id, busy.session_id):
        assert store.transcript(sid, include_rewound=True) == [] and store.session_key_of(sid) is None
    for rid in (idle.request_id, busy.request_id, queued.request_id):
        assert store.ledger(rid) is None and store.request_frames(rid) == []
    # The cleared lanes work again, on either node (nobody trusts a revoked lease).
    assert_runs_anew(b, idle_req, idle)
    for node in (b, a):
        again = run(node.prompts(), prompt_req(text=f"again on {node.node_id}", source=src, profile="slow"))
        assert_well_formed(again)
        assert again.key == busy.key and again.session_id != busy.session_id


# b's turn calls a tool whose host never answers: it waits, writing nothing.
WAITING_ON_A_TOOL = scripted("main", [{"tool_calls": [{"name": "calc.add", "arguments": {"a": 2, "b": 3}}]},
                                      {"text": "never reached"}], tools=["calc.*"])


@contextlib.contextmanager
def _turn_waiting_on_b(tmp_path, dsn: str, **cluster_kw):
    """A cluster of a and b, b running a turn that waits for a tool result
    its host never sends: (the cluster, the turn's stream, its source)."""
    with Cluster(tmp_path, dsn, n=2, config=WAITING_ON_A_TOOL, **cluster_kw) as c:
        with ToolHost(c["b"].tools(), "calc", [("calc.add", "Add two numbers", AB_SCHEMA)]) as host:
            src = source()
            busy = PromptRun(c["b"].prompts(), text="add", src=src)
            assert host.on_invocation.wait(30), busy.kinds()
            yield c, busy, src


def test_a_delete_a_node_learns_of_at_its_lease_renewal_still_ends_its_turn_cancelled(tmp_path, cluster_dsn):
    """b's listening connection is cut just before a ClearAllSessions on a, so
    b misses the delete's notification (it is not replayed), and b's turn,
    waiting for a tool's result, writes nothing the fence could refuse: b
    learns of the delete at its next lease renewal, which finds the lease
    revoked. Its turn ends as a deleted session's does, CANCELLED, not as a
    lane taken from it (LANE_MOVED, which an adapter would retry)."""
    with _turn_waiting_on_b(tmp_path, cluster_dsn) as (c, busy, _):
        with psycopg.connect(c.dsn, autocommit=True) as conn:
            cut = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                               " WHERE application_name = %s AND datname = current_database()",
                               (follower_name("b"),)).fetchone()[0]
        assert cut == 1
        r = c["a"].sessions().ClearAllSessions(spb.ClearAllSessionsRequest(confirm=CLEAR_ALL_CONFIRM), timeout=10)
        assert r.sessions_deleted == 1
        busy.result(30)
    assert (busy.code, busy.reason) == (grpc.StatusCode.CANCELLED, CANCELLED), busy.kinds()


def test_delete_session_on_one_node_is_forgotten_on_every_node(cl):
    a, b = cl["a"], cl["b"]
    src = source()
    req = prompt_req(text="a session run on b", source=src, profile="slow")
    first = run(b.prompts(), req)
    busy = PromptRun(b.prompts(), text=words(400), src=src, profile="slow")
    busy.wait_for("text_delta")
    assert a.sessions().DeleteSession(spb.DeleteSessionRequest(session_key=first.key), timeout=10).deleted
    assert busy.result(30).end == "failed" and busy.last.failed.reason == CANCELLED, busy.kinds()
    with rpc_error(grpc.StatusCode.NOT_FOUND):
        get_session(b.sessions(), first.key)
    assert_runs_anew(b, req, first)


def test_a_delete_made_while_the_turns_node_is_stalled_past_its_lease_ends_that_turn_cancelled(tmp_path, cluster_dsn):
    """b runs a turn waiting for a tool's result and stalls (SIGSTOP) for longer
    than it trusts its lease; meanwhile a deletes the session (b's lease ran
    out: a takes the lane and deletes it there). When b goes on, its sweeper
    finds the lease untrusted before anything else runs: the turn must still
    end as a deleted session's does, CANCELLED, not LANE_MOVED (which an
    adapter retries, running the prompt again in a fresh session)."""
    with _turn_waiting_on_b(tmp_path, cluster_dsn) as (c, busy, _):
        _stalled_through(c, busy, _delete)
        busy.result(30)
    assert (busy.code, busy.reason) == (grpc.StatusCode.CANCELLED, CANCELLED), (busy.kinds(), busy.details)


def _reset(c: Cluster, key: str) -> None:
    c["a"].sessions().ResetSession(spb.ResetSessionRequest(session_key=key), timeout=10)


def _suspend(c: Cluster, key: str) -> None:
    assert c["a"].sessions().SuspendSession(spb.SuspendSessionRequest(session_key=key), timeout=10).session.suspended


@pytest.mark.parametrize("op, said", [(_reset, "reset"), (_suspend, "suspended (/stop)")])
def test_a_reset_or_suspend_made_while_the_turns_node_is_stalled_past_its_lease_ends_as_on_one_sidecar(
        tmp_path, cluster_dsn, op, said):
    """As for a delete: a ResetSession or a SuspendSession (/stop) made on a
    while b, running the lane's turn with a prompt waiting behind it, stalls
    past its lease (a takes the lane, which closes the turn as cut off and
    takes the waiting prompt over, then resets or suspends it). On one
    sidecar either cancels the running turn and ends the waiting prompts
    superseded. The running turn's stream must end CANCELLED here too, not
    LANE_MOVED. The waiting prompt's must not: a took it over with the lane
    and ended it there (superseded, or as it ran: the takeover may start it
    before the call's drop), so its stream ends LANE_MOVED and a retry with
    its request id gets that end (the stuck-loop guard's suspension is told
    apart from a /stop: test_resume.py)."""
    with _turn_waiting_on_b(tmp_path, cluster_dsn) as (c, busy, src):
        waiting = PromptRun(c["b"].prompts(), text="after", src=src, delivery=QUEUE)
        waiting.wait_for("accepted")
        _stalled_through(c, busy, op)
        busy.result(30)
        waiting.result(30)
        ended = watch(c["a"].prompts(), request_id=waiting.request_id).frames[-1]
    assert (busy.code, busy.reason) == (grpc.StatusCode.CANCELLED, CANCELLED), (busy.kinds(), busy.details)
    assert busy.details == f"the session was {said} while this prompt was in flight"
    assert (waiting.code, waiting.reason) == (grpc.StatusCode.UNAVAILABLE, LANE_MOVED), waiting.details
    assert kind_of(ended) in TERMINAL, ended


def _delete(c: Cluster, key: str) -> None:
    assert c["a"].sessions().DeleteSession(spb.DeleteSessionRequest(session_key=key), timeout=10).deleted


def _stalled_through(c: Cluster, busy: PromptRun, *calls) -> None:
    """b stalled (SIGSTOP) until its lease on ``busy``'s lane has run out, each
    of ``calls(c, key)`` made meanwhile; b goes on after."""
    store = StoreView(c["a"])
    c["b"].pause()
    try:
        wait_until(lambda: store.lease_holder(busy.key) is None, timeout=30, what="b's lease run out")
        for call in calls:
            call(c, busy.key)
    finally:
        c["b"].resume()


def test_a_delete_and_a_new_turn_on_the_lane_while_the_turns_node_is_stalled_end_that_turn_cancelled(
        tmp_path, cluster_dsn):
    """As above, and before b goes on, a new prompt on the lane runs on a:
    the lease names a now, not nobody, though the session b's turn ran in
    was deleted. Its turn must still end CANCELLED, as a deleted session's
    does: its request is gone from the ledger, so the LANE_MOVED an adapter
    retries would run the prompt again, in a fresh session."""
    with _turn_waiting_on_b(tmp_path, cluster_dsn) as (c, busy, src):
        def a_takes_the_lane(c: Cluster, key: str):
            assert_well_formed(run(c["a"].prompts(), prompt_req(text="anew", source=src)))
            assert StoreView(c["a"]).status(busy.request_id) is None  # the deleted turn's row went with it
        _stalled_through(c, busy, _delete, a_takes_the_lane)
        busy.result(30)
    assert (busy.code, busy.reason) == (grpc.StatusCode.CANCELLED, CANCELLED), (busy.kinds(), busy.details)


@contextlib.contextmanager
def not_listening(c: Cluster, node_id: str):
    """The node's listening connection cut, and no new connection to the
    cluster's database let in until the block ends (the node's follower
    retries, refused): whatever is announced meanwhile never reaches it.
    Then, once its follower listens again."""
    db = conninfo_to_dict(c.dsn)["dbname"]
    with psycopg.connect(make_conninfo(c.dsn, dbname="postgres"), autocommit=True) as admin:
        def followers() -> int:
            return admin.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
                                 " AND datname = %s", (follower_name(node_id), db)).fetchone()[0]
        admin.execute(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS false')
        try:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                          " WHERE application_name = %s AND datname = %s", (follower_name(node_id), db))
            wait_until(lambda: followers() == 0, timeout=10, what=f"{node_id} not listening")
            yield
        finally:
            admin.execute(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS true')
        wait_until(lambda: followers() == 1, timeout=30, what=f"{node_id} listening again")


def test_a_node_that_missed_a_clear_all_while_not_listening_forgets_its_request_ids(cl):
    """b ran a turn, then its listening connection was down while a cleared
    every session: the announce is not replayed. Once b listens again, the
    turn's request id (its ledger row deleted) runs a new turn on b, as after
    a delete b heard of, instead of REQUEST_NOT_FOUND for the dedup window."""
    a, b = cl["a"], cl["b"]
    req = prompt_req(text="a session run on b", source=source())
    first = run(b.prompts(), req)
    assert_well_formed(first)
    with not_listening(cl, "b"):
        r = a.sessions().ClearAllSessions(spb.ClearAllSessionsRequest(confirm=CLEAR_ALL_CONFIRM), timeout=10)
        assert r.sessions_deleted == 1
    assert_runs_anew(b, req, first)


def test_a_prompt_fenced_by_a_delete_its_node_missed_ends_the_deleted_lanes_turns_cancelled(tmp_path, cluster_dsn):
    """b runs a turn waiting for a tool's result; its listening connection is
    down while a clears every session (and b's next lease renewal is far off:
    a long TTL). A follow-up on b then meets the revoked lease at its accept,
    which the fence refuses: b learns of the delete there, and the running
    turn must end as a deleted session's does, CANCELLED, not LANE_MOVED
    (which an adapter retries, running the prompt again in a fresh session)."""
    with _turn_waiting_on_b(tmp_path, cluster_dsn, lease_ttl_s=60.0) as (c, busy, src):
        with not_listening(c, "b"):
            r = c["a"].sessions().ClearAllSessions(spb.ClearAllSessionsRequest(confirm=CLEAR_ALL_CONFIRM),
                                                   timeout=10)
            assert r.sessions_deleted == 1
            follow = PromptRun(c["b"].prompts(), prompt_req(text="and then?", source=src))
            busy.result(30)
            follow.result(30)
    assert (busy.code, busy.reason) == (grpc.StatusCode.CANCELLED, CANCELLED), (busy.kinds(), busy.details)

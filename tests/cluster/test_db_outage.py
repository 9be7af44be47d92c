"""A full database outage: the PostgreSQL server itself stopped for longer
than the lease TTL while turns run and adapters keep calling, then started
again on the same port; under one sidecar alone on PostgreSQL, and under two
nodes of a cluster.

What an operator and an adapter may rely on (docs/cluster.md "When the
database goes away"): during the outage every call that needs the store
fails UNAVAILABLE / STORE_UNAVAILABLE within its deadline and health says
NOT_SERVING; once the server is back every node reconnects by itself, health
says SERVING, new prompts run, watches deliver again; no process restarts;
every turn acknowledged before the outage ends and can be read through gRPC,
its session idle again, and each queued prompt runs exactly once.

The server is this module's own (the suite's shared one must never stop),
stopped with ``pg_ctl -m fast`` (every session told, AdminShutdown) or
``-m immediate`` (a crash: sockets just close). Asserted through gRPC only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import pg
from helpers.cluster import Cluster
from helpers.config import echo, table
from helpers.ids import source, words
from helpers.procs import worker_pid
from helpers.sessions import get_session, transcript
from helpers.streams import QUEUE, PromptRun, Watcher, kind_of, prompt_req, run, watch
from helpers.waiting import wait_until
from sidecar_proc import Sidecar, error_info

from agent_sidecar.v1 import common_pb2 as c
from agent_sidecar.v1 import prompt_service_pb2 as ppb
from agent_sidecar.v1 import session_service_pb2 as spb

STEER = ppb.DeliveryMode.Value("DELIVERY_MODE_STEER")
pytestmark = pytest.mark.postgres_only("a PostgreSQL server stopped and started again under the sidecars")

CONFIG = echo("main", 100)  # a turn of 60 words runs for ~6 s: in flight when the server stops
TTL = 2.0
DEADLINE_S = 5.0  # the deadline of each call made during the outage
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture(scope="module")
def own_pg():
    server = pg.PgServer.start_temp()
    try:
        yield server
    finally:
        server.close()


@contextlib.contextmanager
def outage(server: pg.PgServer, mode: str):
    assert server.root is not None  # a server this module started
    pg.stop_server(server.root, mode)
    try:
        yield
    finally:
        pg.start_again(server.root)


def health(node) -> int:
    try:
        return health_pb2_grpc.HealthStub(node.channel()).Check(health_pb2.HealthCheckRequest(), timeout=2).status
    except grpc.RpcError:
        return -1


def _unavailable(call) -> None:
    """``call(deadline)`` fails UNAVAILABLE / STORE_UNAVAILABLE, not INTERNAL, not past its deadline."""
    with pytest.raises(grpc.RpcError) as ei:
        call(DEADLINE_S)
    err = ei.value
    assert (err.code(), error_info(err)[0]) == (grpc.StatusCode.UNAVAILABLE, "STORE_UNAVAILABLE"), \
        (err.code(), err.details())


class Load:
    """On one node: a long turn running and a prompt queued behind it, on one session."""

    def __init__(self, node, tag: str):
        self.node, self.src = node, source()
        self.running = PromptRun(node.prompts(), text=words(60, tag), src=self.src, timeout=120)
        self.running.wait_for("text_delta")
        self.queued_text = words(3, f"{tag}q")
        self.queued = PromptRun(node.prompts(), prompt_req(text=self.queued_text, source=self.src,
                                                           delivery=QUEUE), timeout=120)
        self.queued.wait_for("accepted")

    @property
    def key(self) -> str:
        return self.running.key


def calls_during_the_outage(node, load: Load) -> None:
    """What an adapter calls while the database is down: every call that
    needs the store fails UNAVAILABLE / STORE_UNAVAILABLE, health NOT_SERVING."""
    wait_until(lambda: health(node) == NOT_SERVING, 15, what="health NOT_SERVING")
    sessions, prompts = node.sessions(), node.prompts()
    _unavailable(lambda t: sessions.GetSession(spb.GetSessionRequest(session_key=load.key), timeout=t))
    _unavailable(lambda t: sessions.ListSessions(spb.ListSessionsRequest(), timeout=t))
    _unavailable(lambda t: sessions.GetTranscript(
        spb.GetTranscriptRequest(session_id=load.running.session_id), timeout=t))
    _unavailable(lambda t: sessions.GetOrCreateSession(spb.GetOrCreateSessionRequest(source=source()),
                                                       timeout=t))
    for out in (watch(prompts, timeout=DEADLINE_S, request_id=load.queued.request_id),
                run(prompts, prompt_req(text="while the database is down"), timeout=DEADLINE_S),
                run(prompts, prompt_req(request_id=load.running.request_id, text=words(60),
                                        session_key=load.key), timeout=DEADLINE_S)):
        assert (out.code, out.reason) == (grpc.StatusCode.UNAVAILABLE, "STORE_UNAVAILABLE"), \
            (out.code, out.details)


def _ended(node, request_id: str):
    """The request's stored frames through WatchActivity, once its terminal frame is in."""
    out = watch(node.prompts(), timeout=60, request_id=request_id)
    kinds = [kind_of(f) for f in out.frames]
    assert kinds and kinds[-1] in ("completed", "failed"), (request_id, kinds, out.code, out.details)
    assert kinds.count("accepted") == 1 and kinds.count(kinds[-1]) == 1, kinds
    return out.frames[-1]


def everything_acknowledged_ended(node, loads: list[Load], interrupted: set[str]) -> None:
    """Each running turn ended (failed for the outage, ``interrupted``
    reasons, or completed), each queued prompt ran to completion exactly once,
    and the sessions are idle again."""
    for load in loads:
        last = _ended(node, load.running.request_id)
        assert kind_of(last) == "completed" or last.failed.reason in interrupted, last
        last = _ended(node, load.queued.request_id)
        assert kind_of(last) == "completed", last
        wait_until(lambda key=load.key: get_session(node.sessions(), key).state == c.SESSION_STATE_IDLE,
                   30, what=f"{load.key} idle again")
        said = [m for m in transcript(node.sessions(), load.running.session_id)
                if m.role == "user" and m.content == load.queued_text]
        assert len(said) == 1, said


def serving_again(node, load: Load) -> None:
    """Health SERVING; then reads answer (one call: SERVING means the store
    can be used again), and a new session's prompt runs (its worker reads the
    store on a connection of its own, opened before the outage)."""
    wait_until(lambda: health(node) == SERVING, 30, what="health SERVING again")
    assert get_session(node.sessions(), load.key).session_key == load.key
    out = run(node.prompts(), prompt_req(text=words(3, "after")), timeout=30)
    assert out.end == "completed", (out.kinds(), out.last, out.details)
    assert node.proc.poll() is None


def test_one_sidecar_rides_out_a_database_outage(own_pg, tmp_path):
    sc = Sidecar(tmp_path / "s", config=CONFIG, dsn=own_pg.database("single"), workers=1).start()
    try:
        load = Load(sc, "solo")
        watcher = Watcher(sc.prompts(), session_key=load.key, timeout=120)
        with outage(own_pg, "fast"):
            down = time.monotonic()
            while True:  # adapters keep calling, more than once
                calls_during_the_outage(sc, load)
                if time.monotonic() - down > 1.5 * TTL:
                    break
        serving_again(sc, load)
        assert (load.running.result(60).code, load.running.reason) == \
            (grpc.StatusCode.UNAVAILABLE, "STORE_UNAVAILABLE")  # the turn was cut off by the outage
        assert load.queued.result(60).end == "completed"
        everything_acknowledged_ended(sc, [load], {"STORE_UNAVAILABLE"})
        later = run(sc.prompts(), prompt_req(text=words(3, "later"), session_key=load.key), timeout=30)
        assert later.end == "completed"
        assert [kind_of(f) for f in watcher.frames_of(later.request_id)][-1] == "completed"
        watcher.close()
    finally:
        sc.stop()
    assert sc.proc.returncode == 0, sc.log()


def test_a_cluster_rides_out_a_database_outage_longer_than_its_leases(own_pg, tmp_path):
    with Cluster(tmp_path, own_pg.database("cluster"), n=2, config=CONFIG, lease_ttl_s=TTL) as cl:
        a, b = cl["a"], cl["b"]
        loads = [Load(a, "ona"), Load(b, "onb")]
        tail = Watcher(a.prompts(), session_key=loads[1].key, timeout=120)  # b's session, through a's tail
        with outage(own_pg, "immediate"):
            down = time.monotonic()
            while True:  # adapters keep calling, until every lease has run out in the database
                for node, load in zip((a, b), loads):
                    calls_during_the_outage(node, load)
                if time.monotonic() - down > 1.5 * TTL:
                    break
        for node, load in zip((a, b), loads):
            serving_again(node, load)
        for load in loads:  # the streams ended when the lease was dropped; the turns went on elsewhere
            load.running.result(60)
            load.queued.result(60)
        everything_acknowledged_ended(b, loads, {"restart_interrupted", "STORE_UNAVAILABLE"})
        later = run(b.prompts(), prompt_req(text=words(3, "later"), session_key=loads[1].key), timeout=30)
        assert later.end == "completed"
        assert [kind_of(f) for f in tail.frames_of(later.request_id, timeout=20)][-1] == "completed"
        tail.close()
        assert a.running and b.running, cl.logs()


def test_a_prompt_refused_as_the_store_failed_while_it_was_being_placed_leaves_no_turn_behind(own_pg, tmp_path):
    """A STEER waits for the running turn's worker (stopped: it never
    answers) while the server goes away; when the wait ends, the prompt
    falls back to a follow-up, and its accept is refused at once, the store
    failing (UNAVAILABLE). It must leave nothing behind: a retry with its
    request id, once the server is back, places it anew. The turn it was
    had stayed reserved in the lane, never accepted: every retry followed
    it and waited for frames that never came (DEADLINE_EXCEEDED, on every
    node of a cluster), and the lane ran nothing more."""
    cfg = echo("main", 100) + table("agent", steer_timeout_s=1.0)
    sc = Sidecar(tmp_path / "s", config=cfg, dsn=own_pg.database("placed"), workers=1).start()
    try:
        src = source()
        busy = PromptRun(sc.prompts(), text=words(60), src=src)
        busy.wait_for("text_delta")
        worker = worker_pid(sc, 0)
        os.kill(worker, signal.SIGSTOP)
        try:
            steer = PromptRun(sc.prompts(), prompt_req(text="also this", source=src, delivery=STEER))
            with outage(own_pg, "immediate"):
                # A commit fails: the store is failing when the steer's wait ends.
                wait_until(lambda: run(sc.prompts(), prompt_req(text="hi"), timeout=DEADLINE_S).reason
                           == "STORE_UNAVAILABLE", timeout=30, what="the store failing")
                steer.result(30)
                assert (steer.code, steer.reason) == (grpc.StatusCode.UNAVAILABLE, "STORE_UNAVAILABLE"), \
                    (steer.kinds(), steer.details)
        finally:
            os.kill(worker, signal.SIGCONT)
        wait_until(lambda: run(sc.prompts(), prompt_req(text="hi"), timeout=DEADLINE_S).code == grpc.StatusCode.OK,
                   timeout=60, what="the store writing again")
        again = run(sc.prompts(), prompt_req(steer.request_id, text="also this", source=src, delivery=QUEUE),
                    timeout=30)
        assert again.end == "completed", (again.code, again.kinds(), again.details)
    finally:
        sc.stop()

"""A node stalled past its trust in a lease (its main process stopped: a
SIGSTOP, a long pause) cannot stop its lane's turn, yet its worker, which
goes on, must not run that turn beside the lane's next holder: the worker
stops it by itself when the lease's trust ends (wire.Run ``stop_at``, moved
on by each renewal), before the lease can run out in the database; and a
tool call it sent meanwhile is not made when the node goes on. The turn
ends there unwritten (LANE_MOVED), and the lane's next holder closes it from
the ledger. Two real sidecars on one real PostgreSQL; the model is a real
HTTP server in the test (FakeOpenAI)."""

from __future__ import annotations

import os
import signal
import threading

import grpc
import psycopg
from helpers.cluster import Cluster
from helpers.config import echo, profile, scripted
from helpers.fake_openai import FakeOpenAI
from helpers.ids import source, words
from helpers.procs import children
from helpers.store import StoreView
from helpers.streams import PromptRun, assert_well_formed, prompt_req, run, watch
from helpers.tools import AB_SCHEMA, ToolHost, answers
from helpers.waiting import wait_until

from agent_sidecar.errors import LANE_MOVED

TTL = 4.0


def _renewed(dsn: str, key: str, times: int) -> None:
    """Wait until the lane's lease has been extended ``times`` times."""
    seen: set = set()

    def extended() -> bool:
        with psycopg.connect(dsn, autocommit=True) as conn:
            seen.add(conn.execute("SELECT expires_at FROM leases WHERE session_key = %s", (key,)).fetchone())
        return len(seen) > times
    wait_until(extended, timeout=TTL * times * 3, interval=0.1, what=f"the lease renewed {times} times")


def test_a_stalled_nodes_worker_hangs_up_its_model_call_when_the_lease_is_no_longer_trusted(
        tmp_path, cluster_dsn):
    with FakeOpenAI([{"hold": True}, {"text": "where things stand"}]) as model:
        config = profile("main", "openai", {"base_url": model.url, "model": "m"})
        with Cluster(tmp_path, cluster_dsn, n=2, config=config, lease_ttl_s=TTL) as c:
            busy = PromptRun(c["b"].prompts(), text="think", src=source(), timeout=120)
            assert model.holding.wait(30), busy.kinds()
            # Renewals move the worker's stop on while b runs: past the first one's
            # stop (under a TTL after the take), the call is still open.
            _renewed(c.dsn, busy.key, times=4)
            assert not model.hung_up.is_set(), "the worker stopped a turn whose lease b renews"
            c["b"].pause()  # its main process only: the worker goes on
            try:
                assert model.hung_up.wait(TTL * 5), "b's worker kept its model call while b was stalled"
            finally:
                c["b"].resume()
            busy.result(30)
            assert (busy.code, busy.reason) == (grpc.StatusCode.UNAVAILABLE, LANE_MOVED), busy.details
            # Nothing of b's wrote its end: the lane's next holder closed it as cut off.
            store = StoreView(c["a"])
            wait_until(lambda: store.status(busy.request_id) == "failed", timeout=TTL * 5,
                       what="the turn closed by the lane's next holder")
            frames = watch(c["a"].prompts(), request_id=busy.request_id).frames
            assert frames[-1].failed.reason == "restart_interrupted", frames[-1]


def test_a_tool_call_a_stalled_nodes_worker_sent_is_not_made_once_the_lane_moved(tmp_path, cluster_dsn):
    """b stalls; its worker's model call then answers with a tool call, which
    waits in b's pipe. Once the lane is a's (a took it over), b goes on: the
    call must not reach b's tool host; the turn a resumes makes its own."""
    go = threading.Event()
    steps = [{"wait_for": go, "tool_calls": [{"name": "calc.add", "arguments": {"a": 2, "b": 3}}]},
             {"text": "where things stand"}]
    with FakeOpenAI(steps) as model:
        config = (profile("main", "openai", {"base_url": model.url, "model": "m"}, tools=["calc.*"])
                  + scripted("probe", [{"tool_calls": [{"name": "calc.add", "arguments": {"a": 1, "b": 1}}]},
                                       {"text": "two"}], tools=["calc.*"]))
        add = answers({"calc.add": lambda a: a["a"] + a["b"]})
        with Cluster(tmp_path, cluster_dsn, n=2, config=config, lease_ttl_s=TTL) as c, \
                ToolHost(c["a"].tools(), "calc", [("calc.add", "Add", AB_SCHEMA)], add), \
                ToolHost(c["b"].tools(), "calc", [("calc.add", "Add", AB_SCHEMA)], add) as host_b:
            busy = PromptRun(c["b"].prompts(), text="add", src=source(), timeout=120)
            assert model.holding.wait(30), busy.kinds()
            store = StoreView(c["a"])
            c["b"].pause()  # its main process only: the worker gets the tool call and sends it
            try:
                go.set()
                wait_until(lambda: getattr(store.lease_holder(busy.key), "node_id", "") == "a", timeout=TTL * 5,
                           what="a taking the lane over")
            finally:
                c["b"].resume()
            busy.result(30)
            assert (busy.code, busy.reason) == (grpc.StatusCode.UNAVAILABLE, LANE_MOVED), busy.details
            # A later turn's call on b comes after any call b still made for the stalled turn.
            probe = run(c["b"].prompts(), prompt_req(text="probe", source=source(), profile="probe"))
            assert_well_formed(probe)
            assert [inv.request_id for inv in host_b.invocations] == [probe.request_id]


def test_a_worker_stalled_past_its_stop_time_on_a_node_that_renewed_goes_on_with_its_turn(tmp_path, cluster_dsn):
    """The other way round: b's worker stalls (SIGSTOP) for longer than a
    TTL while b itself renews the lease. The renewals it could not read wait
    in its pipe: when it goes on, its turn goes on too, not stopped as if
    b had stalled."""
    with Cluster(tmp_path, cluster_dsn, n=2, config=echo("main", 30), lease_ttl_s=TTL) as c:
        busy = PromptRun(c["b"].prompts(), text=words(200), src=source(), timeout=120)
        busy.wait_for("text_delta")
        worker = next(pid for name, pid in children(c["b"]).items() if name.startswith("sidecar-work-"))
        os.kill(worker, signal.SIGSTOP)
        try:
            _renewed(c.dsn, busy.key, times=4)  # past the worker's stop time when it stalled
        finally:
            os.kill(worker, signal.SIGCONT)
        busy.result(60)
        assert (busy.code, busy.kinds()[-1]) == (grpc.StatusCode.OK, "completed"), (busy.reason, busy.details)

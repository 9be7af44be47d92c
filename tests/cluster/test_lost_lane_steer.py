"""A STEER waiting for the running turn's worker to take it in while its node
loses the lane's lease and takes the lane anew (docs/cluster.md "How a lane is
run by one node"): it was stopped with the lane's other turns, so it must not
be placed in the lane taken anew, where its accept, under the old epoch, is
refused by the fence and it would stay the lane's next turn for ever, never
started, every later prompt of the lane queued behind it. One real sidecar on
a real PostgreSQL database; its worker stopped (SIGSTOP) keeps the STEER
waiting, the frames lock held keeps its lease renewals from committing."""

from __future__ import annotations

import os
import signal

import grpc
from helpers import procs
from helpers.cluster import Cluster, FramesLock, lock_waiters
from helpers.config import echo, table
from helpers.ids import source, words
from helpers.metrics import metrics_config, scrape
from helpers.pg import free_port
from helpers.streams import PromptRun, assert_well_formed, prompt_req, run
from helpers.waiting import wait_until

from agent_sidecar.v1 import prompt_service_pb2 as ppb

ADMITTED = "agent_sidecar_prompts_admitted_bytes"  # the prompts placed and not ended
STEER = ppb.DeliveryMode.Value("DELIVERY_MODE_STEER")
CONFIG = echo("main", 20) + table("agent", steer_timeout_s=60) + table("recovery", auto_resume="off")


def test_a_steer_waiting_while_its_lane_is_lost_and_taken_anew_leaves_the_lane_running(tmp_path, cluster_dsn):
    port = free_port()
    with Cluster(tmp_path, cluster_dsn, n=1, config=CONFIG + metrics_config(port), lease_ttl_s=2.0) as c:
        node = c["a"]
        src = source()
        host = PromptRun(node.prompts(), text=words(600), src=src)
        host.wait_for("text_delta")
        worker = next(pid for name, pid in procs.children(node).items() if name.startswith("sidecar-work-"))
        os.kill(worker, signal.SIGSTOP)  # the host turn stops streaming; a steer waits for its answer
        try:
            held = scrape(port).value(ADMITTED)
            steer = PromptRun(node.prompts(), text="and also", src=src, delivery=STEER)
            wait_until(lambda: scrape(port).value(ADMITTED) > held, timeout=30,
                       what="the STEER waiting for the worker")
            lock = FramesLock(c.dsn)  # the lease renewals wait: the node stops trusting its lease
            try:
                host.result(30)
                assert host.reason == "LANE_MOVED", (host.kinds(), host.details)
                assert lock_waiters(c.dsn) > 0
            finally:
                lock.release()
            taken = PromptRun(node.prompts(), text="next", src=src)  # the node takes the lane anew
            taken.wait_for("started")
        finally:
            os.kill(worker, signal.SIGCONT)  # the STEER's answer comes: the host turn is gone
        steer.result(60)
        assert steer.code == grpc.StatusCode.UNAVAILABLE and steer.reason == "LANE_MOVED", (
            steer.kinds(), steer.details)
        assert_well_formed(taken.result(60))
        after = run(node.prompts(), prompt_req(text="after", source=src), timeout=30)
        assert_well_formed(after)


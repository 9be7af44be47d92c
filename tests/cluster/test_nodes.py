"""A node's identity and where the others reach it: a second sidecar under a
running node's id, calls between nodes over (m)TLS, and a node that cannot be
reached where it advertises itself (docs/cluster.md, Configuration and Node
ids). Real sidecars on one real PostgreSQL database."""

from __future__ import annotations

import os

import grpc
import pytest
from helpers.cluster import Cluster, Node
from helpers.config import echo
from helpers.ids import rid, source
from helpers.logs import log_lines
from helpers.metrics import metrics_config, scrape
from helpers.streams import PromptRun, collect, kind_of, start
from sidecar_proc import retry_delay

from agent_sidecar.v1 import prompt_service_pb2 as ppb

TTL = 3.0
CALM_TTL = 15.0  # no takeover from a node merely slowed by a busy machine
ADVERTISE_WARNING = "the other nodes may not reach this one at [cluster] advertise"


def test_a_second_sidecar_under_a_running_nodes_id_refuses_to_start(tmp_path, cluster_dsn):
    """A node id copied into a second config: the second sidecar used to take
    every lane of the running node as its own last run's, cutting its turn off
    (``restart_interrupted``). It now sees the running node's heartbeat move and
    refuses to start, saying why; the running node's turn is untouched.

    The default lease TTL: with the short one, a machine loaded enough that
    the running node's renewal came late (the twin's start competes for the
    cores) ended its turn LANE_MOVED, as a node must that cannot renew."""
    with Cluster(tmp_path, cluster_dsn, 2, echo(latency_ms=150)) as cl:
        a = cl["a"]
        running = start(a.prompts(), ppb.PromptRequest(request_id=rid("run"), text="slow " * 30,
                                                       source=source()), timeout=300)
        running.wait_for("text_delta")
        twin = Node(tmp_path / "twin", "a", a.dsn, echo(latency_ms=150))
        with pytest.raises(RuntimeError, match="exited with 1"):
            twin.start()
        assert "already running" in twin.log() and "node id" in twin.log(), twin.log()[-2000:]
        ended = running.result(timeout=300)
        assert kind_of(ended.frames[-1]) == "completed", (ended.frames[-1], ended.error)


def test_calls_between_nodes_go_over_mtls_when_the_cluster_has_a_ca(tmp_path, cluster_dsn):
    from helpers import certs
    from sidecar_proc import free_port
    if not certs.available():
        pytest.skip("needs openssl to make certificates")
    c = certs.make_certs(tmp_path / "certs")
    made = []
    metrics_port = free_port()  # a's /metrics
    for name in ("a", "b"):
        port = free_port()  # the mTLS listener each node advertises to the other
        listen = c.listener(f"127.0.0.1:{port}", client_ca=True)
        if name == "a":
            listen += metrics_config(metrics_port)
        made.append(Node(tmp_path / name, name, cluster_dsn, echo(latency_ms=5) + listen,
                         lease_ttl_s=CALM_TTL, cluster={
                             "advertise": f"127.0.0.1:{port}", "ca_file": str(c.ca),
                             "cert_file": str(c.client_cert), "key_file": str(c.client_key)}))
    a, b = made
    try:
        for node in made:
            node.start()
        src = source("telegram")
        first = PromptRun(a.prompts(), ppb.PromptRequest(request_id=rid("m1"), text="one", source=src),
                          background=False)
        second = PromptRun(b.prompts(), ppb.PromptRequest(request_id=rid("m2"), text="two", source=src),
                           background=False)  # a holds the lane: forwarded to a over mTLS
        assert first.kinds()[-1] == "completed" and second.kinds()[-1] == "completed", second.details
        assert log_lines(b, "lane holder unreachable") == []
        assert log_lines(a, ADVERTISE_WARNING) == log_lines(b, ADVERTISE_WARNING) == []  # TLS, as called
        # a holds the lane and lost nothing: its cluster metrics say so.
        m = scrape(metrics_port)
        assert m.value("agent_sidecar_cluster_lanes_held") == 1
        assert [m.get((f"agent_sidecar_cluster_{c}_total", frozenset())) for c in
                ("lanes_taken_over", "leases_lost", "fenced_writes")] == [0, 0, 0]
    finally:
        for node in made:
            node.stop(timeout=30)


def test_a_node_the_others_cannot_reach_where_it_advertises_itself_says_so(tmp_path, cluster_dsn):
    """A node advertising a port it does not listen on (or a plaintext
    listener while the cluster calls over TLS) started silently, and every
    call the other nodes forwarded to it for its lanes failed; only they
    logged it, once a call came. It now says so at its start (a warning: a
    port mapping may lead there); a node listening where it advertises does
    not. The log line is the behaviour under test."""
    from helpers import certs
    from sidecar_proc import free_port
    if not certs.available():
        pytest.skip("needs openssl to make certificates")
    c = certs.make_certs(tmp_path / "certs")
    unlistened = Node(tmp_path / "a", "a", cluster_dsn, echo(), lease_ttl_s=CALM_TTL,
                      cluster={"advertise": f"127.0.0.1:{free_port()}"})
    plaintext = Node(tmp_path / "b", "b", cluster_dsn, echo(), lease_ttl_s=CALM_TTL,
                     cluster={"ca_file": str(c.ca)})  # it advertises its plaintext TCP listener
    fine = Node(tmp_path / "c", "c", cluster_dsn, echo(), lease_ttl_s=CALM_TTL)
    made = [unlistened, plaintext, fine]
    try:
        for node in made:
            node.start()
        (line,) = log_lines(unlistened, ADVERTISE_WARNING)
        assert "no TCP listener" in line["problem"], line
        (line,) = log_lines(plaintext, ADVERTISE_WARNING)
        assert "serves plaintext" in line["problem"], line
        assert log_lines(fine, ADVERTISE_WARNING) == []
    finally:
        for node in made:
            node.stop(timeout=30)


def test_a_call_the_holder_refuses_for_the_cluster_token_is_unavailable_not_the_callers_fault(
        tmp_path, cluster_dsn):
    """Two nodes whose cluster tokens differ: a call forwarded to the lane's
    holder was refused there (the token unknown), and the caller, whose own
    credentials were fine (here: the trusted Unix socket), got
    UNAUTHENTICATED, which no client retries and which points at the wrong
    credentials; no node said a word. It is now UNAVAILABLE with RetryInfo
    naming the cluster token, and the forwarding node warns (the log line is
    behaviour under test: the operator's only clue)."""
    a = Node(tmp_path / "a", "a", cluster_dsn, echo(), token="cluster-token-of-a", lease_ttl_s=CALM_TTL)
    b = Node(tmp_path / "b", "b", cluster_dsn, echo(), token="cluster-token-of-b", lease_ttl_s=CALM_TTL)
    try:
        a.start()
        b.start()
        src = source("telegram")
        first = PromptRun(a.prompts(), text="one", src=src, background=False)
        assert first.kinds()[-1] == "completed"
        second = PromptRun(b.prompts(), text="two", src=src, background=False)  # a holds the lane
        assert second.code == grpc.StatusCode.UNAVAILABLE and second.reason == "UNAVAILABLE", second.details
        assert "cluster token" in second.details and retry_delay(second.error) is not None
        (line,) = log_lines(b, "lane holder refused this node's cluster token")
        assert line["node"] == "a", line
    finally:
        for node in (a, b):
            node.stop(timeout=30)


def test_a_forwarded_prompt_continues_the_callers_trace(tmp_path, cluster_dsn):
    """A Prompt sent to a node that does not hold its lane is forwarded to the
    holder; the forwarded call carried no trace context, so the holder's
    Prompt span and the turn under it started a trace of their own and the
    adapter's trace ended at the forwarding node's span. The holder's span of
    the call is now a child of the forwarding node's, in the caller's trace."""
    from helpers.otlp import Collector
    with Collector() as collector, Cluster(tmp_path, cluster_dsn, 2, echo(), lease_ttl_s=CALM_TTL,
                                           env=collector.env()) as cl:
        src = source("telegram")
        assert PromptRun(cl["a"].prompts(), text="one", src=src, background=False).kinds()[-1] == "completed"
        trace_id, parent_id = os.urandom(16).hex(), os.urandom(8).hex()
        req = ppb.PromptRequest(request_id=rid("traced"), text="two", source=src)
        out = collect(cl["b"].prompts().Prompt(req, timeout=30,  # a holds the lane: forwarded to a
                                               metadata=[("traceparent", f"00-{trace_id}-{parent_id}-01")]))
        assert kind_of(out.frames[-1]) == "completed", out.error

        def spans_of_both_nodes(spans):
            """The turn's span (exported by a) and the span of the call b
            received (exported by b, in a batch of its own): both, or None."""
            mine = [s for s in spans if s.trace_id == trace_id]
            turn = [s for s in mine if s.name == "turn" and s.attributes["agent_sidecar.request_id"] == req.request_id]
            at_b = [s for s in mine if s.parent_id == parent_id]
            return (mine, turn[0], at_b[0]) if turn and at_b else None
        mine, turn, at_b = collector.wait_for(spans_of_both_nodes,
                                              what="the forwarded call's spans in the caller's trace")
        at_a = next(s for s in mine if s.span_id == turn.parent_id)  # the span of the call a served
        assert at_b.name == at_a.name == "agent_sidecar.v1.PromptService/Prompt"
        assert at_a.parent_id == at_b.span_id

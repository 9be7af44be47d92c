"""The Prometheus endpoint of a real sidecar (``[metrics] listen``), scraped
over HTTP around scripted turns: a turn that calls a tool on a real tool
host, a turn whose model fails, queued prompts, refused credentials, a
worker killed with SIGKILL. Each check compares two scrapes, so the counters
must move by exactly what the test did (docs/operations.md, "Metrics")."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import urllib.error
import urllib.request

import grpc
import pytest
from helpers.config import echo, scripted, slow_echo
from helpers.ids import source, words
from helpers.metrics import metrics_config, scrape
from helpers.procs import worker_pid
from helpers.recovery import restart
from helpers.streams import QUEUE, PromptRun, run, start
from helpers.tools import AB_SCHEMA, ToolHost
from helpers.waiting import wait_until
from sidecar_proc import ROOT, TOKEN, Sidecar, error_info, free_port

from agent_sidecar.obs.http import MAX_CONNECTIONS, MAX_HEAD_BYTES
from agent_sidecar.v1 import status_service_pb2 as spb
from agent_sidecar.v1 import status_service_pb2_grpc as spb_grpc

TOOL_STEPS = [{"tool_calls": [{"name": "mt.add", "arguments": {"a": 2, "b": 3}}]},
              {"text_from_last_tool_result": True}]
PLATFORM_TOKEN = "telegram-only-token"
CONFIG = (echo("main") + slow_echo("slow", 100)
          + scripted("mtool", TOOL_STEPS, tools=["mt.*"])
          + scripted("mfail", [{"error": "the model is down"}])
          + scripted("moutside", [{"tool_calls": [{"name": "zz.outside", "arguments": {}}]}, {"text": "x"}],
                     tools=["mt.*"])
          + f'[[auth.tokens]]\ntoken = "{TOKEN}"\nadmin = true\n\n'
          + f'[[auth.tokens]]\ntoken = "{PLATFORM_TOKEN}"\nplatforms = ["telegram"]\n\n')


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    port = free_port()
    s = Sidecar(tmp_path_factory.mktemp("metrics") / "data", config=CONFIG + metrics_config(port),
                tcp=True, workers=2)
    s.metrics_port = port
    s.start()
    yield s
    s.stop()


def adder(inv):
    args = json.loads(inv.arguments_json)
    return True, json.dumps({"sum": args["a"] + args["b"]}), ""


def histogram_ok(samples, name: str, **labels) -> None:
    """The +Inf bucket is the count, and the buckets never decrease."""
    buckets = sorted((float(ls["le"]), v) for (n, items), v in samples.items() if n == name + "_bucket"
                     for ls in [dict(items)] if {k: ls.get(k) for k in labels} == labels)
    assert buckets and buckets[-1][0] == float("inf"), buckets
    assert buckets[-1][1] == samples.value(name + "_count", **labels)
    assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:])), buckets


def test_turns_tool_calls_and_a_model_failure_are_counted(sc):
    port = sc.metrics_port
    before = scrape(port)
    with ToolHost(sc.tools(), "mt", [("mt.add", "add two numbers", AB_SCHEMA)], adder):
        assert scrape(port).value("agent_sidecar_tool_hosts", namespace="mt") == 1
        done = [run(sc.prompts(), text="add", src=source(), profile="mtool") for _ in range(2)]
    failed = run(sc.prompts(), text="hello", src=source(), profile="mfail")
    assert [p.end for p in done] == ["completed", "completed"], [p.kinds() for p in done]
    assert json.loads(done[0].final_text) == {"sum": 5}
    assert failed.end == "failed" and failed.last.failed.reason == "LLM_API_FAILURE"
    after = scrape(port)

    # Counted when the terminal frame commits, i.e. before the client read it.
    assert after.since(before, "agent_sidecar_turns_total", outcome="completed", reason="") == 2
    assert after.since(before, "agent_sidecar_turns_total", outcome="failed", reason="LLM_API_FAILURE") == 1
    assert after.since(before, "agent_sidecar_turn_duration_seconds_count", outcome="completed") == 2
    assert after.since(before, "agent_sidecar_turn_duration_seconds_count", outcome="failed") == 1
    assert after.since(before, "agent_sidecar_turn_first_token_seconds_count") == 2  # the failed one had none
    # Two model calls per tool turn, one (failed) for the other: timed in the workers.
    assert after.since(before, "agent_sidecar_model_call_duration_seconds_count", backend="scripted") == 5
    assert after.since(before, "agent_sidecar_model_call_errors_total", backend="scripted") == 1
    assert after.since(before, "agent_sidecar_tool_call_duration_seconds_count", namespace="mt") == 2
    assert after.since(before, "agent_sidecar_tool_call_errors_total", namespace="mt") == 0
    assert after.since(before, "agent_sidecar_tool_call_duration_seconds_sum", namespace="mt") > 0
    # Every frame the three streams got was persisted first, and nothing else ran.
    frames = sum(len(p.frames) for p in done + [failed])
    assert after.since(before, "agent_sidecar_frames_persisted_total") == frames
    assert after.since(before, "agent_sidecar_frames_persisted_bytes_total") > frames * 10
    hits = after.since(before, "agent_sidecar_agent_cache_hits_total")
    assert hits + after.since(before, "agent_sidecar_agent_cache_misses_total") == 3
    assert after.total("agent_sidecar_worker_turns_total") - before.total("agent_sidecar_worker_turns_total") == 3
    assert after.since(before, "agent_sidecar_store_commit_duration_seconds_count") > 0
    assert after.since(before, "agent_sidecar_store_commit_batch_jobs_sum") > 0
    assert after.value("agent_sidecar_turns_in_flight") == 0
    assert after.value("agent_sidecar_store_writable") == 1
    assert after.value("agent_sidecar_store_size_bytes") > 0
    for name, labels in (("agent_sidecar_turn_duration_seconds", {"outcome": "completed"}),
                         ("agent_sidecar_model_call_duration_seconds", {"backend": "scripted"}),
                         ("agent_sidecar_tool_call_duration_seconds", {"namespace": "mt"}),
                         ("agent_sidecar_store_commit_duration_seconds", {})):
        histogram_ok(after, name, **labels)
    # The host has gone: the gauge follows.
    wait_until(lambda: scrape(port).value("agent_sidecar_tool_hosts", namespace="mt") == 0,
               what="the tool host gauge back at 0")


def test_a_tool_call_the_worker_refuses_is_a_tool_call_error(sc):
    """A call outside the profile's tools is refused in the worker (the turn
    fails TOOL_SCOPE_VIOLATION) and never reaches the parent, which counted
    only the calls it ran: tool_call_errors_total, documented as the calls
    that "failed, timed out or were refused", missed it. The worker now
    reports it with the turn; it has no duration (it never ran)."""
    before = scrape(sc.metrics_port)
    out = run(sc.prompts(), text="call it", src=source(), profile="moutside")
    assert out.end == "failed" and out.last.failed.reason == "TOOL_SCOPE_VIOLATION"
    after = scrape(sc.metrics_port)
    assert after.since(before, "agent_sidecar_tool_call_errors_total", namespace="unknown") == 1
    assert after.since(before, "agent_sidecar_tool_call_duration_seconds_count", namespace="unknown") == 0
    assert after.since(before, "agent_sidecar_turns_total", outcome="failed", reason="TOOL_SCOPE_VIOLATION") == 1


def test_duration_buckets_reach_past_the_default_timeouts(sc):
    """A turn may run until agent.gateway_timeout (1800 s by default) and a
    model call until the OpenAI backend's timeout_s (120 s) and past it while
    streaming, but the top buckets were 900 s and 60 s: everything slower
    fell into +Inf, and a p99 near the limits could not be told from one at
    them. The finite buckets now reach past both."""
    assert run(sc.prompts(), text="hello", src=source(), profile="main").end == "completed"
    samples = scrape(sc.metrics_port)

    def top(name: str) -> float:
        return max(float(ls["le"]) for ls in samples.labels(name + "_bucket") if ls["le"] != "+Inf")
    assert top("agent_sidecar_turn_duration_seconds") >= 1800
    assert top("agent_sidecar_turn_first_token_seconds") >= 1800
    assert top("agent_sidecar_model_call_duration_seconds") >= 120


def test_commit_buckets_resolve_a_commit_without_a_slow_fsync(sc):
    """A group commit on a disk whose fsync is cheap (a write cache, SSDs,
    ``synchronous = NORMAL``, which skips it) takes a tenth of a millisecond
    or so; the lowest bucket was 0.5 ms, and on the project's machine it
    held 85% of the commits (synchronous FULL), so the median commit, the
    durability cost docs/operations.md points at, could not be read. The
    buckets now start at 0.1 ms, and go on to 10 s for a database that
    hangs a while."""
    assert run(sc.prompts(), text="hello", src=source(), profile="main").end == "completed"
    bounds = sorted(float(ls["le"]) for ls in scrape(sc.metrics_port).labels(
        "agent_sidecar_store_commit_duration_seconds_bucket"))
    assert bounds[0] <= 0.0001 and bounds[-2] >= 10, bounds


def test_queued_prompts_and_turns_in_flight(sc):
    src = source()
    running = start(sc.prompts(), text=" ".join(["w"] * 30), src=src, profile="slow")
    queued = [start(sc.prompts(), text="next", src=src, profile="slow", delivery=QUEUE) for _ in range(2)]
    now = scrape(sc.metrics_port)
    assert now.value("agent_sidecar_queued_prompts", delivery="QUEUE") == 2
    assert now.value("agent_sidecar_queued_prompts", delivery="FOLLOW_UP") == 0
    assert now.value("agent_sidecar_turns_in_flight") == 1
    assert now.value("agent_sidecar_prompts_admitted") == 3
    for p in [running, *queued]:
        assert p.result(30).end == "completed"
    after = scrape(sc.metrics_port)
    assert after.value("agent_sidecar_queued_prompts", delivery="QUEUE") == 0
    assert after.value("agent_sidecar_prompts_admitted") == 0


def test_refused_credentials_are_counted(sc):
    before = scrape(sc.metrics_port)
    stub = spb_grpc.StatusServiceStub(sc.channel(tcp=True))
    for metadata, reason in ((None, "UNAUTHENTICATED"), ([("authorization", "Bearer nope")], "UNAUTHENTICATED"),
                             ([("authorization", f"Bearer {PLATFORM_TOKEN}")], "PERMISSION_DENIED")):
        with pytest.raises(grpc.RpcError) as e:
            stub.GetStatus(spb.GetStatusRequest(), metadata=metadata, timeout=10)
        assert error_info(e.value)[0] == reason
    after = scrape(sc.metrics_port)
    assert after.since(before, "agent_sidecar_auth_failures_total", reason="UNAUTHENTICATED") == 2
    assert after.since(before, "agent_sidecar_auth_failures_total", reason="PERMISSION_DENIED") == 1


def test_a_dead_worker_is_counted_and_its_replacement_measured(sc):
    before = scrape(sc.metrics_port)
    assert before.value("agent_sidecar_worker_resident_memory_bytes", worker="1") > 1 << 20
    old = worker_pid(sc, 1)
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: worker_pid(sc, 1) not in (None, old), timeout=30, what="worker 1 replaced")
    after = wait_until(lambda: (s := scrape(sc.metrics_port)).value(
        "agent_sidecar_worker_resident_memory_bytes", worker="1") and s, timeout=30)
    assert after.since(before, "agent_sidecar_worker_restarts_total", worker="1") == 1
    assert after.since(before, "agent_sidecar_worker_restarts_total", worker="0") == 0
    assert after.value("agent_sidecar_worker_resident_memory_bytes", worker="1") > 1 << 20


def test_only_get_metrics_is_served(sc):
    with pytest.raises(urllib.error.HTTPError) as e:
        scrape(sc.metrics_port, "/")
    assert e.value.code == 404
    req = urllib.request.Request(f"http://127.0.0.1:{sc.metrics_port}/metrics", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 405
    info = scrape(sc.metrics_port).labels("agent_sidecar_info")
    assert len(info) == 1 and info[0]["version"] and info[0]["node_id"].endswith(str(sc.data_dir))


def test_the_endpoint_names_its_format_takes_bare_lf_and_bounds_its_connections(sc):
    with urllib.request.urlopen(f"http://127.0.0.1:{sc.metrics_port}/metrics", timeout=10) as r:
        assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    with socket.create_connection(("127.0.0.1", sc.metrics_port), timeout=10) as bare_lf:
        bare_lf.sendall(b"GET /metrics HTTP/1.1\nHost: x\n\n")
        assert bare_lf.recv(64).startswith(b"HTTP/1.1 200 OK\r\n")
    # Connections that send no request hold at most the bound: each one past
    # it closes the oldest still waiting, and a scrape is answered meanwhile.
    idle = [socket.create_connection(("127.0.0.1", sc.metrics_port), timeout=10)
            for _ in range(MAX_CONNECTIONS + 4)]
    try:
        assert _scrapes(sc.metrics_port)
        closed = [s.recv(64) == b"" for s in idle[:5]]  # the scrape evicted the fifth
        assert closed == [True] * 5
        idle[-1].sendall(b"GET /metrics HTTP/1.1\r\n\r\n")  # the newest is still served
        assert idle[-1].recv(64).startswith(b"HTTP/1.1 200 OK\r\n")
    finally:
        for s in idle:
            s.close()


def _scrapes(port: int) -> bool:
    try:
        scrape(port)
        return True
    except (urllib.error.URLError, ConnectionError):
        return False


def test_a_head_past_its_bound_ends_the_connection_unanswered(sc):
    """The head's bound held for one line only: a client sending header lines
    under it, one after another, was read for as long as it kept sending
    (800 MB in 3 s, on the event loop that serves gRPC), then answered. The
    head as a whole is now bound: past MAX_HEAD_BYTES the connection ends."""
    line = b"X-Filler: " + b"a" * 1000 + b"\r\n"
    head = b"GET /metrics HTTP/1.1\r\n" + line * (MAX_HEAD_BYTES // len(line) + 1) + b"\r\n"
    with socket.create_connection(("127.0.0.1", sc.metrics_port), timeout=10) as s:
        s.sendall(head)
        try:
            answer = s.recv(64)
        except ConnectionResetError:
            answer = b""
    assert answer == b""
    fits = b"GET /metrics HTTP/1.1\r\n" + line * (MAX_HEAD_BYTES // len(line) - 1) + b"\r\n"
    with socket.create_connection(("127.0.0.1", sc.metrics_port), timeout=10) as s:
        s.sendall(fits)
        assert s.recv(64).startswith(b"HTTP/1.1 200 OK\r\n")


def test_every_metric_served_is_documented(sc):
    with urllib.request.urlopen(f"http://127.0.0.1:{sc.metrics_port}/metrics", timeout=10) as r:
        served = set(re.findall(r"^# TYPE (agent_sidecar_\w+) (\w+)$", r.read().decode(), re.M))
    doc = (ROOT / "docs" / "operations.md").read_text()
    documented = set(re.findall(r"^\| `(agent_sidecar_\w+)` \| (\w+) \|", doc, re.M))
    # A cluster node's own (tests/cluster/test_leases.py scrapes those): not served here.
    documented = {(name, kind) for name, kind in documented if not name.startswith("agent_sidecar_cluster_")}
    assert served == documented, (served - documented, documented - served)


def test_turns_the_restore_ends_are_counted(tmp_path):
    """A turn cut off by kill -9 ends at the next start, failed
    restart_interrupted, by the restore job rather than the frame bus: it
    counts in turns_total as every ended turn does."""
    port = free_port()
    s = Sidecar(tmp_path / "data", config=slow_echo("main", 100) + metrics_config(port), workers=1).start()
    try:
        cut = PromptRun(s.prompts(), text=words(80), src=source())
        cut.wait_for("started")
        s.kill9()
        restart(s)
        assert scrape(port).value("agent_sidecar_turns_total", outcome="failed",
                                  reason="restart_interrupted") == 1
    finally:
        s.stop()

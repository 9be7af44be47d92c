"""``agent-sidecar status`` and the GetStatus RPC behind it, against a real
sidecar: the fields an operator reads are there and true (the worker and
writer pids are the real child processes, the store size is the file's),
the RPC wants an admin credential over TCP; and a ``[metrics] listen`` the
sidecar cannot use is refused, naming the key."""

from __future__ import annotations

import json
import os
import signal
import socket

import grpc
import pytest
from helpers.cli import cli
from helpers.config import echo, table
from helpers.ids import source
from helpers.metrics import metrics_config, scrape
from helpers.pgproxy import PgProxy
from helpers.procs import children
from helpers.recovery import health
from helpers.streams import PromptRun, run
from helpers.waiting import wait_until
from sidecar_proc import TOKEN, Sidecar, error_info, free_port

import agent_sidecar
from agent_sidecar.v1 import status_service_pb2 as spb
from agent_sidecar.v1 import status_service_pb2_grpc as spb_grpc

MODES = ["REJECT_IF_BUSY", "FOLLOW_UP", "QUEUE", "INTERRUPT", "ROLLBACK", "STEER"]


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    s = Sidecar(tmp_path_factory.mktemp("status") / "data", config=echo("main"), tcp=True, workers=2).start()
    yield s
    s.stop()


def test_status_json_tells_the_truth(sc):
    for _ in range(3):
        assert run(sc.prompts(), text="hello", src=source()).end == "completed"
    out = cli("status", "--target", sc.target, "--json")
    assert out.returncode == 0, out.stderr
    st = json.loads(out.stdout)
    assert st["version"] == agent_sidecar.__version__
    assert st["node_id"] == f"{socket.gethostname()}:{os.path.abspath(sc.data_dir)}"
    assert st["serving"] is True and st["uptime_seconds"] > 0 and st["started_at"].endswith("Z")
    kids = children(sc)
    workers = {w["index"]: w for w in st["workers"]}
    assert sorted(workers) == [0, 1]
    for i, w in workers.items():
        assert w["pid"] == kids[f"sidecar-work-{i}"] and w["alive"] and w["restarts"] == 0
        assert w["rss_bytes"] > 1 << 20 and w["turns_running"] == 0
    assert sum(w["turns_run"] for w in st["workers"]) == 3
    assert st["turns_in_flight"] == 0 and st["prompts_admitted"] == 0
    assert st["cluster"] is None  # one sidecar: no cluster block
    assert st["queues"] == dict.fromkeys(MODES, 0)
    store = st["store"]
    assert store["backend"] == sc.backend and store["writable"] is True
    assert store["writer_pid"] == kids["sidecar-writer"] and store["writer_rss_bytes"] > 1 << 20
    assert store["commits"] > 0 and store["last_commit_seconds"] > 0 and store["writer_backlog"] >= 0
    if sc.backend == "sqlite":  # PostgreSQL's size is the database's, not a file's
        assert store["size_bytes"] >= os.path.getsize(sc.data_dir / "sidecar.db") > 0
    assert store["fts_backlog"] >= 0


def test_status_table(sc):
    out = cli("status", "--target", sc.target)
    assert out.returncode == 0, out.stderr
    kids = children(sc)
    assert "SERVING" in out.stdout and agent_sidecar.__version__ in out.stdout
    for name in ("sidecar-work-0", "sidecar-work-1", "sidecar-writer"):
        assert str(kids[name]) in out.stdout


def test_a_writer_that_stops_answering_takes_the_sidecar_out_of_rotation_until_it_answers(tmp_path):
    """A hung commit is no failure (the store stays `writable`, nothing is
    refused), but a prompt sent now waits as long as the hang: past ``[store]
    stall_not_serving_s`` health says NOT_SERVING, and SERVING again once the
    writer answers. GetStatus and the status table show how long jobs have
    waited with no answer, and GetStatus's ``serving`` is health's: it said
    true all through the hang (its proto says it is what health reports)."""
    config = echo("main") + table("store", stall_not_serving_s=2)
    with Sidecar(tmp_path / "data", config=config, workers=1) as s:
        writer = children(s)["sidecar-writer"]
        # none waits (a job of the start, retention or the FTS backlog may be in flight a moment)
        wait_until(lambda: s.status().store.writer_stalled_seconds == 0, 15, what="no job waiting")
        assert health(s.target) == "SERVING"
        os.kill(writer, signal.SIGSTOP)
        try:
            turn = PromptRun(s.prompts(), text="held", src=source())  # its accept waits for the writer
            wait_until(lambda: health(s.target) == "NOT_SERVING", 15, what="health NOT_SERVING")
            st = s.status()
            assert st.store.writable and st.store.writer_backlog >= 1 and st.store.writer_stalled_seconds >= 2
            assert not st.serving
            out = cli("status", "--target", s.target)
            assert out.returncode == 0 and " · NO ANSWER for " in out.stdout, out.stdout
            assert "NOT SERVING" in out.stdout, out.stdout
        finally:
            os.kill(writer, signal.SIGCONT)
        assert turn.result(30).end == "completed"
        wait_until(lambda: health(s.target) == "SERVING", 15, what="health SERVING again")
        wait_until(lambda: s.status().store.writer_stalled_seconds == 0, 15, what="the writer answering again")
        assert s.status().serving


def test_a_database_that_stops_answering_does_not_hold_up_status_or_a_scrape(pg_server, tmp_path):
    """The store's size is read from the database; a read on a connection to
    a database that hangs waits as long as it hangs. GetStatus and /metrics
    are how an operator sees the hang (the writer's NO ANSWER), so they answer
    without the size (within the status command's default 5 s and a
    scraper's usual 10 s) rather than hang with it, and say they are
    unknown (before, the table said "0 B" and a backlog of 0 messages, as if
    read)."""
    proxy = PgProxy(pg_server.database(f"status_hang_{os.getpid()}"))
    port = free_port()
    s = Sidecar(tmp_path / "data", config=echo("main") + metrics_config(port), dsn=proxy.dsn, workers=1).start()
    try:
        assert run(s.prompts(), text="hello", src=source()).end == "completed"
        assert scrape(port).value("agent_sidecar_store_size_bytes") > 0
        proxy.hang()
        turn = PromptRun(s.prompts(), text="held", src=source())  # its accept waits for the database
        for _ in range(2):  # the first read hangs, and the next one waits for it
            samples = scrape(port)
            assert samples.value("agent_sidecar_store_writable") == 1
            table_out = cli("status", "--target", s.target)
            assert table_out.returncode == 0, table_out.stderr
            assert "  postgres · size unknown · writable · full-text backlog unknown" in table_out.stdout, \
                table_out.stdout
        assert s.status().store.stats_unavailable
        store = json.loads(cli("status", "--target", s.target, "--json").stdout)["store"]
        assert store["size_bytes"] is None and store["fts_backlog"] is None, store
        wait_until(lambda: "NO ANSWER for" in cli("status", "--target", s.target).stdout, 15,
                   what="the status saying the writer does not answer")
        proxy.answer()
        assert turn.result(30).end == "completed"
        wait_until(lambda: scrape(port).value("agent_sidecar_store_size_bytes") > 0, 15,
                   what="the store size back in a scrape")
        wait_until(lambda: not s.status().store.stats_unavailable, 15, what="the store size back in GetStatus")
        assert json.loads(cli("status", "--target", s.target, "--json").stdout)["store"]["size_bytes"] > 0
    finally:
        proxy.answer()
        s.stop()
        proxy.close()


def test_get_status_over_tcp_needs_an_admin_token(sc):
    stub = spb_grpc.StatusServiceStub(sc.channel(tcp=True))
    r = stub.GetStatus(spb.GetStatusRequest(), metadata=[("authorization", f"Bearer {TOKEN}")], timeout=10)
    assert r.version == agent_sidecar.__version__ and len(r.workers) == 2
    with pytest.raises(grpc.RpcError) as e:
        stub.GetStatus(spb.GetStatusRequest(), timeout=10)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and error_info(e.value)[0] == "UNAUTHENTICATED"
    out = cli("status", "--target", sc.tcp_target, "--token", TOKEN, "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["serving"] is True, out.stderr


def test_status_without_a_sidecar_fails(tmp_path):
    out = cli("status", "--target", f"unix:{tmp_path}/none.sock", "--timeout", "1")
    assert out.returncode == 1 and "UNAVAILABLE" in out.stderr and out.stdout == ""


@pytest.mark.parametrize("value, problem", [
    ('"9464"', "expected HOST:PORT"),
    ('"localhost:99999"', "expected HOST:PORT"),
    ("9464", "expected a string"),
])
def test_a_bad_metrics_listen_is_refused_naming_the_key(tmp_path, value, problem):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[metrics]\nlisten = {value}\n")
    for args in (["config", "check", str(cfg)],
                 ["serve", "--data-dir", str(tmp_path / "data"), "--config", str(cfg)]):
        out = cli(*args)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert "config error: metrics.listen: " + problem in out.stderr, out.stderr
    assert not (tmp_path / "data").exists()


def test_a_metrics_port_in_use_stops_the_start(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        sc = Sidecar(tmp_path / "data", config=table("metrics", listen=f"127.0.0.1:{port}"))
        with pytest.raises(RuntimeError, match="exited with 1"):
            sc.start()
        assert f"metrics.listen: cannot listen on 127.0.0.1:{port}" in sc.log()
    sc.stop()

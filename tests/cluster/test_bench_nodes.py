"""`agent-sidecar bench --target A,B` across a cluster's nodes (several
sidecars on one PostgreSQL): one client process per node, each node runs the
lanes of the sessions made through it, and the one database holds every
turn the bench sent. No figure is asserted: speed is for benchmarks/."""

from __future__ import annotations

import json

import grpc
from helpers.cli import cli
from helpers.cluster import Cluster
from helpers.config import echo
from helpers.sessions import get_session, held, rpc_error

WORDS = 8


def test_bench_across_two_nodes_runs_turns_on_both_and_the_database_holds_them_all(tmp_path, cluster_dsn):
    with Cluster(tmp_path, cluster_dsn, 2, echo("main", 5), lease_ttl_s=15.0, workers=1) as cl:
        a, b = cl.nodes
        out = tmp_path / "bench.json"
        r = cli("bench", "--target", f"{a.target},{b.target}", "--concurrency", "4", "--duration", "1.5",
                "--keep-sessions", "--prompt-words", str(WORDS), "--calibrate", "0", "--json", str(out), timeout=120)
        assert r.returncode == 0, r.stderr
        doc = json.loads(out.read_text())
        assert doc["options"]["clients"] == 2 and doc["points"][0]["error_count"] == 0
        assert all(sum(w.turns_run for w in node.status().workers) > 0 for node in (a, b))

        completed, messages = held(a.sessions(), doc["sessions"]["keys"])  # one database: every node's
        totals = doc["totals"]
        assert totals["started"] == totals["completed"] == completed > 0 and messages == 2 * completed

        # Without --keep-sessions each node deletes the sessions made through it, lanes it holds included.
        r = cli("bench", "--target", f"{a.target},{b.target}", "--concurrency", "4", "--turns", "8",
                "--prompt-words", str(WORDS), "--calibrate", "0", "--json", str(out), timeout=120)
        assert r.returncode == 0, r.stderr
        sessions = json.loads(out.read_text())["sessions"]
        assert sessions["deleted"] == sessions["count"] == 4 and sessions["left"] == 0, sessions
        for node in (a, b):
            for key in sessions["keys"]:
                with rpc_error(grpc.StatusCode.NOT_FOUND):
                    get_session(node.sessions(), key)

"""Three nodes on one PostgreSQL soaked under random faults (helpers/chaos.py):
adapters prompt ten lanes through any node, in all six delivery modes (every
third lane calls a tool the soak hosts on every node), with admin calls
between, while a node, its writer or a worker is killed -9, a worker or a
whole node is stopped past its leases, a node is stopped cleanly and started
again, the PostgreSQL server itself is stopped (fast or as a crash) and
started again, every connection to it is cut, or a tool host's stream is cut.
Every acknowledged request must end exactly once, its frames without a gap,
no lane running two turns at once (on any node), every tool call in a
transcript answered, and no call may end INTERNAL.

The server is this test's own: the suite's shared one must never stop.
``CHAOS_SEED`` / ``CHAOS_SECONDS`` soak longer: ``make soak``."""

from __future__ import annotations

import pytest
from helpers import pg
from helpers.chaos import CONFIG, Soak, seed_and_seconds
from helpers.cluster import Cluster

pytestmark = pytest.mark.runs_long("a 60 s soak of three nodes, then its audit")


def test_a_cluster_under_random_faults_and_outages_ends_every_acknowledged_request_once(tmp_path):
    seed, seconds = seed_and_seconds(1, 60)
    server = pg.PgServer.start_temp()
    try:
        with Cluster(tmp_path, server.database("soak"), n=3, config=CONFIG,
                     lease_ttl_s=3.0, workers=2) as cl:
            report = Soak(list(cl), seed, server=server).run(seconds)
    finally:
        server.close()
    print(repr(report))  # shown by pytest -s or -rP
    # the soak did soak
    assert report.acknowledged >= 100 and report.tool_calls >= 10 and len(report.faults) >= 4, report
    assert not report.violations, report

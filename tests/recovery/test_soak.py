"""One sidecar soaked under random faults (helpers/chaos.py): adapters prompt ten
lanes in all six delivery modes (every third lane calls a tool the soak hosts
over ServeTools), with admin calls between, while the sidecar, its writer or a
worker is killed -9, a worker or the whole sidecar is stopped a while, it is
stopped cleanly and started again, the tool host's stream is cut, or (on
SQLite, where root may mount a small tmpfs for its data dir) its disk fills up
a while. Every acknowledged request must end exactly once, its frames without
a gap, no lane running two turns at once, every tool call in a transcript
answered, and no call may end INTERNAL. On either backend (on PostgreSQL the
suite's shared server, which this test never stops).

``CHAOS_SEED`` / ``CHAOS_SECONDS`` soak longer: ``make soak``."""

from __future__ import annotations

import pytest
from helpers.chaos import CONFIG, Soak, seed_and_seconds
from helpers.disk import SmallDisk
from sidecar_proc import Sidecar

pytestmark = pytest.mark.runs_long("a 40 s soak, then its audit")


def small_disk(tmp_path, backend: str) -> SmallDisk | None:
    """A tmpfs for the SQLite store, None on PostgreSQL or where none can be mounted."""
    if backend != "sqlite":
        return None
    try:
        return SmallDisk(tmp_path / "disk", 256)
    except pytest.skip.Exception:
        return None


def test_one_sidecar_under_random_faults_ends_every_acknowledged_request_once(tmp_path, store_backend):
    seed, seconds = seed_and_seconds(1, 40)
    disk = small_disk(tmp_path, store_backend)
    sc = Sidecar((disk.path if disk else tmp_path) / "data", config=CONFIG, workers=2)
    sc.log_path = tmp_path / "sidecar.log"  # the log must not need the full disk
    try:
        report = Soak([sc.start()], seed, disk=disk).run(seconds)
    finally:
        sc.stop()
        if disk is not None:
            disk.unmount()
    print(repr(report))  # shown by pytest -s or -rP
    # the soak did soak
    assert report.acknowledged >= 100 and report.tool_calls >= 10 and len(report.faults) >= 3, report
    assert not report.violations, report

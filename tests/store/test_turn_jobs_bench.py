"""benchmarks/turn_jobs_bench.py drives the writer's turn jobs through their
own signatures (turns/jobs.py, turns/flush.py): this runs it small, so a change
of those signatures breaks here rather than in someone's benchmark run."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from sidecar_proc import ROOT

pytestmark = pytest.mark.sqlite_only("the bench runs the jobs on an SQLite connection of its own")


def test_turn_jobs_bench_runs_and_prices_both_jobs():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "turn_jobs_bench.py"),
                          "--turns", "300", "--sessions", "40", "--group", "16"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    figures = dict(re.findall(r"^\s+(accept \+ start|frame flush|total)\s+([\d.]+) µs/turn", out.stdout, re.M))
    assert set(figures) == {"accept + start", "frame flush", "total"}, out.stdout
    assert all(float(v) > 0 for v in figures.values())
    share = re.search(r"inside SQLite statements ~([\d.]+) \((\d+)%\)", out.stdout)
    assert share and 0 < int(share.group(2)) < 100, out.stdout

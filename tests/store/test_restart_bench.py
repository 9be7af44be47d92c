"""benchmarks/gen_store.py writes a crash-state SQLite store with the
backend's own schema, and benchmarks/restart_bench.py restarts real sidecars
on it and runs the restore job in-process: this runs both small, so a change
of the schema, the backend's modules or the restore job's signature breaks
here rather than in someone's benchmark run (both broke once, unnoticed, when
the store moved behind its interface)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from sidecar_proc import ROOT

pytestmark = pytest.mark.sqlite_only("the generator writes a SQLite store; the restarted sidecar runs on it")


def test_restart_bench_generates_a_crash_store_restores_it_and_prices_its_queries():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "restart_bench.py"), "--sessions", "400",
                          "--frames", "4000", "--running", "20", "--recent", "30", "--pending", "20",
                          "--queued", "10", "--runs", "1"],
                         capture_output=True, text=True, timeout=180, cwd=ROOT / "benchmarks")
    assert out.returncode == 0, out.stderr[-3000:]
    # The crash the generator wrote is the one the restarted sidecar restored...
    restored = re.search(r"^crash store #1 .* marked=(\d+) suspended=\d+ closed_turns=(\d+) queued=(\d+)",
                         out.stdout, re.M)
    assert restored, out.stdout
    assert (int(restored.group(2)), int(restored.group(3))) == (20, 20), restored.group(0)
    assert int(restored.group(1)) >= 50  # the running and recent lanes at least
    # ...and the same plan comes out of the job run alone, in-process.
    alone = re.search(r"restore job alone .*: [\d.,]+ ms .*'closed_turns': (\d+), 'queued': (\d+)", out.stdout)
    assert alone and (int(alone.group(1)), int(alone.group(2))) == (20, 20), out.stdout
    assert re.search(r"health Check SERVING: median [\d,]+ ms", out.stdout), out.stdout
    # Every startup query is planned, and none reads a whole table.
    plans = re.findall(r"^(\S.*?)\s{2,}(search|partial-index scan|FULL (?:INDEX )?SCAN)\s", out.stdout, re.M)
    assert len(plans) == 15, out.stdout
    assert not [name for name, kind in plans if kind.startswith("FULL")], out.stdout

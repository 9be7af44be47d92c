"""Small helpers shared by the benchmarks: goal lines, the machine line, the
import path to the in-tree server code, a free port, stopping a server, a
client's window of calls kept in flight; tables, percentiles and per-process
CPU accounting come from ``agent_sidecar.bench`` (one copy for both).

Benchmarks are measurements, not tests: they print what they saw and say
whether a goal was met, and never fail on it.
"""

from __future__ import annotations

import asyncio
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Run from a checkout without an install too (``python benchmarks/x.py``).
for p in (ROOT / "server", ROOT):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

# One copy of the tables, percentiles and /proc accounting: the package's
# (agent_sidecar.bench, which `agent-sidecar bench` uses too).
from agent_sidecar.bench.procs import (  # noqa: E402,F401
    CLK_TCK,
    CpuWindow,
    children_of,
    machine_cpu,
    proc_comm,
    proc_cpu_seconds,
    proc_name,
)
from agent_sidecar.bench.report import table  # noqa: E402,F401
from agent_sidecar.bench.stats import percentile  # noqa: E402,F401


def machine_line() -> str:
    """The machine, and the SQLite the sidecar runs on (apsw's, not the stdlib's)."""
    import apsw
    return (f"{platform.node()} · {os.cpu_count()} CPU · Python {platform.python_version()} · "
            f"SQLite {apsw.sqlite_lib_version()} (apsw {apsw.apsw_version()})")


def goal_line(what: str, ratio: float, goal: float) -> str:
    verdict = "goal met" if ratio >= goal else "goal NOT met"
    return f"{what}: {ratio:.2f}x (goal >= {goal:g}x) -> {verdict}"


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def terminate(proc: subprocess.Popen | None, grace: float) -> None:
    """SIGTERM (the clean stop), then SIGKILL if it is not gone within ``grace`` s."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def keep_in_flight(total: int, in_flight: int, call: Callable[[], Awaitable[None]]) -> tuple[float, float]:
    """``total`` awaits of ``call()``, ``in_flight`` of them going at a time
    (each lane starts another as soon as its call ends); returns the window's
    (start, end) on the monotonic clock."""
    remaining = [total]

    async def lane() -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            await call()
    t0 = time.monotonic()
    await asyncio.gather(*(lane() for _ in range(min(in_flight, total))))
    return t0, time.monotonic()

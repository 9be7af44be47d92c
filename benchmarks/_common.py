"""Small helpers shared by the benchmarks: tables, percentiles, goal lines,
per-process CPU accounting, and the import path to the in-tree server code.

Benchmarks are measurements, not tests: they print what they saw and say
whether a goal was met, and never fail on it.
"""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Run from a checkout without an install too (``python benchmarks/x.py``).
for p in (ROOT / "server", ROOT):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def machine_line() -> str:
    import sqlite3
    return (f"{platform.node()} · {os.cpu_count()} CPU · Python {platform.python_version()} · "
            f"stdlib sqlite {sqlite3.sqlite_version}")


def table(headers: list[str], rows: list[list], title: str = "") -> str:
    """A plain-text table, numbers right-aligned."""
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [all(_is_num(r[i]) for r in rows) if rows else False for i in range(len(headers))]

    def line(r):
        return "  ".join(c.rjust(w) if numeric[i] else c.ljust(w)
                         for i, (c, w) in enumerate(zip(r, widths))).rstrip()

    out = []
    if title:
        out.append(title)
    out.append(line(cells[0]))
    out.append("  ".join("-" * w for w in widths))
    out.extend(line(r) for r in cells[1:])
    return "\n".join(out)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _fmt(v) -> str:
    if isinstance(v, bool) or v is None:
        return "-" if v is None else str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if abs(v) >= 100:
            return f"{v:,.0f}"
        if abs(v) >= 10:
            return f"{v:.1f}"
        return f"{v:.2f}"
    return str(v)


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (q in 0..100)."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, int(round(q / 100 * len(sorted_values) + 0.5)) - 1))
    return sorted_values[k]


def goal_line(what: str, ratio: float, goal: float) -> str:
    verdict = "goal met" if ratio >= goal else "goal NOT met"
    return f"{what}: {ratio:.2f}x (goal >= {goal:g}x) -> {verdict}"


# -- CPU accounting from /proc (Linux) ---------------------------------------------

def proc_cpu_seconds(pid: int, tid: int | None = None) -> float:
    """user+system CPU seconds of one process (threads included), or of one of
    its threads when ``tid`` is given; 0 if gone."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    try:
        with open(path, "rb") as f:
            data = f.read().decode()
    except OSError:
        return 0.0
    fields = data[data.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def children_of(pid: int) -> list[int]:
    """Direct children of a process (Linux, via /proc/<pid>/task/*/children)."""
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    out.extend(int(x) for x in f.read().split())
            except OSError:
                pass
    except OSError:
        pass
    return out


def proc_comm(pid: int) -> str:
    """A process's own name (``/proc/<pid>/comm``), which it may set itself."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def proc_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine, all cores, from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            parts = f.readline().split()[1:]
    except OSError:
        return 0.0, 0.0
    vals = [int(x) for x in parts]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
    total = sum(vals[:8])  # guest time is already counted in user
    return (total - idle) / CLK_TCK, total / CLK_TCK


class CpuWindow:
    """CPU seconds used by labelled groups of processes over a window, plus what
    the rest of the machine used meanwhile (other programs steal our cores too)."""

    def __init__(self, groups: dict[str, list]):
        """``groups``: label -> pids; a (pid, tid) pair counts one thread, and a
        ("rest", pid, tid) triple counts the process minus that thread."""
        self.groups = groups

    @staticmethod
    def _cpu(item) -> float:
        if isinstance(item, tuple) and item[0] == "rest":
            return proc_cpu_seconds(item[1]) - proc_cpu_seconds(item[1], item[2])
        if isinstance(item, tuple):
            return proc_cpu_seconds(item[0], item[1])
        return proc_cpu_seconds(item)

    def _snap(self):
        return ({g: sum(self._cpu(p) for p in pids) for g, pids in self.groups.items()},
                machine_cpu())

    def start(self) -> None:
        import time
        self._t0 = time.monotonic()
        self._s0 = self._snap()

    def stop(self) -> dict:
        import time
        wall = time.monotonic() - self._t0
        s1 = self._snap()
        per = {g: s1[0][g] - self._s0[0][g] for g in self.groups}
        busy = s1[1][0] - self._s0[1][0]
        ours = sum(per.values())
        return {"wall": wall, "groups": per, "machine_busy": busy,
                "others": max(0.0, busy - ours), "cores": os.cpu_count() or 1}


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

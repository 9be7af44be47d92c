#!/usr/bin/env python3
"""Instructions per echo turn, per sidecar process, counted by valgrind: a
figure this machine's noise cannot blur, so two trees compare to about a
percent where turns/s needs many paired rounds to show 5%.

    .venv/bin/python benchmarks/turn_instructions.py                       # this checkout
    .venv/bin/python benchmarks/turn_instructions.py --baseline ../before  # and another

How: turns_bench.py runs the sidecar under ``valgrind --tool=callgrind
--trace-children=yes`` (its ``BENCH_SIDECAR_PREFIX``) twice, with ``--turns``
A and then B; each process's instruction count in the second run minus the
first, over B − A, is its instructions per turn (start-up, session creation and
warm-up are the same in both runs and cancel out). The processes: the parent
(its event loop and gRPC's threads), the store writer, the workers (summed,
with any other child). The load is turns_bench's: echo turns, ``--in-flight``
at a time, each on its own idle session, this checkout's client for both trees.

Under valgrind every process runs some 50× slower, so one tree takes a few
minutes. Group commit batches differently from run to run (its groups depend
on timing), so the counts move between runs: runs of one tree on a quiet
machine agreed to 1–3% (the store writer's count moves most), and the writer's
moved by ~10% in a run that shared the cores with another benchmark (fewer,
larger groups, or more, smaller ones). Compare trees within one run: it
interleaves their runs, so a change of the machine's load falls on both.
Instructions are not time (a cache
miss or an fsync costs none here); they price the interpreter's work, which is
where a Python sidecar's CPU goes.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401  (sets sys.path)
from _common import machine_line, table

HERE = Path(__file__).resolve().parent
_UP = re.compile(r"^sidecar(?:-base)? up: pid (\d+), writer \[([\d, ]*)\], workers \[([\d, ]*)\]", re.M)


def _pids(text: str) -> list[int]:
    return [int(p) for p in text.replace(",", " ").split()]


def _total(path: Path, wait_s: float = 120.0) -> int:
    """A callgrind output file's instruction count (its ``totals:`` line),
    once the process wrote it: a child may exit after the sidecar did (an
    older tree's multiprocessing resource tracker does)."""
    deadline = time.monotonic() + wait_s
    while True:
        if path.exists():
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith("totals:"):
                    return int(line.split()[1])
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path}: no totals line after {wait_s:.0f} s (did the process exit?)")
        time.sleep(0.5)


def run_once(which: str, turns: int, args: argparse.Namespace, out: Path) -> dict[str, int]:
    """One turns_bench run under callgrind: instructions by process role."""
    out.mkdir(parents=True)  # a new one: a kept directory is not mixed with an earlier run's files
    prefix = f"valgrind --tool=callgrind --trace-children=yes --callgrind-out-file={out}/%p"
    cmd = [sys.executable, str(HERE / "turns_bench.py"), "--only", which, "--in-flight", str(args.in_flight),
           "--turns", str(turns), "--sessions", str(args.sessions), "--warmup", str(args.warmup),
           "--repeat", "1"]
    if which == "sidecar-base":  # (with --only sidecar, --baseline would run both sidecars)
        cmd += ["--baseline", args.baseline]
    if args.log_level:
        cmd += ["--log-level", args.log_level]
    done = subprocess.run(cmd, env=dict(os.environ, BENCH_SIDECAR_PREFIX=prefix), capture_output=True,
                          text=True)
    up = _UP.search(done.stderr)
    if done.returncode != 0 or up is None:
        raise RuntimeError(f"turns_bench failed ({done.returncode}):\n{done.stderr[-2000:]}")
    parent, writer, workers = int(up.group(1)), _pids(up.group(2)), _pids(up.group(3))
    counts = {"parent": _total(out / str(parent)),
              "store writer": sum(_total(out / str(p)) for p in writer),
              "workers": sum(_total(out / str(p)) for p in workers)}
    counts["sidecar, all processes"] = sum(counts.values())
    return counts


def per_turn(trees: list[str], args: argparse.Namespace, work: Path) -> dict[str, dict[str, float]]:
    """Instructions per turn by process role, for each of ``trees`` (turns_bench
    names: sidecar, sidecar-base). The runs interleave (A turns of each tree,
    then B turns of each), so a change in the machine's load falls on both."""
    a, b = args.turns
    counts: dict[str, list[dict[str, int]]] = {tree: [] for tree in trees}
    for n in (a, b):
        for tree in trees:
            t0 = time.monotonic()
            counts[tree].append(run_once(tree, n, args, work / f"{tree}-{n}"))
            print(f"  … {tree}, {n:,} turns: {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    out = {}
    for tree, (short, long) in counts.items():
        out[tree] = {role: (long[role] - short[role]) / (b - a) for role in short}
        print(f"  … {tree}: " + ", ".join(f"{role} {n:,.0f}" for role, n in out[tree].items())
              + " instructions per turn", file=sys.stderr, flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", metavar="DIR", help="another checkout, counted the same way")
    ap.add_argument("--turns", default="300,1300", help="the two runs' timed turns (default 300,1300)")
    ap.add_argument("--in-flight", type=int, default=64)
    ap.add_argument("--sessions", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--log-level", default=None,
                    help="the sidecars' --log-level (warning: without the per-turn log line)")
    ap.add_argument("--keep", metavar="DIR", help="write the callgrind files into DIR (for callgrind_annotate)"
                    " instead of a temporary directory")
    args = ap.parse_args()
    args.turns = sorted(int(x) for x in args.turns.split(","))
    if len(args.turns) != 2 or args.turns[0] == args.turns[1]:
        ap.error("--turns takes two different counts, e.g. 300,1300")
    if shutil.which("valgrind") is None:
        ap.error("valgrind is not installed (apt-get install valgrind)")
    print(f"turn_instructions · {machine_line()} · echo turns, {args.in_flight} in flight over "
          f"{args.sessions} sessions · runs of {args.turns[0]:,} and {args.turns[1]:,} turns")
    with tempfile.TemporaryDirectory(prefix="turn-instructions-") as d:
        work = Path(args.keep) if args.keep else Path(d)
        counted = per_turn(["sidecar", "sidecar-base"] if args.baseline else ["sidecar"], args, work)
    mine, base = counted["sidecar"], counted.get("sidecar-base")
    header = ["process", "this checkout (instructions/turn)"]
    if base:
        header += [f"baseline {args.baseline}", "this / baseline"]
    rows = []
    for role, n in mine.items():
        row: list = [role, f"{n:,.0f}"]
        if base:
            row += [f"{base[role]:,.0f}", f"{n / base[role]:.3f}" if base[role] else "-"]
        rows.append(row)
    print(table(header, rows, title="Instructions per echo turn (callgrind, whole process incl. its threads)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

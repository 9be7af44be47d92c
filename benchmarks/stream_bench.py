#!/usr/bin/env python3
"""Realistic-stream benchmark: a sweep of concurrent sessions, each turn a
stream of many deltas at a model's pace, through a REAL sidecar and the bare
server in one run, with the knee of each.

    .venv/bin/python benchmarks/stream_bench.py                 # standard sweep (~5 min)
    .venv/bin/python benchmarks/stream_bench.py --quick         # smoke run (~20 s)
    make bench-report                                           # the same, PNG + JSON into benchmarks/results/

The standard case: 200 words per turn, echo with ``token_latency_ms = 20``
(50 tokens/s per session, an ideal turn of 4.0 s), sessions 25, 50, 100, 200,
400. The sidecar is ``python -m agent_sidecar serve`` on a fresh temporary data
dir (default configuration otherwise: workers = CPU count, synchronous =
FULL); the load is ``agent-sidecar bench --compare-bare`` itself, in its own
process, so this measures exactly what a user's run measures. The bare server
gets the same token latency (``--bare-latency-ms``, no calibration guesswork),
and the ideal turn is the model's own time, words × token latency (``--ideal``).

The headline is the knee: the largest number of sessions whose p99 turn stays
within 10% of the ideal, for the sidecar and for the bare server, and their
ratio. A benchmark, not a test: it never fails on a figure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import _common
from _common import load_average, machine_line
from turns_bench import SidecarServer

STANDARD_SWEEP = "25,50,100,200,400"


def sidecar_config(token_latency_ms: float, coalesce_ms: float | None = None) -> str:
    text = ("# echo at a model's pace: one delta per word, token_latency_ms before each\n"
            "[profiles.main]\nmodel = \"echo\"\n"
            f"model_options = {{ token_latency_ms = {token_latency_ms!r} }}\n")
    if coalesce_ms is not None:  # else the sidecar's default
        text += f"[stream]\ncoalesce_ms = {coalesce_ms!r}\n"
    return text


def bench_args(args, target: str, out: Path | None) -> list[str]:
    cmd = [sys.executable, "-m", "agent_sidecar", "bench", "--target", target, "--sweep", args.sweep,
           "--duration", str(args.duration), "--prompt-words", str(args.prompt_words),
           "--compare-bare", "--bare-latency-ms", str(args.token_latency_ms), "--slo", args.slo,
           "--calibrate", str(args.calibrate),
           # The model-side ideal: every token's delay, nothing else (the calibration still runs
           # and is reported; on a busy machine its median is a little longer).
           "--ideal", str(args.prompt_words * args.token_latency_ms / 1000)]
    if args.warmup is not None:
        cmd += ["--warmup", args.warmup]
    if args.first_delta_slo is not None:
        cmd += ["--first-delta-slo", str(args.first_delta_slo)]
    if args.clients is not None:
        cmd += ["--clients", str(args.clients)]
    if args.find_knee is not None:
        cmd += ["--find-knee", str(args.find_knee)]
    if args.repeat > 1:
        cmd += ["--repeat", str(args.repeat)]
    if out is not None:
        cmd += ["--json", str(out / f"{args.name}.json"), "--plot", str(out / f"{args.name}.png")]
    return cmd


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: sweep 2,4, 2 s per point, 20 words")
    ap.add_argument("--sweep", default=None, help=f"sessions per point (default {STANDARD_SWEEP})")
    ap.add_argument("--duration", type=float, default=None, help="seconds measured per point (default 20)")
    ap.add_argument("--prompt-words", type=int, default=None, help="words per turn (default 200)")
    ap.add_argument("--token-latency-ms", type=float, default=20.0, help="echo's delay per token (default 20)")
    ap.add_argument("--warmup", default=None, help="passed to the bench (default auto)")
    ap.add_argument("--slo", default="10%", help="the knee's bound over the ideal turn (default 10%%)")
    ap.add_argument("--first-delta-slo", type=float, default=None, metavar="MS",
                    help="the knee's bound on the first delta's p99, in ms (default: none)")
    ap.add_argument("--calibrate", type=int, default=3, help="calibration turns (default 3)")
    ap.add_argument("--clients", type=int, default=None, help="bench client processes (default: the bench's, 1)")
    ap.add_argument("--find-knee", type=int, default=None, metavar="MAX",
                    help="past the sweep, add levels up to MAX until each server's knee is found")
    ap.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="run the sweep N times on the same sidecar; the knee is their median (default 1)")
    ap.add_argument("--workers", type=int, default=None, help="sidecar workers (default: its own, CPU count)")
    ap.add_argument("--coalesce-ms", type=float, default=None,
                    help="the sidecar's [stream] coalesce_ms (default: its own; 0: one frame per delta)")
    ap.add_argument("--out", default=None, help="directory for NAME.json and NAME.png (default: none)")
    ap.add_argument("--name", default="stream-bench", help="file name stem in --out (default stream-bench)")
    ap.add_argument("--dir", default=None, help="parent directory for the temporary data dir")
    ap.add_argument("--keep", action="store_true", help="keep the data dir (sidecar.db, sidecar.log)")
    args = ap.parse_args()
    args.sweep = args.sweep or ("2,4" if args.quick else STANDARD_SWEEP)
    args.duration = args.duration or (2.0 if args.quick else 20.0)
    args.prompt_words = args.prompt_words or (20 if args.quick else 200)
    if args.quick:
        args.calibrate = min(args.calibrate, 1)
    out = Path(args.out) if args.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)

    ideal = args.prompt_words * args.token_latency_ms / 1000
    print(f"stream_bench · {machine_line()} · load avg {load_average()}" + (" · QUICK" if args.quick else ""),
          flush=True)
    print(f"sweep {args.sweep} sessions · {args.prompt_words} words per turn at {args.token_latency_ms:g} ms "
          f"per token (model-side ideal {ideal:.2f} s) · {args.duration:g} s per point · coalesce_ms "
          + ("default" if args.coalesce_ms is None else f"{args.coalesce_ms:g}"), flush=True)
    root = Path(tempfile.mkdtemp(prefix="stream-bench-", dir=args.dir))
    server = SidecarServer(root, args.workers, "sidecar",
                           config=sidecar_config(args.token_latency_ms, args.coalesce_ms))
    try:
        server.start()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(_common.ROOT / "server"), os.environ.get("PYTHONPATH", "")]))
        rc = subprocess.call(bench_args(args, f"unix:{server.sock}", out), env=env)
    finally:
        server.stop()
    if args.keep:
        print(f"data kept in {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    if rc:
        print(f"stream_bench: the bench exited with {rc}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())

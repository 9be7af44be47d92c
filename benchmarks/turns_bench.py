#!/usr/bin/env python3
"""Turns benchmark: echo turns per second and latency through a REAL sidecar,
next to a bare grpc.aio server that streams the same five frames.

    .venv/bin/python benchmarks/turns_bench.py            # full run (~25 s)
    .venv/bin/python benchmarks/turns_bench.py --quick    # smoke run (~5 s)

Processes (all separate, so no one borrows another's event loop):

* **sidecar** — ``python -m agent_sidecar serve`` on a temporary data dir and Unix
  socket, default config: echo model, workers = CPU count, durable store
  (synchronous=FULL), JSON logs to a file. Every frame is committed before it is
  sent.
* **bare** — ``python -m agent_sidecar.bench.bare`` (the server behind
  ``agent-sidecar bench --compare-bare``, with no token latency): a grpc.aio
  server on uvloop, same server options and transport (Unix socket), whose
  ``Prompt`` builds and
  streams the same five ActivityFrame messages (accepted, started, text_delta,
  usage, completed) with no persistence, no workers, no lanes. Its gRPC helper
  threads get the sidecar's scheduler setting (``calm_grpc_threads``) and its
  handlers are generic ones only, as the sidecar's (``GenericOnly``), so the
  ratio prices persistence and workers only.
* **bare-plain** — the same bare server without those settings, as anyone would
  first write it: printed for reference, not used for the goal.
* **sidecar-traced** (``--tracing``) — the same sidecar with OpenTelemetry
  tracing on (``OTEL_TRACES_EXPORTER=otlp``, the ``otel`` extra): every turn's
  spans (Prompt RPC, turn, model call) batched and exported over OTLP/HTTP to a
  sink in this driver that answers 200 and drops them. Next to ``sidecar`` in
  the same run, it prices tracing.
* **sidecar-base** (``--baseline DIR``) — the sidecar of another checkout
  (DIR/server, e.g. a ``git worktree`` of an older commit), driven by this
  checkout's client, each round right before or after ``sidecar``: the paired
  ratio per round says what a change did, on a machine whose speed drifts.
* **client(s)** — this file with ``--client``: grpc.aio on uvloop, one channel,
  ``in_flight / clients`` concurrent ``Prompt`` calls each.

Sessions: ``--sessions`` (1,000) are created up front with GetOrCreateSession;
prompts name them by ``session_key``. Each client owns a disjoint share of them
and every call goes to a session picked at random among the client's sessions
that have no turn in flight, so a turn never waits behind another turn of its
session (no queueing, no FOLLOW_UP collapse). Delivery is QUEUE (3) anyway, as a
safety net: nothing is ever superseded. The text is one word ("hello"), so a
turn is exactly five frames; the client checks that.

Per point (in-flight level × server): a warm-up (every session once in the full
run), then a fixed number of turns is timed from the first call to the last
completed frame. Latency is per call, from the call to the ``completed`` frame.
CPU seconds of every process group and of the rest of the machine are read from
/proc over the same window, so the table says where the cores went.

With ``--metrics`` a second sidecar, **sidecar-metrics**, runs every point too:
the same, with ``[metrics] listen`` on a loopback port and this driver scraping
its ``/metrics`` once a second while it runs (issue 17: what the metrics cost).

Goal (issue 3): sidecar turns/s ≥ 0.6 × bare turns/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import _common  # noqa: F401  (sets sys.path)
from _common import (
    CpuWindow,
    children_of,
    free_port,
    goal_line,
    keep_in_flight,
    load_average,
    machine_line,
    percentile,
    table,
    terminate,
)

GOAL = 0.6
HERE = Path(__file__).resolve()
# A command the sidecar runs under (``BENCH_SIDECAR_PREFIX="valgrind --tool=callgrind
# --trace-children=yes"``: turn_instructions.py); then every wait on it is 30 times longer.
PREFIX = os.environ.get("BENCH_SIDECAR_PREFIX", "").split()
SLOW = 30 if PREFIX else 1
TEXT = "hello"
KINDS = ["accepted", "started", "text_delta", "usage", "completed"]
DELIVERY_QUEUE = 3


# ===================================================================================
# The client: N concurrent Prompt calls over one channel.
# ===================================================================================

def client_main(spec_json: str) -> int:
    import grpc
    import uvloop

    from agent_sidecar.v1 import prompt_service_pb2 as pb
    from agent_sidecar.v1 import prompt_service_pb2_grpc as pb_grpc

    spec = json.loads(spec_json)
    keys: list[str] = spec["keys"]
    rng = random.Random(spec["seed"])
    prefix = f"{spec['run']}-{spec['index']}"

    async def main() -> dict:
        async with grpc.aio.insecure_channel(spec["target"], options=[
                ("grpc.max_receive_message_length", 32 * 1024 * 1024)]) as ch:
            await asyncio.wait_for(ch.channel_ready(), 30)
            stub = pb_grpc.PromptServiceStub(ch)
            idle = list(keys)
            counter = [0]
            errors: list[str] = []

            async def one_turn(latencies: list | None) -> None:
                i = rng.randrange(len(idle))
                idle[i], idle[-1] = idle[-1], idle[i]
                key = idle.pop()  # this session is now busy (for this client)
                counter[0] += 1
                rid = f"{prefix}-{counter[0]}"
                req = pb.PromptRequest(request_id=rid, session_key=key, text=TEXT,
                                       delivery=DELIVERY_QUEUE)
                t0 = time.monotonic()
                kinds = []
                try:
                    async for resp in stub.Prompt(req, timeout=120 * SLOW):
                        kinds.append(resp.frame.WhichOneof("event"))
                except grpc.aio.AioRpcError as e:
                    errors.append(f"{e.code().name}: {e.details()}")
                    kinds = None
                finally:
                    idle.append(key)
                if kinds is not None and kinds != KINDS:
                    errors.append("frames: " + ",".join(kinds))
                elif latencies is not None and kinds is not None:
                    latencies.append(time.monotonic() - t0)

            if spec["warmup"]:
                await keep_in_flight(spec["warmup"], spec["in_flight"], lambda: one_turn(None))
            warm_errors = list(errors)
            errors.clear()
            print("ready", flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            latencies: list[float] = []
            t0, t1 = await keep_in_flight(spec["turns"], spec["in_flight"], lambda: one_turn(latencies))
            return {"start": t0, "end": t1, "latencies": latencies, "errors": errors[:20],
                    "error_count": len(errors), "warmup_errors": len(warm_errors),
                    "turns": len(latencies)}

    result = uvloop.run(main())
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    sys.stdin.readline()  # stay alive until the driver has read our CPU time
    return 0


# ===================================================================================
# The driver.
# ===================================================================================

def _py() -> str:
    return sys.executable


def _wait_socket(path: Path, proc: subprocess.Popen, timeout: float, log: Path | None = None) -> None:
    import grpc
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text()[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"server exited with {proc.returncode}\n{tail}")
        if path.exists():
            try:
                with grpc.insecure_channel(f"unix:{path}") as ch:
                    grpc.channel_ready_future(ch).result(timeout=1)
                    return
            except grpc.FutureTimeoutError:
                pass
        time.sleep(0.05)
    raise TimeoutError(f"no server on {path} after {timeout}s")


class SidecarServer:
    name = "sidecar"

    def __init__(self, root: Path, workers: int | None, name: str = "sidecar",
                 config: str = "# defaults: echo model on profile main, synchronous = FULL\n",
                 kind: str = "sidecar", env: dict[str, str] | None = None, server: Path | None = None):
        self.name = kind  # the row it reports under (sidecar, sidecar-traced, sidecar-base)
        self.env = env or {}
        self.dir = root / name
        self.dir.mkdir()
        self.sock = self.dir / "sidecar.sock"
        self.log = self.dir / "sidecar.log"
        self.workers = workers
        self.config = config
        self.listen: list[str] = []  # addresses it listens on besides its Unix socket
        self.log_level: str | None = None  # --log-level (None: the sidecar's default, info)
        self.server = server or _common.ROOT / "server"  # the sidecar's code (--baseline: another's)
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        cfg = self.dir / "config.toml"
        cfg.write_text(self.config)
        args = [*PREFIX, _py(), *os.environ.get("BENCH_SIDECAR_WRAP", "").split(), "-m", "agent_sidecar",
                "serve", "--data-dir", str(self.dir), "--config", str(cfg), "--log-format", "json",
                "--listen", f"unix:{self.sock}"]
        if self.workers:
            args += ["--workers", str(self.workers)]
        for address in self.listen:
            args += ["--listen", address]
        if self.log_level:
            args += ["--log-level", self.log_level]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(self.server), os.environ.get("PYTHONPATH", "")]), **self.env)
        self._logf = open(self.log, "ab")
        self.proc = subprocess.Popen(args, stdout=self._logf, stderr=subprocess.STDOUT, env=env,
                                     cwd=self.dir)
        _wait_socket(self.sock, self.proc, 60 * SLOW, self.log)
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        deadline = time.monotonic() + 60 * SLOW
        with grpc.insecure_channel(f"unix:{self.sock}") as ch:
            while health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5).status \
                    != health_pb2.HealthCheckResponse.SERVING:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.dir.name} not SERVING after 60 s")
                time.sleep(0.05)

    def create_sessions(self, n: int) -> list[str]:
        import grpc

        from agent_sidecar.v1 import common_pb2
        from agent_sidecar.v1 import session_service_pb2 as spb
        from agent_sidecar.v1 import session_service_pb2_grpc as spb_grpc

        async def go() -> list[str]:
            async with grpc.aio.insecure_channel(f"unix:{self.sock}") as ch:
                stub = spb_grpc.SessionServiceStub(ch)
                sem = asyncio.Semaphore(64)

                async def one(i: int) -> str:
                    async with sem:
                        r = await stub.GetOrCreateSession(spb.GetOrCreateSessionRequest(
                            source=common_pb2.SessionSource(platform="bench", chat_id=f"chat{i}",
                                                            user_id=f"user{i}", chat_type="dm")),
                            timeout=60 * SLOW)
                        return r.session.session_key
                return list(await asyncio.gather(*(one(i) for i in range(n))))
        return asyncio.run(go())

    def pids(self) -> dict[str, list[int]]:
        pid = self.proc.pid
        # Children name themselves (sidecar-writer, sidecar-work-N); any other child
        # (an older sidecar's multiprocessing resource tracker) idles: count it with the workers.
        kids = children_of(pid)
        writer = [k for k in kids if _common.proc_comm(k) == "sidecar-writer"]
        return {"sidecar loop thread": [(pid, pid)],
                "sidecar other threads": [("rest", pid, pid)],
                "store writer": writer,
                "workers": [k for k in kids if k not in writer]}

    def stop(self) -> None:
        terminate(self.proc, 90 * SLOW)
        if getattr(self, "_logf", None):
            self._logf.close()

    def verify(self, expected_turns: int) -> str:
        """After stop: what the store holds (proves the frames were persisted)."""
        db = self.dir / "sidecar.db"
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            frames = conn.execute("SELECT count(*) FROM frames").fetchone()[0]
            done = conn.execute("SELECT count(*) FROM prompts WHERE status = 'completed'").fetchone()[0]
            msgs = conn.execute("SELECT count(*) FROM messages").fetchone()[0]
        finally:
            conn.close()
        ok = "ok" if done == expected_turns and frames == 5 * expected_turns else "MISMATCH"
        return (f"store after the run: {done:,} completed prompts, {frames:,} frames, "
                f"{msgs:,} transcript messages (expected {expected_turns:,} turns, "
                f"{5 * expected_turns:,} frames) -> {ok}")


class Scraper:
    """GET /metrics every ``interval`` seconds on a thread, as Prometheus would."""

    def __init__(self, port: int, interval: float = 1.0):
        self.url, self.interval = f"http://127.0.0.1:{port}/metrics", interval
        self.scrapes = self.errors = 0
        self.seconds = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Scraper:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            t0 = time.monotonic()
            try:
                with urllib.request.urlopen(self.url, timeout=10) as r:
                    r.read()
                self.scrapes += 1
                self.seconds += time.monotonic() - t0
            except OSError:
                self.errors += 1

    def stop(self) -> str:
        self._stop.set()
        self._thread.join(15)
        mean = 1e3 * self.seconds / self.scrapes if self.scrapes else float("nan")
        return f"{self.scrapes} scrapes (mean {mean:.1f} ms), {self.errors} failed"


class BareServer:
    def __init__(self, root: Path, calm: bool = True):
        self.name = "bare" if calm else "bare-plain"
        self.calm = calm
        self.dir = root / self.name
        self.dir.mkdir()
        self.sock = self.dir / "bare.sock"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        # The package's bare server (agent_sidecar/bench/bare.py, also behind
        # `agent-sidecar bench --compare-bare`): no token latency, and the
        # one-word prompt is echoed as one delta, so a turn is the five frames.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(_common.ROOT / "server"), os.environ.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen([_py(), "-m", "agent_sidecar.bench.bare", "--listen", f"unix:{self.sock}"]
                                     + ([] if self.calm else ["--plain"]),
                                     stdout=subprocess.DEVNULL, env=env)
        _wait_socket(self.sock, self.proc, 30)

    def pids(self) -> dict[str, list[int]]:
        return {"bare server": [self.proc.pid]}

    def stop(self) -> None:
        terminate(self.proc, 10)


class TraceSink:
    """An OTLP/HTTP endpoint that takes every export and drops it (counted)."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        sink = self
        self.requests = self.bytes = 0

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(n)
                sink.requests += 1
                sink.bytes += n
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def env(self) -> dict[str, str]:
        host, port = self.server.server_address[:2]
        return {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://{host}:{port}/v1/traces"}

    def stop(self) -> None:
        self.server.shutdown()


def run_point(server, keys: list[str], in_flight: int, turns: int, warmup: int, clients: int,
              seed: int) -> dict:
    run = uuid.uuid4().hex[:8]
    shares = [keys[i::clients] for i in range(clients)]
    procs = []
    for i in range(clients):
        n_turns = turns // clients + (1 if i < turns % clients else 0)
        n_warm = warmup // clients + (1 if i < warmup % clients else 0)
        spec = {"target": f"unix:{server.sock}", "keys": shares[i], "seed": seed + i, "run": run,
                "index": i, "in_flight": max(1, in_flight // clients + (1 if i < in_flight % clients else 0)),
                "turns": n_turns, "warmup": n_warm}
        procs.append(subprocess.Popen([_py(), str(HERE), "--client", json.dumps(spec)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    try:
        for p in procs:
            line = p.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"a client did not get ready (exit {p.poll()}): {line!r}")
        groups = dict(server.pids())
        groups["client" + ("s" if clients > 1 else "")] = [p.pid for p in procs]
        cpu = CpuWindow(groups)
        cpu.start()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in procs:
            line = p.stdout.readline()
            if not line:
                raise RuntimeError(f"a client died mid-run (exit {p.wait()})")
            results.append(json.loads(line))
        usage = cpu.stop()
        for p in procs:
            p.stdin.write("exit\n")
            p.stdin.close()
            p.wait(30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    start = min(r["start"] for r in results)
    end = max(r["end"] for r in results)
    lat = sorted(x for r in results for x in r["latencies"])
    done = sum(r["turns"] for r in results)
    errors = sum(r["error_count"] for r in results)
    sample = [e for r in results for e in r["errors"]][:3]
    return {"server": server.name, "in_flight": in_flight, "turns": done, "errors": errors,
            "error_sample": sample, "warmup_errors": sum(r["warmup_errors"] for r in results),
            "seconds": end - start, "rate": done / (end - start) if end > start else 0.0,
            "p50_ms": percentile(lat, 50) * 1e3, "p99_ms": percentile(lat, 99) * 1e3,
            "max_ms": (lat[-1] * 1e3) if lat else float("nan"), "cpu": usage}


def paired_line(runs: list[dict], level: int) -> str:
    """This checkout's sidecar against --baseline's, round by round (the two
    ran back to back, in alternating order): the median of the per-round ratios
    of turns/s and of CPU per turn, which a drifting machine blurs less than a
    ratio of bests."""
    def by_round(name: str) -> list[dict]:
        return [r for r in runs if r["server"] == name and r["in_flight"] == level]
    pairs = list(zip(by_round("sidecar"), by_round("sidecar-base")))
    if not pairs:
        return f"  sidecar / sidecar-base at {level} in flight: no pair of rounds"

    def cpu(r: dict) -> float:
        return sum(r["cpu"]["groups"].values()) / max(1, r["turns"])
    rates = sorted(a["rate"] / b["rate"] for a, b in pairs)
    cpus = sorted(cpu(a) / cpu(b) for a, b in pairs)
    return (f"  sidecar / sidecar-base at {level} in flight, {len(pairs)} paired round(s): turns/s ratio "
            f"median {statistics.median(rates):.3f} (range {rates[0]:.3f}–{rates[-1]:.3f}), "
            f"CPU per turn ratio median {statistics.median(cpus):.3f}")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: fewer turns and sessions")
    ap.add_argument("--in-flight", default="64,256", help="comma-separated concurrent Prompt calls")
    ap.add_argument("--turns", type=int, default=None, help="timed turns per point (default 3000, quick 300)")
    ap.add_argument("--sessions", type=int, default=None, help="sessions (default 1000, quick 300)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="warm-up turns per point (default: one per session; quick 100)")
    ap.add_argument("--clients", type=int, default=1, help="client processes (default 1)")
    ap.add_argument("--repeat", type=int, default=None,
                    help="rounds, alternating the servers; each row reports its best round (default 2, quick 1)")
    ap.add_argument("--workers", type=int, default=None, help="sidecar workers (default: its own default, CPU count)")
    ap.add_argument("--only", choices=("sidecar", "sidecar-base", "sidecar-traced", "bare", "bare-plain"),
                    default=None)
    ap.add_argument("--tracing", action="store_true",
                    help="also run sidecar-traced: the sidecar with OpenTelemetry tracing on (OTLP to a sink)")
    ap.add_argument("--no-plain", action="store_true",
                    help="skip the bare-plain reference server (saves a third of the run)")
    ap.add_argument("--metrics", action="store_true",
                    help="also run sidecar-metrics: [metrics] listen on, /metrics scraped every second")
    ap.add_argument("--baseline", default=None, metavar="DIR",
                    help="also run the sidecar of another checkout (sidecar-base), paired round by round")
    ap.add_argument("--dir", default=None, help="parent directory for the temporary data dirs")
    ap.add_argument("--log-level", default=None,
                    help="the sidecars' --log-level (e.g. warning: no `turn finished` line per turn)")
    ap.add_argument("--keep", action="store_true", help="keep the data dirs (sidecar.db, sidecar.log)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--client", metavar="SPEC", help=argparse.SUPPRESS)
    return ap


@dataclass
class Plan:
    """What one run measures: the servers in their order, and each point's sizes."""
    args: argparse.Namespace
    names: list[str]
    levels: list[int]
    turns: int
    n_sessions: int
    warmup: int
    repeat: int
    baseline: Path | None


def _plan(ap: argparse.ArgumentParser, args: argparse.Namespace) -> Plan:
    levels = [int(x) for x in args.in_flight.split(",")]
    n_sessions = args.sessions or (300 if args.quick else 1000)
    if max(levels) > n_sessions:
        ap.error("--in-flight must not exceed --sessions (each in-flight turn needs an idle session)")
    baseline = Path(args.baseline).resolve() / "server" if args.baseline else None
    if args.only == "sidecar-base" and baseline is None:
        ap.error("--only sidecar-base needs --baseline")
    if baseline is not None and not (baseline / "agent_sidecar").is_dir():
        ap.error(f"--baseline {args.baseline}: no server/agent_sidecar there")
    names = [n for n in ("sidecar", "sidecar-traced", "bare", "bare-plain") if args.only in (None, n)
             and not (n == "bare-plain" and args.no_plain and args.only != n)
             and not (n == "sidecar-traced" and not args.tracing)]
    if args.metrics:
        names.insert(names.index("sidecar") + 1 if "sidecar" in names else 0, "sidecar-metrics")
    if args.baseline and args.only in (None, "sidecar", "sidecar-base"):
        names.insert(names.index("sidecar") + 1 if "sidecar" in names else 0, "sidecar-base")
    return Plan(args, names, levels, turns=args.turns or (300 if args.quick else 3000), n_sessions=n_sessions,
                warmup=args.warmup if args.warmup is not None else (100 if args.quick else n_sessions),
                repeat=args.repeat or (1 if args.quick else 2), baseline=baseline)


def _sidecar_point(plan: Plan, root: Path, name: str, rnd: int, level: int, sink: TraceSink | None,
                   checks: list[str]) -> dict:
    """One point on a fresh sidecar and data dir, so rounds are true repeats
    (transcripts do not grow from one to the next); its store checked after."""
    args = plan.args
    port = free_port()
    config = (f'[metrics]\nlisten = "127.0.0.1:{port}"\n' if name == "sidecar-metrics"
              else "# defaults: echo model on profile main, synchronous = FULL\n")
    server = SidecarServer(root, args.workers, f"{name}-{rnd}-{level}", config, kind=name,
                           env=sink.env() if name == "sidecar-traced" and sink else None,
                           server=plan.baseline if name == "sidecar-base" else None)
    server.log_level = args.log_level
    scraper = None
    try:
        server.start()
        if name == "sidecar-metrics":
            scraper = Scraper(port).start()
        keys = server.create_sessions(plan.n_sessions)
        kids = server.pids()
        print(f"{name} up: pid {server.proc.pid}, writer {kids['store writer']}, "
              f"workers {kids['workers']}, data {server.dir}", file=sys.stderr)
        r = run_point(server, keys, level, plan.turns, plan.warmup, args.clients, args.seed + 1000 * rnd)
    finally:
        if scraper is not None:
            print(f"  … {name}: {scraper.stop()}", file=sys.stderr)
        server.stop()
    try:
        checks.append(server.verify(plan.turns + plan.warmup))
    except sqlite3.Error as e:
        checks.append(f"store check failed: {e}")
    return r


def _run_rounds(plan: Plan, root: Path, sink: TraceSink | None, checks: list[str]) -> list[dict]:
    """Every server at every level, ``repeat`` times; odd rounds run the
    servers in reverse order, so none is always first after a quiet spell or
    always right behind another."""
    args = plan.args
    bare_keys = [f"agent:main:bench:dm:chat{i}" for i in range(plan.n_sessions)]
    bares = {name: BareServer(root, calm=(name == "bare")) for name in plan.names if not name.startswith("sidecar")}
    runs: list[dict] = []
    try:
        for b in bares.values():
            b.start()
        for rnd in range(plan.repeat):
            for level in plan.levels:
                for name in (plan.names if rnd % 2 == 0 else plan.names[::-1]):
                    if name.startswith("sidecar"):
                        r = _sidecar_point(plan, root, name, rnd, level, sink, checks)
                    else:
                        r = run_point(bares[name], bare_keys, level, plan.turns, plan.warmup, args.clients,
                                      args.seed + 1000 * rnd)
                    runs.append(r)
                    print(f"  … round {rnd + 1}: {name} @ {level}: {r['rate']:,.0f} turns/s, "
                          f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, errors {r['errors']}, "
                          f"others' CPU {100 * r['cpu']['others'] / r['cpu']['wall']:.0f}%", file=sys.stderr)
    finally:
        for b in bares.values():
            b.stop()
    return runs


def _print_tables(plan: Plan, results: list[dict], all_runs: list[dict], checks: list[str]) -> None:
    print()
    rows = [[r["server"], r["in_flight"], r["turns"], r["rate"], r["rate"] * 5, r["p50_ms"],
             r["p99_ms"], r["max_ms"], r["errors"]] for r in results]
    print(table(["server", "in flight", "turns", "turns/s", "frames/s", "p50 ms", "p99 ms", "max ms",
                 "errors"], rows, title="Echo turns (one word, 5 frames per turn)"))
    if plan.repeat > 1:
        print("all rounds (turns/s): " + "; ".join(
            f"{name} @{lv}: " + "/".join(f"{r['rate']:,.0f}" for r in all_runs
                                         if r["server"] == name and r["in_flight"] == lv)
            for lv in plan.levels for name in plan.names))
    for r in all_runs:
        if r["errors"] or r["warmup_errors"]:
            print(f"  {r['server']} @ {r['in_flight']}: {r['errors']} errors "
                  f"({r['warmup_errors']} during warm-up), e.g. {r['error_sample']}")
    print()
    cpu_rows = []
    for r in results:
        u = r["cpu"]
        parts = [f"{g} {100 * s / u['wall']:.0f}%" for g, s in u["groups"].items()]
        cpu_rows.append([r["server"], r["in_flight"], "  ".join(parts),
                         f"{100 * u['others'] / u['wall']:.0f}%",
                         f"{100 * u['machine_busy'] / (u['wall'] * u['cores']):.0f}%",
                         1e3 * sum(u["groups"].values()) / max(1, r["turns"])])
    print(table(["server", "in flight", "CPU by process group (100% = one core)", "other programs",
                 "machine busy", "our CPU ms/turn"], cpu_rows,
                title=f"Where the CPU went during each timed window ({os.cpu_count()} cores)"))
    if checks:
        bad = [c for c in checks if not c.endswith("-> ok")]
        print(f"store after each sidecar point ({len(checks)}): "
              + ("every turn's frames and messages persisted -> ok" if not bad else "; ".join(bad)))


def _print_ratios(plan: Plan, results: list[dict], all_runs: list[dict]) -> None:
    print()
    by = {(r["server"], r["in_flight"]): r for r in results}
    for level in plan.levels:
        s, b = by.get(("sidecar", level)), by.get(("bare", level))
        if s and b and b["rate"]:
            print(goal_line(f"sidecar / bare turns/s at {level} in flight "
                            f"({s['rate']:,.0f} / {b['rate']:,.0f})", s["rate"] / b["rate"], GOAL))
        if plan.baseline is not None:
            print(paired_line(all_runs, level))
        m = by.get(("sidecar-metrics", level))
        if s and m and s["rate"]:
            print(f"  metrics on and scraped every second / metrics off at {level} in flight "
                  f"({m['rate']:,.0f} / {s['rate']:,.0f}) = {m['rate'] / s['rate']:.3f}x")
        t = by.get(("sidecar-traced", level))
        if s and t and s["rate"]:
            print(f"  tracing on: sidecar-traced / sidecar turns/s at {level} in flight "
                  f"({t['rate']:,.0f} / {s['rate']:,.0f}) = {t['rate'] / s['rate']:.2f}x, p50 "
                  f"{t['p50_ms']:.1f} / {s['p50_ms']:.1f} ms")
        p = by.get(("bare-plain", level))
        if s and p and p["rate"]:
            print(f"  for reference, not the goal: sidecar / bare-plain at {level} in flight "
                  f"({s['rate']:,.0f} / {p['rate']:,.0f}) = {s['rate'] / p['rate']:.2f}x")


def main() -> int:
    ap = _parser()
    args = ap.parse_args()
    if args.client:
        return client_main(args.client)
    sys.stdout.reconfigure(line_buffering=True)
    plan = _plan(ap, args)
    print(f"turns_bench · {machine_line()} · load avg {load_average()}"
          + (" · QUICK" if args.quick else ""))
    print(f"{plan.n_sessions:,} sessions · {plan.turns:,} timed turns per point · warm-up {plan.warmup:,} turns · "
          f"{args.clients} client process(es) · text {TEXT!r} (5 frames per turn) · delivery QUEUE, "
          f"each in-flight turn on its own idle session · best of {plan.repeat} round(s)")
    root = Path(tempfile.mkdtemp(prefix="turns-bench-", dir=args.dir))
    checks: list[str] = []
    sink = TraceSink() if args.tracing else None
    try:
        all_runs = _run_rounds(plan, root, sink, checks)
    finally:
        if sink is not None:
            sink.stop()
    results = []  # each server's best round at each level
    for level in plan.levels:
        for name in plan.names:
            mine = [r for r in all_runs if r["server"] == name and r["in_flight"] == level]
            if mine:
                results.append(max(mine, key=lambda r: r["rate"]))
    _print_tables(plan, results, all_runs, checks)
    _print_ratios(plan, results, all_runs)
    if sink is not None:
        print(f"trace sink: {sink.requests:,} OTLP export requests, {sink.bytes / 1e6:,.1f} MB of spans")
    if args.keep:
        print(f"data kept in {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

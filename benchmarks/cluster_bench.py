#!/usr/bin/env python3
"""Cluster benchmark: echo turns/s, p50/p99 turn latency and CPU per turn with
one sidecar on SQLite, one on PostgreSQL, and two and three sidecars on one
PostgreSQL database, in one run (one machine state), plus PostgreSQL's own CPU.

    .venv/bin/python benchmarks/cluster_bench.py            # full run
    .venv/bin/python benchmarks/cluster_bench.py --quick    # smoke run

**On a 2-core machine this measures overhead, not scale**: the sidecars,
PostgreSQL and the client share the same two cores, so more nodes cannot add
throughput; the table prices the PostgreSQL path and the cluster (leases,
forwarding) per turn against the embedded SQLite store.

PostgreSQL is ``--dsn``'s server or one started for the run (``initdb`` into a
temporary directory, as the ``postgres`` user when run as root, on a free port
with its socket dir there; stopped and removed at the end), default settings
(fsync on); a fresh database per configuration. The sidecars run the default
configuration (echo model, workers = CPU count), each on its own data dir and
Unix socket; on PostgreSQL every one is a cluster node (``[cluster] node_id,
advertise, token``, the token an admin ``[[auth.tokens]]`` too, a TCP listener
on the advertised address), the single one as well: leases and fencing are
the PostgreSQL path. The client (``_cluster_client.py``: grpc.aio on
uvloop, one channel per node) keeps ``--in-flight`` Prompt calls going, each
on a random session with no turn in flight (QUEUE, one word: five frames,
checked), and sends each call to the next node in turn, as an adapter behind a
load balancer would: most calls reach a node that does not hold the lane's
lease and are forwarded to the holder. ``--affinity`` adds rows where each
session's calls all go to one node.

Per configuration: sessions created, one warm-up turn per session (each lane
takes its lease), then ``--turns`` timed turns, latency per call from sending
it to its ``completed`` frame. Lease takes in the window come from the lease
rows' epochs; a timed call to a node other than the holder of a lane with no
take was forwarded (lanes with takes give a range: a lane idle for
``lease_ttl_s`` is let go, and its next call takes it wherever it lands).
CPU over the window from /proc: the sidecars' whole process trees, the
postmaster's (exited backends included), the client's, other programs'.
Afterwards the store must hold every turn, completed, with its five frames.

``--only`` picks configurations (``--only 1xsqlite,1xpostgres``); ``--baseline
DIR`` runs each one a second time with the sidecars' code from another checkout
(``DIR/server``: the same interpreter and packages, the old code), interleaved
with this one's, so before and after come from one machine state; ``--count``
adds, per PostgreSQL configuration, the statements per turn and the store
writers' round trips per turn (_pgcount.py; a separate window, traced).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import _common
import _pgcount
from _common import (
    CpuWindow,
    children_of,
    free_port,
    load_average,
    machine_line,
    percentile,
    proc_comm,
    proc_cpu_seconds,
    table,
)
from _postgres import Postgres
from turns_bench import SidecarServer

CLIENT = Path(__file__).resolve().parent / "_cluster_client.py"  # the client process
TOKEN = "cluster-bench-token"
CONFIGS = [("sqlite", 1, False), ("postgres", 1, False), ("postgres", 2, False), ("postgres", 3, False)]
BASE = " [base]"  # the label suffix of a configuration run with --baseline's code


# -- the sidecars ---------------------------------------------------------------------

class Node(SidecarServer):
    """turns_bench's sidecar; on PostgreSQL a cluster node with a TCP listener."""

    def __init__(self, root: Path, name: str, dsn: str | None, server: Path):
        port = free_port() if dsn else None
        config = "" if dsn is None else f"""[store]
backend = "postgres"
dsn = "{dsn}"
[cluster]
node_id = "{name}"
advertise = "127.0.0.1:{port}"
token = "{TOKEN}"
[[auth.tokens]]
token = "{TOKEN}"
admin = true
platforms = ["*"]
"""
        super().__init__(root, None, name, config)
        self.name = name  # its node_id in the lease rows
        self.listen = [f"127.0.0.1:{port}"] if port else []
        self.server = server  # the sidecar's code: this checkout's server/, or --baseline's

    def writer_pid(self) -> int:
        assert self.proc is not None  # started
        return next(k for k in children_of(self.proc.pid) if proc_comm(k) == "sidecar-writer")


# -- one configuration: nodes up, sessions, warm-up, the timed window, the checks ------

def leases(dsn: str | None) -> dict[str, tuple[str, int]]:
    if dsn is None:
        return {}
    import psycopg
    with psycopg.connect(dsn) as conn:
        return {k: (n, e) for k, n, e in conn.execute("SELECT session_key, node_id, epoch FROM leases")}


def stored(dsn: str | None, sqlite_file: Path) -> tuple[dict, int]:
    """(prompts by status, frames) the store holds after the run."""
    if dsn is None:
        conn = sqlite3.connect(f"file:{sqlite_file}?mode=ro", uri=True)
    else:
        import psycopg
        conn = psycopg.connect(dsn)
    try:
        status = dict(conn.execute("SELECT status, count(*) FROM prompts GROUP BY status").fetchall())
        return status, conn.execute("SELECT count(*) FROM frames").fetchone()[0]
    finally:
        conn.close()


def forwarded(calls: dict, before: dict, after: dict, names: list[str]) -> tuple[int, int, int]:
    """(lease takes in the window, forwarded calls at least, at most). A take
    moves a lane's epoch on by one. On a lane with no take, a call to a node
    other than the holder was forwarded; on one with takes, each take was a
    call that was not, and of the rest some were (which ones, the rows do not say)."""
    takes = {k: e - before.get(k, ("", 0))[1] for k, (_, e) in after.items()}
    low = high = 0
    if len(names) == 1:  # nowhere to forward to
        return sum(takes.values()), 0, 0
    for key, per_node in calls.items():
        if takes.get(key, 0) == 0 and key in before:
            low += sum(c for i, c in enumerate(per_node) if names[i] != before[key][0])
        else:
            high += max(0, sum(per_node) - takes.get(key, 0))
    return sum(takes.values()), low, low + high


def label(cfg: tuple) -> str:
    backend, n, affinity, base = cfg
    return f"{n} x {backend}" + (" affinity" if affinity else "") + (BASE if base else "")


def run_config(root: Path, pg: Postgres, pg_root: int | None, cfg: tuple, rnd: int, args,
               count: bool = False) -> dict:
    backend, n, affinity, base = cfg
    tag = f"{backend}{n}{'a' if affinity else ''}{'b' if base else ''}{'c' if count else ''}_{rnd}"
    dsn = pg.create_db(f"cluster_bench_{os.getpid()}_{tag}") if backend == "postgres" else None
    server = Path(args.baseline) / "server" if base else _common.ROOT / "server"
    nodes = [Node(root, f"{tag}-n{i}", dsn, server) for i in range(n)]
    saved = dict(os.environ)
    if count and dsn:
        os.environ.update(_pgcount.environ(root))  # the writers count what they send
    try:
        for node in nodes:
            node.start()
        keys = nodes[0].create_sessions(args.sessions)
        spec = {"targets": [f"unix:{x.sock}" for x in nodes], "keys": keys, "seed": args.seed + rnd,
                "run": uuid.uuid4().hex[:8], "in_flight": args.in_flight, "turns": args.turns,
                "warmup": args.sessions, "affinity": affinity, "out": str(root / f"{tag}-client.json")}
        counter = _pgcount.Counter(root, tag) if count and dsn else None
        r = drive(spec, nodes, pg_root, dsn, counter)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        for node in nodes:  # stop them together (a clean stop drains and lets go of leases)
            if node.proc and node.proc.poll() is None:
                node.proc.send_signal(signal.SIGTERM)
        for node in nodes:
            node.stop()
    status, frames = stored(dsn, nodes[0].dir / "sidecar.db")
    want = args.turns + args.sessions
    r.update(config=label(cfg), backend=backend,
             nodes=n, affinity=affinity, round=rnd,
             stored_ok=(status, frames) == ({"completed": want}, 5 * want),
             stored=f"prompts {status}, {frames:,} frames (expected {want:,} completed, {5 * want:,})")
    return r


def drive(spec: dict, nodes: list[Node], pg_root: int | None, dsn: str | None,
          counter: _pgcount.Counter | None = None) -> dict:
    """One client process through warm-up and the timed window; CPU and leases around it."""
    client = subprocess.Popen([sys.executable, str(CLIENT), json.dumps(spec)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        if client.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the client did not get ready (exit {client.poll()})")
        groups = {"sidecars": [("tree", x.proc.pid) for x in nodes], "client": [client.pid]}
        if pg_root and dsn:
            groups["postgres"] = [("tree", pg_root)]
        before, cpu = leases(dsn), CpuWindow(groups)
        if counter is not None and dsn:
            counter.start(dsn, [x.writer_pid() for x in nodes])
        writers = [x.writer_pid() for x in nodes]
        writer0 = sum(proc_cpu_seconds(w) for w in writers)
        cpu.start()
        client.stdin.write("go\n")
        client.stdin.flush()
        line = client.stdout.readline()
        usage = cpu.stop()
        usage["writers"] = sum(proc_cpu_seconds(w) for w in writers) - writer0  # part of "sidecars"
        counted = counter.stop() if counter is not None else None
        if line.strip() != "done":
            raise RuntimeError(f"the client died mid-run (exit {client.poll()})")
        result, after = json.loads(Path(spec["out"]).read_text()), leases(dsn)
        client.stdin.write("exit\n")
        client.stdin.close()
        client.wait(30)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    lat, secs = sorted(result["latencies"]), result["end"] - result["start"]
    takes, low, high = forwarded(result["calls"], before, after, [x.name for x in nodes])
    return {"turns": len(lat), "seconds": secs, "rate": len(lat) / secs if secs > 0 else 0.0,
            "p50_ms": percentile(lat, 50) * 1e3, "p99_ms": percentile(lat, 99) * 1e3,
            "errors": result["error_count"], "warmup_errors": result["warmup_errors"],
            "error_sample": result["errors"], "lease_takes": takes, "forwarded": [low, high],
            "cpu": usage, "count": counted}


# -- the report --------------------------------------------------------------------------

def per_turn(r: dict, group: str) -> float | None:
    s = r["cpu"]["groups"].get(group)
    return None if s is None else 1e3 * s / max(1, r["turns"])


def server_ms(r: dict) -> float:
    return per_turn(r, "sidecars") + (per_turn(r, "postgres") or 0.0)


def report(best: list[dict], every: list[dict]) -> list[str]:
    rows = []
    for r in best:
        pgc = per_turn(r, "postgres")
        low, high = r["forwarded"]
        fwd = "-" if r["backend"] == "sqlite" else f"{low:,}" + (f"–{high:,}" if high > low else "")
        takes = "-" if r["backend"] == "sqlite" else r["lease_takes"]
        rows.append([r["config"], r["turns"], r["rate"], r["p50_ms"], r["p99_ms"], r["errors"], takes, fwd,
                     per_turn(r, "sidecars"), 1e3 * r["cpu"]["writers"] / max(1, r["turns"]),
                     "-" if pgc is None else pgc, server_ms(r),
                     per_turn(r, "client"), f"{100 * r['cpu']['others'] / r['cpu']['wall']:.0f}%"])
    out = [table(["config", "turns", "turns/s", "p50 ms", "p99 ms", "errors", "lease takes", "forwarded",
                  "sidecars ms/turn", "of it writers", "postgres ms/turn", "server ms/turn", "client ms/turn",
                  "other programs"], rows, title="Echo turns (one word, 5 frames per turn)")]
    out.append("CPU ms per turn over the timed window: sidecars = every node's whole process tree "
               "(of it writers: their store writer processes), "
               "postgres = the postmaster's tree, server = the two; other programs: 100% = one core. "
               "lease takes: leases taken in the window (a lane idle for lease_ttl_s is let go, so a "
               "session's next call takes it again); forwarded: timed calls the node they were sent to "
               "passed to the lane's holder, from the lease rows (a range when leases moved).")
    if len({r["round"] for r in every}) > 1:
        out.append("all rounds (turns/s): " + "; ".join(
            f"{b['config']}: " + "/".join(f"{r['rate']:,.0f}" for r in every if r["config"] == b["config"])
            for b in best))
    for r in every:
        if r["errors"] or r["warmup_errors"] or not r["stored_ok"]:
            out.append(f"  {r['config']} round {r['round'] + 1}: {r['errors']} errors "
                       f"({r['warmup_errors']} in warm-up) {r['error_sample']}; store: {r['stored']}")
    if all(r["stored_ok"] for r in every):
        out.append("store after every configuration: every turn completed with its 5 frames -> ok")
    by_config = {r["config"]: r for r in best}
    for r in best:
        base = r["config"].endswith(BASE)
        lite = by_config.get("1 x sqlite" + (BASE if base else ""))
        if lite and r["backend"] == "postgres":
            out.append(_ratio(r, lite))
    for r in best:
        if (old := by_config.get(r["config"] + BASE)) is not None:
            out.append(_ratio(r, old))
    out.append(f"On this {os.cpu_count()}-core machine this measures overhead, not scale: every node, "
               "PostgreSQL and the client share the same cores.")
    return out


def _ratio(r: dict, other: dict) -> str:
    return (f"{r['config']} / {other['config']}: server CPU per turn {server_ms(r):.2f} / "
            f"{server_ms(other):.2f} ms = {server_ms(r) / server_ms(other):.2f}x · turns/s "
            f"{r['rate'] / other['rate']:.2f}x · p50 {r['p50_ms'] / other['p50_ms']:.2f}x")


def _swap_pairs(configs: list[tuple]) -> list[tuple]:
    """Each (this code, baseline) pair the other way round."""
    return [c for i in range(0, len(configs), 2) for c in reversed(configs[i:i + 2])]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: fewer turns and sessions")
    ap.add_argument("--turns", type=int, default=None, help="timed turns per configuration (default 3000, quick 200)")
    ap.add_argument("--sessions", type=int, default=None,
                    help="sessions, each warmed up once (default 1000, quick 100)")
    ap.add_argument("--in-flight", type=int, default=64, help="concurrent Prompt calls (default 64)")
    ap.add_argument("--repeat", type=int, default=1, help="rounds, interleaved; each row is its best round")
    ap.add_argument("--affinity", action="store_true",
                    help="also run 2 and 3 nodes with each session's calls on one node (no forwarding)")
    ap.add_argument("--dsn", default=None, help="an existing PostgreSQL server (default: start one)")
    ap.add_argument("--json", metavar="FILE", help="write every figure here")
    ap.add_argument("--dir", default=None, help="parent directory for the temporary directory")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", default=None, metavar="LIST",
                    help="these configurations only, e.g. 1xsqlite,1xpostgres (default: all)")
    ap.add_argument("--baseline", default=None, metavar="DIR",
                    help="also run each configuration with the sidecar code of the checkout DIR")
    ap.add_argument("--count", action="store_true",
                    help="also count statements and writer round trips per turn (PostgreSQL rows)")
    return ap


def _configs(ap: argparse.ArgumentParser, args: argparse.Namespace) -> list[tuple]:
    """The configurations to run, each (backend, nodes, affinity, baseline)."""
    if args.in_flight > args.sessions:
        ap.error("--in-flight must not exceed --sessions (each in-flight turn needs an idle session)")
    configs = CONFIGS + ([("postgres", 2, True), ("postgres", 3, True)] if args.affinity else [])
    if args.only:
        wanted = {w.strip().replace(" ", "") for w in args.only.split(",")}
        configs = [c for c in configs if f"{c[1]}x{c[0]}{'affinity' if c[2] else ''}" in wanted]
        if not configs:
            ap.error(f"--only {args.only}: no such configuration")
    if args.baseline and not (Path(args.baseline) / "server" / "agent_sidecar").is_dir():
        ap.error(f"--baseline {args.baseline}: no server/agent_sidecar there")
    return [(*c, base) for c in configs for base in ((False, True) if args.baseline else (False,))]


def _rounds(root: Path, configs: list[tuple], args: argparse.Namespace) -> tuple[list[dict], list[dict], int | None]:
    """Every configuration, ``repeat`` rounds, on one PostgreSQL; then the
    counted windows. Returns (every round, counted, PostgreSQL's pid or None)."""
    pg, every, pg_root = Postgres(root, args.dsn, _pgcount.PRELOAD if args.count else ""), [], None
    counted: list[dict] = []
    try:
        pg.start()
        pg_root = pg.postmaster_pid()
        for rnd in range(args.repeat):
            # with --baseline, this code and the baseline's take turns going first
            for cfg in (configs if rnd % 2 == 0 else _swap_pairs(configs) if args.baseline else configs):
                every.append(r := run_config(root, pg, pg_root, cfg, rnd, args))
                print(f"  … round {rnd + 1}: {r['config']}: {r['rate']:,.0f} turns/s, p50 {r['p50_ms']:.1f} ms, "
                      f"p99 {r['p99_ms']:.1f} ms, errors {r['errors']}", file=sys.stderr)
        for cfg in configs if args.count else []:
            if cfg[0] == "postgres":
                counted.append(run_config(root, pg, pg_root, cfg, 0, args, count=True))
    finally:
        pg.stop()
    return every, counted, pg_root


def main() -> int:
    ap = _parser()
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    args.turns = args.turns or (200 if args.quick else 3000)
    args.sessions = args.sessions or (100 if args.quick else 1000)
    configs = _configs(ap, args)
    load0 = load_average()
    print(f"cluster_bench · {machine_line()} · load avg {load0}" + (" · QUICK" if args.quick else ""))
    print(f"{args.sessions:,} sessions · warm-up one turn each · {args.turns:,} timed turns · "
          f"{args.in_flight} in flight · each call to the next node (round-robin) · "
          f"best of {args.repeat} round(s)")
    print(f"NOTE: on this {os.cpu_count()}-core machine this measures overhead, not scale.")
    root = Path(tempfile.mkdtemp(prefix="cluster-bench-", dir=args.dir))
    try:
        every, counted, pg_root = _rounds(root, configs, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    best = [max((r for r in every if r["config"] == c), key=lambda r: r["rate"])
            for c in dict.fromkeys(r["config"] for r in every)]
    print("\n" + "\n".join(report(best, every)))
    if counted:
        print("\nStatements and round trips per turn (a separate traced window of each PostgreSQL "
              "configuration):\n" + "\n".join(_pgcount.report(counted)))
    print(f"load avg at start {load0}, at the end {load_average()}"
          + ("" if pg_root else " · PostgreSQL's CPU unknown (not a local process)"))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "options": {k: v for k, v in vars(args).items() if k not in ("client", "dsn")},
            "load_avg": [load0, load_average()], "cores": os.cpu_count(), "best": best, "rounds": every,
            "counted": counted},
            indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

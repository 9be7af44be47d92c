#!/usr/bin/env python3
"""Store benchmark: durable appends per second through the sidecar's store API,
next to the one-row-per-commit pattern most session stores use, plus transcript
load times.

    .venv/bin/python benchmarks/store_bench.py            # full run (~1 minute)
    .venv/bin/python benchmarks/store_bench.py --quick    # smoke run (seconds)

What runs (each point on a fresh database in a temporary directory, WAL,
synchronous=FULL everywhere — equal durability, checked and printed):

* **store API** — N asyncio tasks (N sessions) on uvloop, each appending one
  message per ``await store.write(tx.append_messages, sid, [Message(...)])``
  (the path ``AppendMessages`` takes: appends made in one loop iteration share one
  writer job, and every job in the writer's queue shares one commit)
  in a loop. A task counts an append only after the write is answered, i.e. after
  its group commit is durable. Each append is the real transcript job (seq lookup,
  INSERT, two UPDATEs, its savepoint); the sidecar's full-text indexer runs
  alongside (every second, in batches), so its cost is in the figure too.
* **baseline** — stdlib ``sqlite3``, one row per transaction (INSERT + COMMIT),
  N threads, in two shapes; the better of the two is the baseline in the ratio:
    - ``serialised``: one shared connection, a lock around INSERT+COMMIT;
    - ``conn/thread``: each thread its own connection (busy_timeout 10 s), SQLite's
      own locking arbitrates.
  The baseline row is lighter than the store's (no FTS, no counters): that favours
  the baseline.
* **transcript load** — the SQLite backend's transcript read on one connection for a
  session holding 100, 1,000 and 10,000 messages (warm page cache; median of
  several runs).

Goal (issue 2): at 100 concurrent sessions, at least 30x the baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time

import _common  # noqa: F401  (sets sys.path)
from _common import goal_line, load_average, machine_cpu, machine_line, percentile, proc_cpu_seconds, table

from agent_sidecar.recovery import housekeeping
from agent_sidecar.sessions import lifecycle as life
from agent_sidecar.sessions import transcripts as tx
from agent_sidecar.sessions.source import SessionSource
from agent_sidecar.store import open_store
from agent_sidecar.store.sqlite import reads
from agent_sidecar.store.sqlite.connection import open_reader

GOAL = 30.0
TEXT = "hello from a benchmark session"


# -- the store API ------------------------------------------------------------------

async def _store_point(path: str, n: int, seconds: float) -> dict:
    store = open_store(path=path, synchronous="FULL")
    await store.start()
    try:
        conn = open_reader(path)
        sync = conn.execute("PRAGMA synchronous").fetchone()[0]
        conn.close()
        sids = []
        for i in range(n):
            src = SessionSource(platform="bench", chat_id=f"c{i}", user_id=f"u{i}")
            entry, _ = await store.write(life.get_or_create, f"agent:main:bench:dm:c{i}", src, "main")
            sids.append(entry.session_id)
        writer = store.writer
        stop = False
        measuring = False
        counts = [0] * n
        lat: list[float] = []

        async def appender(idx: int, sid: str) -> None:
            msgs = [tx.Message(role="user", content=TEXT)]
            pc = time.perf_counter
            while not stop:
                t0 = pc()
                await store.write(tx.append_messages, sid, msgs)  # AppendMessages' path
                if measuring:
                    counts[idx] += 1
                    lat.append(pc() - t0)

        tasks = [asyncio.create_task(appender(i, s)) for i, s in enumerate(sids)]
        # The sidecar's own full-text indexer (every second), so its cost counts.
        indexer = asyncio.create_task(housekeeping.index_messages(store))
        await asyncio.sleep(min(0.3, seconds / 3))  # warm up: caches, WAL file growth
        c0 = writer.commits
        own0, busy0 = _own_cpu(store), machine_cpu()[0]
        measuring = True
        t0 = time.perf_counter()
        await asyncio.sleep(seconds)
        measuring = False
        elapsed = time.perf_counter() - t0
        own1, busy1 = _own_cpu(store), machine_cpu()[0]
        c1 = writer.commits
        stop = True
        await asyncio.gather(*tasks)
        indexer.cancel()
        total = sum(counts)
        lat.sort()
        return {"n": n, "appends": total, "rate": total / elapsed,
                "per_commit": total / max(1, c1 - c0), "commits_s": (c1 - c0) / elapsed,
                "p50_ms": percentile(lat, 50) * 1e3, "p99_ms": percentile(lat, 99) * 1e3,
                "synchronous": sync, "own_cpu": (own1 - own0) / elapsed,
                "others": max(0.0, (busy1 - busy0) - (own1 - own0)) / elapsed}
    finally:
        await store.close()


def _own_cpu(store) -> float:
    """This process's CPU seconds plus the store's writer process's."""
    return time.process_time() + proc_cpu_seconds(store.writer.pid)


# -- the stdlib sqlite3 baseline -----------------------------------------------------

_BASE_SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY, session_id TEXT NOT NULL, seq INTEGER NOT NULL,
    role TEXT NOT NULL, content TEXT NOT NULL, created_at REAL NOT NULL,
    UNIQUE (session_id, seq));
"""
_BASE_INSERT = "INSERT INTO messages (session_id, seq, role, content, created_at) VALUES (?, ?, 'user', ?, ?)"


def _base_connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=10.0, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    return conn


def _baseline_point(path: str, n: int, seconds: float, shape: str) -> dict:
    setup = _base_connect(path)
    setup.executescript(_BASE_SCHEMA)
    setup.commit()
    mode = setup.execute("PRAGMA journal_mode").fetchone()[0]
    shared = setup if shape == "serialised" else None
    lock = threading.Lock()
    counts = [0] * n
    errors: list[BaseException] = []
    state = {"stop": False, "measuring": False}
    ready = threading.Barrier(n + 1)

    def run(idx: int) -> None:
        conn = shared or _base_connect(path)
        sync = conn.execute("PRAGMA synchronous").fetchone()[0]
        assert sync == 2, "baseline must run with synchronous=FULL"
        sid = f"s{idx}"
        seq = 0
        ready.wait()
        try:
            while not state["stop"]:
                seq += 1
                if shared is not None:
                    with lock:
                        conn.execute(_BASE_INSERT, (sid, seq, TEXT, time.time()))
                        conn.commit()
                else:
                    conn.execute(_BASE_INSERT, (sid, seq, TEXT, time.time()))
                    conn.commit()
                if state["measuring"]:
                    counts[idx] += 1
        except BaseException as e:  # "database is locked" would show up here
            errors.append(e)
        finally:
            if shared is None:
                conn.close()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    ready.wait()
    time.sleep(min(0.3, seconds / 3))
    own0, busy0 = time.process_time(), machine_cpu()[0]
    state["measuring"] = True
    t0 = time.perf_counter()
    time.sleep(seconds)
    state["measuring"] = False
    elapsed = time.perf_counter() - t0
    own1, busy1 = time.process_time(), machine_cpu()[0]
    state["stop"] = True
    for t in threads:
        t.join()
    setup.close()
    return {"n": n, "shape": shape, "rate": sum(counts) / elapsed, "errors": len(errors),
            "journal_mode": mode, "synchronous": 2,
            "others": max(0.0, (busy1 - busy0) - (own1 - own0)) / elapsed}


# -- transcript loads ------------------------------------------------------------------

def _ceiling_point(path: str, seconds: float, per_commit: int = 100) -> dict:
    """What SQLite itself does on this schema: one thread, ``per_commit`` rows per
    transaction through a bare executemany plus their full-text rows (FULL sync), no
    event loop, no per-caller work. No store API can beat this; it tells how far
    the 30x goal is from the floor of the machine."""
    import apsw

    from agent_sidecar.store.sqlite.connection import open_writer
    from agent_sidecar.store.sqlite.messages import _INSERT, SqliteMessages
    from agent_sidecar.store.sqlite.schema import migrate

    conn = open_writer(path, "FULL")
    migrate(conn)
    with conn:
        conn.execute("INSERT INTO incarnations (session_id, session_key, created_at) VALUES ('s', 'k', 0)")
    seq, total = 1, 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        rows = [("s", seq + i, "user", TEXT, None, time.time(), None) for i in range(per_commit)]
        with conn:
            conn.executemany(_INSERT, rows)
            SqliteMessages(conn).index_pending()
        seq += per_commit
        total += per_commit
    rate = total / (time.perf_counter() - t0)
    conn.close()
    return {"rate": rate, "per_commit": per_commit, "apsw": apsw.sqlite_lib_version()}


async def _load_points(path: str, sizes: list[int], min_runs: int, budget_s: float) -> list[dict]:
    store = open_store(path=path, synchronous="FULL")
    await store.start()
    reader = open_reader(path)
    out = []
    try:
        for size in sizes:
            src = SessionSource(platform="bench", chat_id=f"load{size}", user_id="u")
            entry, _ = await store.write(life.get_or_create, f"agent:main:bench:dm:load{size}", src, "main")
            sid = entry.session_id
            for start in range(0, size, 500):
                batch = [tx.Message(role="user" if (start + k) % 2 == 0 else "assistant",
                                    content=f"message {start + k}: {TEXT}, and a few more words")
                         for k in range(min(500, size - start))]
                await store.write(tx.append, sid, batch)
            got = reads.transcript(reader, sid, False, 0, None)
            assert len(got) == size, (len(got), size)
            times = []
            deadline = time.perf_counter() + budget_s
            while len(times) < min_runs or (time.perf_counter() < deadline and len(times) < 200):
                t0 = time.perf_counter()
                with reader:
                    reads.transcript(reader, sid, False, 0, None)
                times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await store.transcript(sid)
            async_ms = (time.perf_counter() - t0) * 1e3
            med = statistics.median(times)
            out.append({"size": size, "median_ms": med * 1e3, "best_ms": min(times) * 1e3,
                        "us_per_msg": med * 1e6 / size, "runs": len(times), "async_ms": async_ms})
    finally:
        reader.close()
        await store.close()
    return out


# -- main ------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: short windows, small loads")
    ap.add_argument("--seconds", type=float, default=None, help="measuring window per point (default 3, quick 0.4)")
    ap.add_argument("--repeat", type=int, default=None,
                    help="rounds; each cell reports its best round (default 2, quick 1)")
    ap.add_argument("--concurrency", default="1,10,100", help="comma-separated session counts")
    ap.add_argument("--loads", default=None, help="transcript sizes (default 100,1000,10000; quick 100,1000)")
    ap.add_argument("--dir", default=None, help="parent directory for the temporary databases")
    return ap


def _append_rounds(base_dir: str, levels: list[int], seconds: float, repeat: int) -> dict[tuple, list[dict]]:
    """Every level, ``repeat`` times: the store, then both sqlite3 baselines."""
    import uvloop

    runs: dict[tuple, list[dict]] = {}
    for rnd in range(repeat):
        for n in levels:
            tag = f"{n}-{rnd}"
            runs.setdefault(("store", n), []).append(
                uvloop.run(_store_point(os.path.join(base_dir, f"store{tag}.db"), n, seconds)))
            for shape, fname in (("serialised", "ser"), ("conn/thread", "cpt")):
                runs.setdefault((shape, n), []).append(
                    _baseline_point(os.path.join(base_dir, f"{fname}{tag}.db"), n, seconds, shape))
            print(f"  … round {rnd + 1}, {n} sessions: store {runs[('store', n)][-1]['rate']:,.0f}/s, "
                  f"serialised {runs[('serialised', n)][-1]['rate']:,.0f}/s, "
                  f"conn/thread {runs[('conn/thread', n)][-1]['rate']:,.0f}/s", file=sys.stderr)
    return runs


def _print_appends(runs: dict[tuple, list[dict]], levels: list[int], repeat: int) -> dict[int, tuple]:
    """The appends table (each cell its best round); returns (store, baseline) per level."""
    def best(kind, n):
        return max(runs[(kind, n)], key=lambda r: r["rate"])

    rows = []
    summary = {}
    for n in levels:
        s, b1, b2 = best("store", n), best("serialised", n), best("conn/thread", n)
        base = max((b1, b2), key=lambda b: b["rate"])
        summary[n] = (s, base)
        errs = sum(r["errors"] for r in runs[("conn/thread", n)])
        others = max(r["others"] for k in ("store", "serialised", "conn/thread") for r in runs[(k, n)])
        rows.append([n, s["rate"], s["per_commit"], s["p50_ms"], s["p99_ms"], b1["rate"],
                     b2["rate"] if not errs else f"{b2['rate']:,.0f} ({errs} err)",
                     base["shape"], s["rate"] / base["rate"], f"{100 * others:.0f}%"])
    print()
    print(table(["sessions", "store appends/s", "rows/commit", "p50 ms", "p99 ms",
                 "sqlite3 serialised/s", "sqlite3 conn/thread/s", "baseline =", "ratio",
                 "others' CPU (max)"], rows,
                title="Durable appends (WAL, synchronous=FULL on both sides; one message per append)"))
    first = runs[("store", levels[0])][0]
    print(f"equal durability: store synchronous={first['synchronous']} (2 = FULL), baseline "
          f"journal_mode={runs[('serialised', levels[0])][0]['journal_mode']} synchronous=2 (FULL). "
          f"'others' CPU' = what other programs used meanwhile (100% = one core).")
    if repeat > 1:
        print("all rounds (appends/s): " + "; ".join(
            f"{k} @{n}: " + "/".join(f"{r['rate']:,.0f}" for r in v) for (k, n), v in runs.items()))
    return summary


def _print_loads(base_dir: str, loads: list[int], quick: bool) -> None:
    import uvloop

    loaded = uvloop.run(_load_points(os.path.join(base_dir, "load.db"), loads,
                                     min_runs=3 if quick else 7, budget_s=0.3 if quick else 2.0))
    print()
    print(table(["messages", "median ms", "best ms", "µs/message", "runs", "store.transcript ms (1 run)"],
                [[r["size"], r["median_ms"], r["best_ms"], r["us_per_msg"], r["runs"], r["async_ms"]]
                 for r in loaded],
                title="Transcript load: one read transaction on a reader connection (warm cache)"))


def _print_ceiling(base_dir: str, summary: dict[int, tuple], levels: list[int], seconds: float) -> None:
    print()
    n = 100 if 100 in summary else levels[-1]
    s, base = summary[n]
    ceiling = _ceiling_point(os.path.join(base_dir, "ceiling.db"), seconds)
    print(f"SQLite ceiling on this schema (one thread, {ceiling['per_commit']} rows per commit, bare "
          f"executemany with its full-text rows, FULL; SQLite {ceiling['apsw']}): {ceiling['rate']:,.0f} rows/s = "
          f"{ceiling['rate'] / base['rate']:.1f}x the baseline; the store at {n} sessions reaches "
          f"{s['rate'] / ceiling['rate']:.0%} of it")
    print(goal_line(f"store at {n} sessions vs one-row-per-commit baseline ({base['shape']}, "
                    f"{base['rate']:,.0f}/s)", s["rate"] / base["rate"], GOAL))


def main() -> int:
    args = _parser().parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    seconds = args.seconds or (0.4 if args.quick else 3.0)
    repeat = args.repeat or (1 if args.quick else 2)
    levels = [int(x) for x in args.concurrency.split(",")]
    loads = [int(x) for x in (args.loads or ("100,1000" if args.quick else "100,1000,10000")).split(",")]
    print(f"store_bench · {machine_line()} · load avg {load_average()}")
    print(f"window {seconds:g}s per point · best of {repeat} round(s)" + (" · QUICK" if args.quick else ""))
    base_dir = tempfile.mkdtemp(prefix="store-bench-", dir=args.dir)
    try:
        runs = _append_rounds(base_dir, levels, seconds, repeat)
        summary = _print_appends(runs, levels, repeat)
        _print_loads(base_dir, loads, args.quick)
        _print_ceiling(base_dir, summary, levels, seconds)
    finally:
        shutil.rmtree(base_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Turn jobs benchmark: the store jobs of one echo turn, run in this process
on a real SQLite file the way the writer process runs them, without the pipe,
the event loop or an fsync (``synchronous=OFF``). What it prices is the
writer's own work per turn: the rules in turns/jobs.py and turns/flush.py,
the repositories of store/sqlite/, and the SQL they run.

    .venv/bin/python benchmarks/turn_jobs_bench.py            # 20,000 turns
    .venv/bin/python benchmarks/turn_jobs_bench.py --turns 5000

Per turn, as the sidecar writes an echo turn on an idle lane: the ``accept``
job with its start (ledger row, user message, lane running, the accepted and
started frames), then one frame flush (``run_flush``) with the text_delta,
usage and completed frames, the usage accounting, the assistant message and
the turn's ``finish``. Accepts commit in groups of ``--group`` (as group
commit gathers them), each group's flush in one transaction after them.
Sessions (``--sessions``) are created up front and taken in turn.

Printed: µs per turn for the accepts and for the flushes, and the share of it
spent inside SQLite statements (apsw's execute and executemany, timed by
wrapping the connection's methods in a second pass).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))

import orjson  # noqa: E402

from agent_sidecar.sessions import lifecycle as life  # noqa: E402
from agent_sidecar.sessions.source import SessionSource  # noqa: E402
from agent_sidecar.store.records import Append, Message  # noqa: E402
from agent_sidecar.store.sqlite.connection import open_writer  # noqa: E402
from agent_sidecar.store.sqlite.schema import migrate  # noqa: E402
from agent_sidecar.store.sqlite.uow import SqliteUnitOfWork  # noqa: E402
from agent_sidecar.turns import jobs  # noqa: E402
from agent_sidecar.turns.flush import FN, MSG, run_flush  # noqa: E402

PAYLOAD = {"profile": "main", "source": None, "attachments": []}
USAGE = {"input_tokens": 1, "output_tokens": 1}


class Bench:
    def __init__(self, path: str, sessions: int):
        self.conn = open_writer(path, one_thread=True)  # as the writer process opens it
        migrate(self.conn)
        self.conn.execute("PRAGMA synchronous=OFF")
        self.uow = SqliteUnitOfWork(self.conn)
        self.lanes: list[tuple[str, str]] = []
        with self.conn:
            for i in range(sessions):
                src = SessionSource(platform="telegram", chat_id=str(i), user_id=str(i), chat_type="dm")
                entry, _ = life.get_or_create(self.uow, f"agent:main:telegram:dm:{i}", src, "main")
                self.lanes.append((entry.session_key, entry.session_id))
        self.flushes = 0
        self.accept_s = self.flush_s = 0.0

    def group(self, first: int, n: int) -> None:
        """Turns first … first + n - 1: their accepts, then their flush."""
        lanes = [(f"bench-{i}", *self.lanes[i % len(self.lanes)]) for i in range(first, first + n)]
        t0 = time.perf_counter()
        with self.conn:
            for rid, key, _ in lanes:
                prompt = jobs.PromptRecord(rid, key, "telegram", "main", 3, "hello", dict(PAYLOAD), time.time())
                jobs.accept(self.uow, jobs.AcceptRequest(prompt, None, 300.0, None, 0, True))
        t1 = time.perf_counter()
        rows: list[tuple] = []
        writes: list[tuple] = []
        now = time.time()
        for rid, key, sid in lanes:
            rows += [(rid, 3, key, sid, "telegram", now, "text_delta", orjson.dumps({"text": "hello"})),
                     (rid, 4, key, sid, "telegram", now, "usage", orjson.dumps(USAGE)),
                     (rid, 5, key, sid, "telegram", now, "completed", orjson.dumps({"final_text": "hello"}))]
            state = {"request_id": rid, "status": "completed", "reason": "", "usage": USAGE,
                     "final_text": "hello"}
            writes += [(FN, (jobs.record_usage, (key, USAGE))),
                       (MSG, Append(sid, (Message("assistant", "hello", created_at=now),), rid,
                                    touch_lane=False)),
                       (FN, (jobs.finish, (jobs.TurnEnd(rid, key, sid, "completed", "", 5, False, True,
                                                        state),)))]
        with self.conn:
            self.flushes += 1
            run_flush(self.uow, (self.flushes, self.flushes - 1), rows, writes)
        self.accept_s += t1 - t0
        self.flush_s += time.perf_counter() - t1

    def run(self, first: int, turns: int, group: int) -> None:
        for start in range(first, first + turns, group):
            self.group(start, min(group, first + turns - start))


def sql_seconds(bench: Bench, first: int, turns: int, group: int) -> tuple[float, float]:
    """The same turns again, with the time inside apsw's execute and
    executemany summed (the wrapper's own cost is small beside a statement).
    Returns (seconds inside statements, seconds of that whole pass): the
    share is taken within one pass, so a noisy machine cannot push it past
    100% as a share of another pass's time could."""
    spent = [0.0]

    class Timed:
        def __init__(self, conn):
            self._conn = conn

        def __getattr__(self, name):
            attr = getattr(self._conn, name)
            if name not in ("execute", "executemany"):
                return attr

            def timed(*a, **kw):
                t = time.perf_counter()
                try:
                    return attr(*a, **kw)
                finally:
                    spent[0] += time.perf_counter() - t
            return timed

        def __enter__(self):
            return self._conn.__enter__()

        def __exit__(self, *exc):
            return self._conn.__exit__(*exc)

    real = bench.conn
    bench.uow = SqliteUnitOfWork(Timed(real))  # type: ignore[arg-type]  # quacks as apsw.Connection
    bench.accept_s = bench.flush_s = 0.0
    bench.run(first, turns, group)
    bench.uow = SqliteUnitOfWork(real)
    return spent[0], bench.accept_s + bench.flush_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=20_000)
    ap.add_argument("--sessions", type=int, default=1_000)
    ap.add_argument("--group", type=int, default=64, help="turns per commit group")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="turn-jobs-bench-") as d:
        bench = Bench(os.path.join(d, "sidecar.db"), args.sessions)
        bench.run(0, 2_000, args.group)  # warm: every lane's pages, the statement cache
        bench.accept_s = bench.flush_s = 0.0
        bench.run(2_000, args.turns, args.group)
        accept = bench.accept_s / args.turns * 1e6
        flush = bench.flush_s / args.turns * 1e6
        sql_s, timed_s = sql_seconds(bench, 2_000 + args.turns, args.turns, args.group)
    total = accept + flush
    sql = total * sql_s / timed_s  # the timed pass's share, of the untimed pass's time
    print(f"turn jobs, {args.turns:,} echo turns over {args.sessions:,} sessions, {args.group} per group"
          " (SQLite, synchronous=OFF, in process):")
    print(f"  accept + start  {accept:7.1f} µs/turn")
    print(f"  frame flush     {flush:7.1f} µs/turn")
    print(f"  total           {total:7.1f} µs/turn, of which inside SQLite statements ~{sql:.1f}"
          f" ({100 * sql_s / timed_s:.0f}%)")


if __name__ == "__main__":
    main()

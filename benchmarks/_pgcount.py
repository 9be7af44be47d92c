"""Counting what a turn costs PostgreSQL (cluster_bench.py ``--count``):

* the statements each store writer sends, counted in the writer itself
  (_pgcount_site/sitecustomize.py wraps psycopg's cursor), by first word;
* the statements the server ran, by text, from ``pg_stat_statements`` (the
  scratch server loads it); it does not see a utility statement once psycopg
  prepared it (BEGIN, SAVEPOINT, ... after a few uses), hence the first count;
* the round trips of each writer, from ``strace`` on its backend process: a
  round trip is an answer the server sent (``sendto``: it flushes its output
  once per statement outside pipeline mode, once per sync or fetch in it).
  A statement whose result the writer does not wait for (pipeline mode) costs
  a statement but no round trip.

strace slows the traced backend: a counting run's times are not the benchmark's.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

PRELOAD = "-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track_utility=on"
SITE = Path(__file__).resolve().parent / "_pgcount_site"


def environ(root: Path) -> dict[str, str]:
    """What a counting run's sidecars need in their environment."""
    out = root / "pgcount"
    out.mkdir(exist_ok=True)
    return {"BENCH_PG_COUNT": str(out),
            "PYTHONPATH": os.pathsep.join([str(SITE), os.environ.get("PYTHONPATH", "")])}


def _socket_ports(pid: int) -> set[int]:
    """Local TCP ports of the sockets process ``pid`` holds open."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[9] in inodes:
                ports.add(int(f[1].rsplit(":", 1)[1], 16))
    return ports


class Counter:
    """``start(dsn, writer_pids)`` before the window, ``stop()`` after: the
    database's statements (by text) and the writers' backends' round trips."""

    def __init__(self, root: Path, tag: str):
        self.root, self.tag = root, tag
        self.traces: list[tuple[subprocess.Popen, Path]] = []
        self.dsn, self.writers = "", []

    def start(self, dsn: str, writer_pids: list[int]) -> None:
        import psycopg
        self.dsn, self.writers = dsn, writer_pids
        for pid in writer_pids:
            os.kill(pid, signal.SIGUSR1)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            ports = set().union(*(_socket_ports(p) for p in writer_pids))
            backends = [r[0] for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE client_port = ANY(%s)", (list(ports),))]
            conn.execute("SELECT pg_stat_statements_reset()")
        if len(backends) != len(writer_pids):
            raise RuntimeError(f"writer backends: found {backends} for writers {writer_pids}")
        for i, pid in enumerate(backends):
            out = self.root / f"{self.tag}-strace-{i}.txt"
            self.traces.append((subprocess.Popen(
                ["strace", "-c", "-e", "trace=epoll_wait,recvfrom,sendto", "-o", str(out), "-p", str(pid)],
                stderr=subprocess.DEVNULL), out))

    def stop(self) -> dict:
        import psycopg
        sent: dict[str, int] = {}
        for pid in self.writers:
            out = self.root / "pgcount" / f"{pid}.json"
            out.unlink(missing_ok=True)
            os.kill(pid, signal.SIGUSR2)
            deadline = time.monotonic() + 10
            while not out.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.1)  # written whole
            for word, n in json.loads(out.read_text()).items():
                sent[word] = sent.get(word, 0) + n
        syscalls: dict[str, int] = {}
        for proc, out in self.traces:
            proc.send_signal(signal.SIGINT)
            proc.wait(30)
            for line in out.read_text().splitlines():
                m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$", line)
                if m:
                    syscalls[m.group(2)] = syscalls.get(m.group(2), 0) + int(m.group(1))
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT calls, total_exec_time, query FROM pg_stat_statements WHERE dbid = (SELECT oid"
                " FROM pg_database WHERE datname = current_database()) ORDER BY calls DESC").fetchall()
        return {"syscalls": syscalls, "statements": [[int(c), q, float(ms)] for c, ms, q in rows], "sent": sent}


def report(rows: list[dict], top: int = 40) -> list[str]:
    """Per counted configuration: statements and writer round trips per turn,
    then its most frequent statements (calls per turn)."""
    out = []
    for r in rows:
        c, turns = r["count"], max(1, r["turns"])
        total = sum(s[0] for s in c["statements"])
        sent = sum(c["sent"].values())
        words = " ".join(f"{w} {n / turns:.2f}" for w, n in sorted(c["sent"].items(), key=lambda x: -x[1]))
        out.append(f"{r['config']}: the writers sent {sent / turns:.1f} statements per turn ({words}); "
                   f"{c['syscalls'].get('sendto', 0) / turns:.1f} writer round trips per turn "
                   f"(answers its backend sent; {c['syscalls'].get('epoll_wait', 0) / turns:.1f} times it "
                   f"waited idle); pg_stat_statements: {total / turns:.1f} per turn "
                   "(no utility statement once prepared), the most frequent (per turn, and "
                   "each one's mean execution time):")
        for n, q, ms in c["statements"][:top]:
            if n / turns >= 0.01:
                out.append(f"  {n / turns:6.2f} {1e3 * ms / max(1, n):6.0f} us  {' '.join(q.split())[:140]}")
    return out

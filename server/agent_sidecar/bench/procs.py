"""CPU and memory per process from /proc (Linux): a server's process tree,
its CPU over a window and its memory (which processes hold its sockets:
sockets.py).

Why from /proc and not from the sidecar: the bench must work against any
sidecar, of any version, without an API for it; and the same accounting
prices the bare server, which has no API at all. Everything here degrades to
"unknown" (0, None, empty) when /proc is missing or a process belongs to
another user, so a remote or foreign sidecar simply gets no CPU figures.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def read_proc(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return None


def exists(pid: int) -> bool:
    """Whether /proc shows process ``pid`` (False without /proc)."""
    return read_proc(f"/proc/{pid}/stat") is not None


def proc_cpu_seconds(pid: int, tid: int | None = None) -> float:
    """user+system CPU seconds of one process (threads included), or of one of
    its threads when ``tid`` is given; 0 if gone."""
    seconds = read_cpu_seconds(pid, tid)
    return 0.0 if seconds is None else seconds


def read_cpu_seconds(pid: int, tid: int | None = None) -> float | None:
    """Like proc_cpu_seconds, None when the process (or thread) is gone."""
    data = read_proc(f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat")
    if not data:
        return None
    fields = data[data.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def tree_cpu_seconds(root: int) -> float:
    """user+system CPU seconds of a process tree now, children that exited
    included (a reaped child's time is in its parent's cutime/cstime): a
    database server's backends come and go during a window."""
    total = 0.0
    for _, pid in process_tree(root):
        data = read_proc(f"/proc/{pid}/stat")
        if data:
            total += sum(int(x) for x in data[data.rindex(")") + 2:].split()[11:15]) / CLK_TCK
    return total


def parent_pid(pid: int) -> int | None:
    data = read_proc(f"/proc/{pid}/stat")
    if not data:
        return None
    return int(data[data.rindex(")") + 2:].split()[1])


def children_of(pid: int) -> list[int]:
    """Direct children of a process (via /proc/<pid>/task/*/children)."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        data = read_proc(f"/proc/{pid}/task/{tid}/children")
        if data:
            out.extend(int(x) for x in data.split())
    return out


def proc_comm(pid: int) -> str:
    """A process's own name (``/proc/<pid>/comm``), which it may set itself."""
    data = read_proc(f"/proc/{pid}/comm")
    return data.strip() if data is not None else "?"


def proc_name(pid: int) -> str:
    """The command line, spaces for NULs ("?" when unreadable)."""
    data = read_proc(f"/proc/{pid}/cmdline")
    return data.replace("\0", " ").strip() if data is not None else "?"


def rss_bytes(pid: int) -> int | None:
    """Resident set size now, from /proc/<pid>/statm; None if unreadable."""
    data = read_proc(f"/proc/{pid}/statm")
    return int(data.split()[1]) * PAGE if data else None


def pss_bytes(pid: int) -> int | None:
    """Proportional set size (shared pages split among their users), from
    /proc/<pid>/smaps_rollup; None if unreadable."""
    data = read_proc(f"/proc/{pid}/smaps_rollup")
    if not data:
        return None
    for line in data.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return None


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine, all cores, from /proc/stat."""
    data = read_proc("/proc/stat")
    if not data:
        return 0.0, 0.0
    vals = [int(x) for x in data.splitlines()[0].split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
    total = sum(vals[:8])  # guest time is already counted in user
    return (total - idle) / CLK_TCK, total / CLK_TCK


class CpuWindow:
    """CPU seconds used by labelled groups of processes over a window, plus what
    the rest of the machine used meanwhile (other programs steal our cores too).

    A process that exits during the window reads nothing at its end: it
    counts what it had used when last seen (``last_seen``, pid -> CPU seconds,
    which the caller's samples fill in), else nothing; never less than
    nothing (each item's delta is at least 0)."""

    def __init__(self, groups: dict[str, list], last_seen: dict[int, float] | None = None):
        """``groups``: label -> pids; a (pid, tid) pair counts one thread, a
        ("rest", pid, tid) triple the process minus that thread, and a
        ("tree", pid) pair the whole process tree (``tree_cpu_seconds``)."""
        self.groups = groups
        self.last_seen = last_seen if last_seen is not None else {}

    def _cpu(self, item) -> float:
        if isinstance(item, tuple) and item[0] == "tree":
            return tree_cpu_seconds(item[1])
        if isinstance(item, tuple) and item[0] == "rest":
            return proc_cpu_seconds(item[1]) - proc_cpu_seconds(item[1], item[2])
        if isinstance(item, tuple):
            return proc_cpu_seconds(item[0], item[1])
        seconds = read_cpu_seconds(item)
        return self.last_seen.get(item, 0.0) if seconds is None else seconds

    def _snap(self):
        return ({g: [self._cpu(p) for p in pids] for g, pids in self.groups.items()}, machine_cpu())

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._s0 = self._snap()

    def stop(self) -> dict:
        wall = time.monotonic() - self._t0
        s1 = self._snap()
        per = {g: sum(max(0.0, b - a) for a, b in zip(self._s0[0][g], s1[0][g])) for g in self.groups}
        busy = s1[1][0] - self._s0[1][0]
        ours = sum(per.values())
        return {"wall": wall, "groups": per, "machine_busy": busy,
                "others": max(0.0, busy - ours), "cores": os.cpu_count() or 1}


# -- a server's process tree ------------------------------------------------------------

def process_tree(root: int, name: str = "sidecar") -> list[tuple[str, int]]:
    """``(label, pid)`` for a server and its descendants. Children that name
    themselves (the sidecar's ``sidecar-writer``, ``sidecar-work-N``) keep
    their names; multiprocessing's resource tracker is recognised by its
    command line; anything else is ``child-<pid>``."""
    out = [(name, root)]
    stack = list(children_of(root))
    while stack:
        pid = stack.pop(0)
        comm = proc_comm(pid)
        if comm.startswith("sidecar-"):
            label = comm
        elif "resource_tracker" in proc_name(pid):
            label = "resource-tracker"
        else:
            label = f"child-{pid}"
        out.append((label, pid))
        stack.extend(children_of(pid))
    return out


def memory_snapshot(tree: list[tuple[str, int]]) -> list[dict]:
    """RSS and PSS (MB) of every process of a tree, now."""
    rows = []
    for label, pid in tree:
        rss, pss = rss_bytes(pid), pss_bytes(pid)
        rows.append({"name": label, "pid": pid,
                     "rss_mb": None if rss is None else rss / 2**20,
                     "pss_mb": None if pss is None else pss / 2**20})
    return rows


class TreeWindow:
    """CPU of every process of a server's tree (the root split into its
    main thread, the event loop, and its other threads), of the bench's own
    processes (this one, and the client processes of ``--clients``: their
    sum, and the busiest one's) and of everything else, over one window; RSS
    sampled by ``sample()`` during it and reported as the peak and the last
    value.

    A process of the tree that exits during the window (a worker killed, say)
    counts the CPU it had used when last sampled, never a negative delta, and
    is marked ``exited``; the tree is read again at the end, and a process
    that was not in it at the start (the worker's replacement) counts all the
    CPU it has used (it began during the window), marked ``new``.

    ``peers`` (sockets.peers_of, given where to look: None, everywhere)
    finds the local processes serving the tree's own connections (a
    sidecar's PostgreSQL backends), counted apart (``peers``,
    ``peers_cpu_s``), neither the server's nor "others". They are looked for
    everywhere when the window is made, before its point runs (that reads
    every process's fds); when it starts and when it ends, while turns run,
    only among the children of the processes found then (a connection
    opened since is a new backend of the same server: all its CPU counts),
    so the bench's event loop is not held up while it measures."""

    def __init__(self, tree: list[tuple[str, int]], clients: list[int] | None = None,
                 peers: Callable[[Collection[int] | None], list[tuple[str, int]]] | None = None):
        self.tree = tree
        self.bench = [os.getpid(), *(clients or [])]
        root_label, root = tree[0]
        self._groups: dict[str, list] = {f"{root_label} loop thread": [(root, root)],
                                         f"{root_label} other threads": [("rest", root, root)]}
        for label, pid in tree[1:]:
            self._groups[label] = [pid]
        for i, pid in enumerate(self.bench):
            self._groups[f"bench {i}"] = [pid]
        self._find_peers = peers
        self.peers: list[tuple[str, int]] = peers(None) if peers else []
        self._servers = {ppid for _, pid in self.peers if (ppid := parent_pid(pid))}  # e.g. the postmaster
        self._seen: dict[int, float] = {}  # pid -> CPU seconds when last sampled
        self._cpu = CpuWindow(self._groups, self._seen)
        self._rss_peak: dict[int, int] = {}

    def start(self) -> None:
        self._rss_peak.clear()
        for _, pid in self.peers:
            self._groups.pop(f"peer {pid}", None)
        self.peers = self._peers_now()
        for _, pid in self.peers:
            self._groups[f"peer {pid}"] = [pid]
        self.sample()
        self._cpu.start()

    def sample(self) -> None:
        for _, pid in [*self.tree, *self.peers]:
            rss = rss_bytes(pid)
            if rss is not None and rss > self._rss_peak.get(pid, 0):
                self._rss_peak[pid] = rss
            seconds = read_cpu_seconds(pid)
            if seconds is not None:
                self._seen[pid] = seconds

    def stop(self) -> dict:
        self.sample()
        usage = self._cpu.stop()
        wall = usage["wall"] or 1e-9
        cpu = usage["groups"]
        bench = [cpu.pop(f"bench {i}") for i in range(len(self.bench))]
        procs = []
        for label, pid in self.tree:
            seconds = (cpu.get(f"{label} loop thread", 0.0) + cpu.get(f"{label} other threads", 0.0)
                       if pid == self.tree[0][1] else cpu.get(label, 0.0))
            procs.append(self._row(label, pid, seconds, wall))
            if not exists(pid):
                procs[-1]["exited"] = True
                if label in cpu:
                    cpu[f"{label} (exited)"] = cpu.pop(label)
        known = {pid for _, pid in self.tree}
        root_label, root = self.tree[0]
        for label, pid in process_tree(root, root_label) if exists(root) else ():
            if pid not in known:  # started during the window: all its CPU is the window's
                seconds = proc_cpu_seconds(pid)
                procs.append({**self._row(label, pid, seconds, wall), "new": True})
                cpu[f"{label} (new)"] = cpu.get(f"{label} (new)", 0.0) + seconds
        peers = self._peers_used(cpu, wall)
        server = sum(p["cpu_s"] for p in procs)
        return {"wall_s": usage["wall"], "processes": procs, "threads": cpu,
                "peers": peers, "peers_cpu_s": sum(p["cpu_s"] for p in peers),
                "server_cpu_s": server, "bench_cpu_s": sum(bench), "bench_busiest_cpu_s": max(bench),
                "bench_processes": len(bench),
                "others_cpu_s": usage["others"], "machine_busy_s": usage["machine_busy"],
                "cores": usage["cores"]}

    def _peers_used(self, cpu: dict[str, float], wall: float) -> list[dict]:
        """The peers' rows (their groups taken out of ``cpu``), those new since the start included."""
        rows: list[dict] = [{"name": name, "pid": pid, "cpu_s": cpu.pop(f"peer {pid}")} for name, pid in self.peers]
        known = {pid for _, pid in self.peers}
        for name, pid in self._peers_now():
            if pid not in known:  # a connection opened during the window: a backend started in it
                rows.append({"name": name, "pid": pid, "cpu_s": proc_cpu_seconds(pid), "new": True})
        for row in rows:
            row["cpu_pct"] = 100 * row["cpu_s"] / wall
        return rows

    def _peers_now(self) -> list[tuple[str, int]]:
        """The peers now, looked for among the children of the servers of those found at first."""
        if not self._find_peers or not self._servers:
            return []
        return self._find_peers([pid for server in self._servers for pid in children_of(server)])

    def _row(self, label: str, pid: int, seconds: float, wall: float) -> dict:
        rss = rss_bytes(pid)
        return {"name": label, "pid": pid, "cpu_s": seconds, "cpu_pct": 100 * seconds / wall,
                "rss_mb": None if rss is None else rss / 2**20,
                "rss_peak_mb": self._rss_peak.get(pid, 0) / 2**20 or None}

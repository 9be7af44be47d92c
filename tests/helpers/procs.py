"""A running sidecar's processes, seen the way ``ps`` sees them (/proc): its
children by the name each gives itself (``sidecar-writer``, ``sidecar-work-N``),
their state, priority, scheduling policy, and whether grpc is mapped into them."""

from __future__ import annotations

import os


def _stat(pid: int, tid: int | None = None) -> list[str]:
    """The fields of /proc/PID[/task/TID]/stat after the command name (state first)."""
    path = f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat"
    with open(path) as f:
        return f.read().rsplit(")", 1)[1].split()


def comm(pid: int, tid: int | None = None) -> str:
    with open(f"/proc/{pid}/task/{tid or pid}/comm") as f:
        return f.read().strip()


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting to be reaped)."""
    try:
        return _stat(pid)[0] != "Z"
    except OSError:
        return False


def ppid(pid: int) -> int:
    return int(_stat(pid)[1])


def niceness(pid: int) -> int:
    return int(_stat(pid)[16])


def sched_policy(pid: int, tid: int | None = None) -> int:
    return int(_stat(pid, tid)[38])


def children(sc) -> dict[str, int]:
    """The sidecar's live child processes, by name: ``{"sidecar-writer": pid,
    "sidecar-work-0": pid, …}`` (a child not yet named shows as its interpreter's name)."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            if ppid(pid) == sc.proc.pid and alive(pid):
                out[comm(pid)] = pid
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
    return out


def worker_pid(sc, index: int) -> int | None:
    """The pid of the worker in slot ``index``, None while there is none."""
    return children(sc).get(f"sidecar-work-{index}")


def mapped(pid: int, fragment: str) -> bool:
    """Whether a file whose path contains ``fragment`` is mapped into the
    process: a native module it imported (``"/_asyncio."``), a library one
    loaded (``"/libssl."``)."""
    with open(f"/proc/{pid}/maps") as f:
        return fragment in f.read()


def grpc_loaded(pid: int) -> bool:
    """Whether the process has grpc's native module mapped (so has imported grpc)."""
    return mapped(pid, "/grpc/_cython/")


def cmdline(pid: int) -> str:
    """The process's arguments as ``ps -o args`` shows them (its title, once set)."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode().strip()


def rss_bytes(pid: int) -> int:
    """The process's resident memory (VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")

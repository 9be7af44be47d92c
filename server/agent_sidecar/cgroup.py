"""What the cgroup and the scheduler let this process use: the cgroup's
directory (``memory_high_mb = "auto"`` reads its memory limit there,
turns/memory.py), and how many CPUs, the default number of workers
(``sidecar.workers = 0``).

``os.cpu_count()`` is the host's count: in a container limited to two CPUs on
a 64-core node, or under ``taskset``/systemd's ``CPUAffinity=``, it would start
64 workers (each a Python process of ~25 MB, plus its model backend) to share
two CPUs. The count here is the CPUs the scheduler lets this process run on
(its affinity), capped by the cgroup's CPU quota rounded up (cgroup v2
``cpu.max``, v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``: Docker's
``--cpus``, a Kubernetes CPU limit, systemd's ``CPUQuota=``); at least 1. A
Kubernetes CPU *request* sets no quota: set ``workers`` there.

The quota is read in the process's own cgroup and every one above it (the
smallest wins: a parent's limit binds its children), not only at the
hierarchy's root: on a cgroup v1 host a systemd service sits in
``system.slice/NAME.service`` below the root, whose quota is unlimited. A
directory this process's path names but its mount does not have (a container
that sees its own cgroup as the root) is passed over for the one above.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

ROOT = "/sys/fs/cgroup"


def cgroup_dir() -> str:
    """This process's cgroup v2 directory (``0::`` of /proc/self/cgroup), else
    the hierarchy's root."""
    path = _own_path(lambda hierarchy, controllers: hierarchy == "0" and controllers == "")
    return ROOT + path if path is not None else ROOT


def available_cpus() -> int:
    """The CPUs this process may use (affinity, then the cgroup quota), >= 1."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    if quota is not None:
        n = min(n, math.ceil(quota))
    return max(1, n)


def cgroup_cpu_quota() -> float | None:
    """The cgroup's CPU limit in CPUs (quota / period): the smallest of this
    process's cgroup and those above it; None when none has one."""
    found = []
    for path in limit_files(("cpu.max",), "cpu", ("cpu.cfs_quota_us",)):
        text = _read(path) or ""
        if path.endswith("cpu.max"):
            parts = text.split()
            quota = _ratio(parts[0], parts[1]) if len(parts) == 2 else None
        else:
            quota = _ratio(text, _read(os.path.join(os.path.dirname(path), "cpu.cfs_period_us")) or "")
        if quota is not None:
            found.append(quota)
    return min(found) if found else None


def limit_files(v2: tuple[str, ...], controller: str, v1: tuple[str, ...]) -> list[str]:
    """The files named ``v2`` in this process's cgroup v2 directory and each
    one above it, those that exist; when there are none, the files named
    ``v1`` in its directory of cgroup v1 ``controller``'s hierarchy (its path
    in /proc/self/cgroup under each mount of that controller) and each one
    above it up to the mount. A limit binds everything below it, so a caller
    takes the smallest of what it reads."""
    out = [os.path.join(d, name) for d in _up(cgroup_dir(), ROOT) for name in v2
           if os.path.isfile(os.path.join(d, name))]
    if out:
        return out
    path = _v1_path(controller)
    try:
        mounts = sorted(m for m in os.listdir(ROOT) if controller in m.split(","))
    except OSError:
        mounts = []
    return [os.path.join(d, name) for m in mounts for d in _up(os.path.join(ROOT, m) + path, os.path.join(ROOT, m))
            for name in v1 if os.path.isfile(os.path.join(d, name))]


def _up(start: str, top: str) -> list[str]:
    """``start`` and its parents up to ``top`` (included), those that exist."""
    top = os.path.normpath(top)
    d = os.path.normpath(start)
    if not (d == top or d.startswith(top + os.sep)):
        d = top
    dirs = []
    while True:
        if os.path.isdir(d):
            dirs.append(d)
        if d == top:
            return dirs
        d = os.path.dirname(d)


def _v1_path(controller: str) -> str:
    """This process's path in cgroup v1 ``controller``'s hierarchy ("" if none)."""
    path = _own_path(lambda hierarchy, controllers: controller in controllers.split(","))
    return path if path not in (None, "/") else ""


def _own_path(wanted: Callable[[str, str], bool]) -> str | None:
    """The path of the first /proc/self/cgroup line (``ID:CONTROLLERS:PATH``)
    whose ID and controllers ``wanted`` takes; None when none is."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                parts = line.rstrip("\n").split(":", 2)
                if len(parts) == 3 and wanted(parts[0], parts[1]):
                    return parts[2]
    except OSError:
        pass
    return None


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None  # "max": no limit
    return q / p if q > 0 and p > 0 else None


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None

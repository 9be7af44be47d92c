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
``--cpus``, a Kubernetes CPU limit); at least 1. A Kubernetes CPU *request*
sets no quota: set ``workers`` there.
"""

from __future__ import annotations

import math
import os


def cgroup_dir() -> str:
    """This process's cgroup v2 directory (``0::`` of /proc/self/cgroup), else
    the hierarchy's root."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    return "/sys/fs/cgroup" + line.strip()[3:]
    except OSError:
        pass
    return "/sys/fs/cgroup"


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
    """The cgroup's CPU limit in CPUs (quota / period), None when there is none."""
    v2 = _read(os.path.join(cgroup_dir(), "cpu.max"))
    if v2 is not None:
        parts = v2.split()
        return _ratio(parts[0], parts[1]) if len(parts) == 2 else None
    for base in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"):
        quota = _read(os.path.join(base, "cpu.cfs_quota_us"))
        if quota is not None:
            return _ratio(quota, _read(os.path.join(base, "cpu.cfs_period_us")) or "")
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

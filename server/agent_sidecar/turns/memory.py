"""The memory budget behind ``agent.agent_cache.memory_high_mb``.

``auto`` reads the limit the sidecar runs under — the smallest cgroup v2
``memory.high`` or ``memory.max``, or cgroup v1 ``memory.limit_in_bytes``, of
its cgroup and those above it — and falls back to total RAM. The budget is
shared: each worker gets an equal part.
"""

from __future__ import annotations

import os

from ..cgroup import limit_files


def _read_limit(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    if not text or text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if 0 < value < (1 << 60) else None


def detect_limit_bytes() -> int:
    """The smallest memory limit of the sidecar's cgroup and those above it
    (cgroup.py ``limit_files``: a systemd service's MemoryMax= on a cgroup v1
    host is below the hierarchy's root), else total RAM."""
    limits = [v for v in map(_read_limit, limit_files(("memory.high", "memory.max"), "memory",
                                                      ("memory.limit_in_bytes",))) if v]
    return min(limits) if limits else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def budget_per_worker(setting: int | str, workers: int) -> int:
    """Bytes each worker may hold before shedding; 0 disables the pass."""
    if isinstance(setting, str):
        s = setting.strip().lower()
        if s in ("0", "off", "false", ""):
            return 0
        if s != "auto":
            setting = int(s)
        else:
            return detect_limit_bytes() // max(workers, 1)
    if setting <= 0:
        return 0
    return int(setting) * 1024 * 1024 // max(workers, 1)

"""The data dir's lock: one sidecar per data dir.

A running sidecar holds an exclusive ``flock`` on ``DATA_DIR/.lock`` from its
start to its stop (runtime.py), so a second ``serve`` on the same data dir is
refused at once, and tools beside it (``doctor``: store/sqlite/maintenance.py)
can tell that a sidecar runs there. The kernel lets go of the lock when the
process ends, however it ends: a crashed sidecar leaves no stale lock.
"""

from __future__ import annotations

import fcntl
import os

LOCK_NAME = ".lock"


def take(data_dir: str) -> int | None:
    """The lock, as the open file that holds it (closing it lets go), or None
    when another process holds it."""
    fd = os.open(os.path.join(data_dir, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def held(data_dir: str) -> bool:
    """Whether a process (a running sidecar) holds the lock; taken here only
    for the test, and let go at once. Creates no lock file where none is."""
    try:
        fd = os.open(os.path.join(data_dir, LOCK_NAME), os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing the file lets go of a lock taken here
    return False

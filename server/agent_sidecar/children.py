"""What every spawned child of the sidecar (turn workers, the store writer)
does first: take a name ``top``/``ps -o comm`` shows, and die with the parent.

Dying with the parent matters most for the store writer: a writer that
outlived a ``kill -9``'d sidecar could commit behind the back of the next
sidecar's startup recovery. Linux only (prctl); elsewhere a child notices its
parent is gone when its pipe reaches EOF.
"""

from __future__ import annotations

import os
import signal
import sys

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


def _prctl(option: int, arg) -> None:
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def become_child(name: str, parent_pid: int) -> None:
    """Name this process (at most 15 bytes are kept), ask the kernel for
    SIGKILL when the parent dies, and ignore SIGINT/SIGTERM: a Ctrl-C reaches
    the whole process group, and the parent decides when children stop."""
    _prctl(_PR_SET_NAME, name.encode()[:15])
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.getppid() != parent_pid:  # the parent died before we asked
        os._exit(1)

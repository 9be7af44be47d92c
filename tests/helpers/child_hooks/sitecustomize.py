"""Faults at a child's boot, for tests: on PYTHONPATH, this runs first in
every Python process, and in a sidecar's spawned child (``python -c`` with
children.BOOT) it makes one import go wrong, as a broken install or a
stalled start would, before the child has said anything to its parent.

- ``BREAK_IMPORT=module``: importing ``module`` raises ImportError (with
  ``BREAK_WHILE=path``, only while ``path`` exists).
- ``HOLD_IMPORT=module`` with ``HOLD_PIDFILE=path``: importing ``module``
  writes this process's pid to ``path`` and then never returns (with
  ``HOLD_WHILE=path``, returns once ``path`` is gone).

helpers.child_hooks.env(...) builds the environment."""

from __future__ import annotations

import os
import sys
import time


class _Hook:
    def __init__(self, broken: str | None, held: str | None, pidfile: str | None) -> None:
        self.broken, self.held, self.pidfile = broken, held, pidfile
        self.while_path = os.environ.get("BREAK_WHILE")
        self.hold_while = os.environ.get("HOLD_WHILE")

    def find_spec(self, name, path=None, target=None):
        if name == self.broken and (not self.while_path or os.path.exists(self.while_path)):
            raise ImportError(f"{name} is broken (test hook)")
        if name == self.held and self.pidfile:
            with open(self.pidfile, "w") as f:
                f.write(str(os.getpid()))
            while not self.hold_while or os.path.exists(self.hold_while):
                time.sleep(0.05 if self.hold_while else 60)
        return None


if any("agent_sidecar.child" in a for a in sys.orig_argv) and "-c" in sys.orig_argv:
    sys.meta_path.insert(0, _Hook(os.environ.get("BREAK_IMPORT"), os.environ.get("HOLD_IMPORT"),
                                  os.environ.get("HOLD_PIDFILE")))

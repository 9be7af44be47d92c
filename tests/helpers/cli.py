"""The ``agent-sidecar`` command, run as a user runs it: the installed script
(this Python's ``-m agent_sidecar`` when there is none), a child process in
the repo root, its output captured as text."""

from __future__ import annotations

import os
import subprocess
import sys

from sidecar_proc import ROOT

EXE = ROOT / ".venv" / "bin" / "agent-sidecar"
COMMAND = [str(EXE)] if EXE.exists() else [sys.executable, "-m", "agent_sidecar"]

# The environment without the sidecar's own overlay (AGENT_SIDECAR_*): a test's
# command sees only the variables it passes.
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SIDECAR_")}


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """``agent-sidecar ARGS...``; ``env``: variables added to the clean environment."""
    return subprocess.run([*COMMAND, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**CLEAN_ENV, **(env or {})})

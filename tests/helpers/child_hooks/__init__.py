"""The environment that puts sitecustomize.py's boot faults into a sidecar's children."""

from __future__ import annotations

import os
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)


def env(broken: str | None = None, held: str | None = None, pidfile: Path | None = None,
        broken_while: Path | None = None, held_while: Path | None = None) -> dict[str, str]:
    """Variables for the sidecar's environment: in its children, importing
    ``broken`` fails (only while ``broken_while`` exists, if given);
    importing ``held`` writes the child's pid to ``pidfile`` and hangs
    (until ``held_while`` is gone, if given)."""
    out = {"PYTHONPATH": os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)}
    if broken:
        out["BREAK_IMPORT"] = broken
    if broken_while:
        out["BREAK_WHILE"] = str(broken_while)
    if held:
        out["HOLD_IMPORT"], out["HOLD_PIDFILE"] = held, str(pidfile)
    if held_while:
        out["HOLD_WHILE"] = str(held_while)
    return out

"""Where ``agent-sidecar bench`` writes a run (``--json``, ``--plot``): checked
before anything runs, written each on its own at the end."""

from __future__ import annotations

import json
import os
import sys

from .report import error


def check_outputs(args) -> None:
    """ValueError for a --json or --plot file that cannot be written, before
    anything runs (not after the points, when the run would be lost)."""
    from ..bench.plot import format_problem
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        if not path:
            continue
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise ValueError(f"{flag} {path}: no such directory")
        if os.path.isdir(path):
            raise ValueError(f"{flag} {path}: is a directory (name a file)")
        if os.path.exists(path) and not os.access(path, os.W_OK):
            raise ValueError(f"{flag} {path}: not writable")
        if not os.path.exists(path) and not os.access(parent, os.W_OK | os.X_OK):
            raise ValueError(f"{flag} {path}: cannot create a file in {parent}")
    if args.json and args.plot and os.path.abspath(args.json) == os.path.abspath(args.plot):
        raise ValueError(f"--json and --plot name the same file ({args.json})")
    problem = format_problem(args.plot) if args.plot else None
    if problem:
        raise ValueError(problem)


def write_outputs(doc: dict, args) -> int:
    """Write --json and --plot, each on its own (one that fails does not
    keep the other from being written); 1 when one failed."""
    failed = 0
    if args.json:
        failed |= _write(args.json, lambda: _write_json(doc, args.json))
    if args.plot:
        from ..bench import plot
        failed |= _write(args.plot, lambda: plot.write(doc, args.plot))
    return failed


def _write_json(doc: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


def _write(path: str, write) -> int:
    try:
        write()
    except OSError as e:
        error("bench", f"cannot write {e.filename or path}: {e.strerror}")
        return 1
    print(f"wrote {path}", file=sys.stderr)
    return 0

"""How a command says it failed: each line on stderr as ``agent-sidecar
COMMAND: LINE``, argparse's own form (``agent-sidecar health: error: ...``).

One convention for every command, so a script or a log reader can tell
which command spoke and grep for it: a config's problems, one per line
(``config error: KEY: WHAT``), come out as ``agent-sidecar serve: config
error: KEY: WHAT``, and so do the same problems from doctor, backup and
config check. Before, serve and config check printed them bare, doctor and
backup prefixed the first line only, and sessions, serve and config's
other messages said ``agent-sidecar:`` without the command.
"""

from __future__ import annotations

import sys


def error(command: str, text: object) -> None:
    """Every line of ``text`` on stderr after ``agent-sidecar COMMAND: ``."""
    for line in str(text).splitlines() or [""]:
        print(f"agent-sidecar {command}: {line}", file=sys.stderr)

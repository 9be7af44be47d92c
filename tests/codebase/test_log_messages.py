"""Every log line's ``msg`` is a fixed text that operators match on
(docs/operations.md "Logs"): what varies goes into the line's fields
(``extra={...}``), never into the message, whether by ``%`` arguments or an
f-string. A message with the error folded in ("store commit failed: <error>")
cannot be matched on and splits one event into as many texts as it has causes.
Read from the server's sources, the generated protobuf modules aside."""

from __future__ import annotations

import ast
from pathlib import Path

import agent_sidecar

SOURCE = Path(agent_sidecar.__file__).parent
LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}


def _is_logger(node: ast.expr) -> bool:
    """``log``, ``logger`` or ``logging.getLogger(...)``."""
    if isinstance(node, ast.Name):
        return node.id in ("log", "logger")
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "getLogger"


def _variable_messages(path: Path) -> list[str]:
    """``log.LEVEL(msg, ...)`` / ``log.log(level, msg, ...)`` calls whose msg is
    built (an f-string, ``+``, ``%``, ``.format``), or that pass %-arguments
    after it. A msg held in a name is a relay of one made elsewhere (a worker's
    line, a turn's batched line) and is checked where it is made."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        f = node.func
        if not _is_logger(f.value):
            continue
        if f.attr in LEVELS:
            args = node.args
        elif f.attr == "log":
            args = node.args[1:]
        else:
            continue
        if not args:
            continue
        msg = args[0]
        if isinstance(msg, (ast.JoinedStr, ast.BinOp, ast.Call)) or len(args) > 1:
            found.append(f"{path.relative_to(SOURCE)}:{node.lineno}")
    return found


def test_every_log_message_is_a_fixed_text():
    found = [hit for path in sorted(SOURCE.rglob("*.py"))
             if not path.name.endswith(("_pb2.py", "_pb2_grpc.py")) for hit in _variable_messages(path)]
    assert not found, f"log messages that vary (put what varies in extra=): {found}"

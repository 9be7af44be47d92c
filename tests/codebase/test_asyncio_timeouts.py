"""A timeout around an await is ``async with asyncio.timeout(...)``, never
``asyncio.wait_for``: on Python 3.11, the floor of the sidecar and its
Python client, ``wait_for`` runs the work as a task of its own and, when that
task finishes in the same loop turn as a cancel of the caller, returns its
result instead of raising, so a shutdown's, a Ctrl-C's or a task group's
cancel is lost (the bench's Ctrl-C was, waiting for a channel that was
already ready). Read from the sources, the generated protobuf modules aside."""

from __future__ import annotations

import ast
from pathlib import Path

import agent_sidecar
import agent_sidecar_client

SOURCES = [Path(agent_sidecar.__file__).parent, Path(agent_sidecar_client.__file__).parent]


def _wait_for_calls(path: Path) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name == "wait_for":
                lines.append(node.lineno)
    return lines


def test_no_asyncio_wait_for_in_the_sidecar_or_its_python_client():
    found = [f"{path}:{line}" for root in SOURCES for path in sorted(root.rglob("*.py"))
             if not path.name.endswith(("_pb2.py", "_pb2_grpc.py")) for line in _wait_for_calls(path)]
    assert not found, f"asyncio.wait_for (use `async with asyncio.timeout(...)`): {found}"

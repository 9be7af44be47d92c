"""The architecture as the tree shows it: which package may import which.

api → cluster → turns → store; sessions, recovery and tools beside turns,
not inside them; store at the bottom, knowing nothing of the domain; wiring only in
runtime.py and cli/. Read from the sources (every import, at any depth of a
module), so a lazy import inside a function counts too."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import agent_sidecar

ROOT = Path(agent_sidecar.__file__).parent
# What each package (or top-level module) may import of the sidecar's own.
ALLOWED = {
    "store": {"errors", "children", "child", "logs", "meters", "data_dir_lock"},
    "sessions": {"store", "errors"},
    "recovery": {"sessions", "store", "errors", "delivery"},
    "tools": {"errors", "entry_points"},
    "models": {"errors", "entry_points"},
    "obs": {"delivery", "__version__", "logs"},  # below what it observes: it reads turns and calls by attribute
    "turns": {"store", "sessions", "recovery", "tools", "models", "errors", "config", "delivery",
              "children", "child", "v1", "meters", "obs", "logs", "cgroup"},
    "cluster": {"turns", "store", "recovery", "errors", "config", "v1", "tls", "logs",
                "obs"},  # a forwarded call carries the trace context on (obs/tracing.py)
    "api": {"cluster", "turns", "store", "sessions", "tools", "errors", "config", "delivery", "heap", "v1", "tls",
            "obs", "logs"},
}


def _unit(path: Path) -> str:
    rel = path.relative_to(ROOT).parts
    return rel[0] if len(rel) > 1 else rel[0][:-3]


def _imports(path: Path) -> set[str]:
    """The sidecar's packages/modules one source file imports."""
    tree = ast.parse(path.read_text())
    pkg = path.relative_to(ROOT).parts[:-1]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the file's package
                base = list(pkg[:len(pkg) - node.level + 1])
                parts = base + (node.module.split(".") if node.module else [])
                if not parts:  # "from .. import x" at the top: x is the unit
                    out.update(a.name for a in node.names)
                    continue
                out.add(parts[0])
            elif node.module and node.module.startswith("agent_sidecar."):
                out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("agent_sidecar."):
                    out.add(a.name.split(".")[1])
    return out


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        unit = _unit(path)
        graph.setdefault(unit, set()).update(_imports(path) - {unit})
    return graph


def test_each_package_imports_only_what_is_below_or_beside_it():
    graph = _graph()
    wrong = {unit: sorted(uses - ALLOWED[unit]) for unit, uses in graph.items()
             if unit in ALLOWED and uses - ALLOWED[unit]}
    assert not wrong, f"imports across the layers: {wrong}"


def test_no_import_cycles_between_packages():
    graph = _graph()
    done, stack = set(), []

    def visit(unit: str) -> None:
        if unit in stack:
            raise AssertionError(f"import cycle: {' -> '.join(stack[stack.index(unit):] + [unit])}")
        if unit in done:
            return
        stack.append(unit)
        for nxt in sorted(graph.get(unit, ())):
            visit(nxt)
        stack.pop()
        done.add(unit)

    for unit in sorted(graph):
        visit(unit)


def test_importing_the_turn_engine_does_not_import_the_api():
    code = ("import pkgutil, importlib, sys, agent_sidecar.turns as t\n"
            "for m in pkgutil.walk_packages(t.__path__, 'agent_sidecar.turns.'):\n"
            "    importlib.import_module(m.name)\n"
            "print(sorted(m for m in sys.modules if m.startswith('agent_sidecar.api')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout

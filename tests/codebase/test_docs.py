"""The project documents itself: docs/api.md is what the protos' comments make
it, no file points at the contract page that is not in the repository (the
spec's API page, NEEDLE below), and every relative link of the docs and READMEs
resolves, down to the heading it names."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")
NEEDLE = "API" + ".md"  # spelled apart so that this file does not match itself


def _tracked() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / p for p in out.splitlines()]


def test_the_generated_reference_is_up_to_date(tmp_path):
    spec = importlib.util.spec_from_file_location("api_reference", ROOT / "docs/gen/api_reference.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    shutil.copy(ROOT / "docs/semantics.md", tmp_path / "semantics.md")
    gen.main(["--docs", str(tmp_path)])
    for name in ("api.md", "semantics.md"):
        assert (tmp_path / name).read_text() == (ROOT / "docs" / name).read_text(), \
            f"docs/{name} is stale: run `make docs` and commit"


def test_the_reference_covers_every_service_and_reason():
    api = (ROOT / "docs/api.md").read_text()
    for service in ("SessionService", "PromptService", "ToolService"):
        assert f"### {service}" in api
    for reason in ("AGENT_BUSY", "TOOL_SCOPE_VIOLATION", "WORKER_CRASHED", "restart_interrupted"):
        assert f"| `{reason}` |" in api
        assert f"| `{reason}` |" in (ROOT / "docs/semantics.md").read_text()


def test_nothing_points_at_an_api_md_outside_the_repo():
    offenders = []
    for path in _tracked():
        if path.suffix in {".png", ".binpb"} or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        if NEEDLE in text:
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, f"references to {NEEDLE} (use docs/api.md or docs/semantics.md): {offenders}"


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings (lower case, punctuation
    dropped, spaces as hyphens; a repeated heading's -1, -2 are not needed
    here) and the page's own ``<a name="...">`` anchors."""
    text = page.read_text()
    slugs = set(re.findall(r'<a name="([^"]+)"', text))
    for line in text.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            slugs.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return slugs


def test_relative_links_in_the_docs_resolve():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "clients").glob("*/README.md")), ROOT / "deploy/README.md",
             *sorted((ROOT / "benchmarks").glob("*.md"))]
    broken = []
    for page in pages:
        if not page.exists():
            broken.append(f"{page.relative_to(ROOT)} (missing page)")
            continue
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = page.parent / path if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(ROOT)} → {target}")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                broken.append(f"{page.relative_to(ROOT)} → {target} (no such heading)")
    assert not broken, broken


def test_the_readme_conformance_table_lists_every_scenario():
    """The README shows the table `make conformance` prints: one row per
    scenario of clients/conformance/scenarios.json, in the file's order."""
    import json

    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("```\nscenario "):]
    block = block[:block.index("\n```", 4)]
    rows = [line.split()[0] for line in block.splitlines()[2:] if line.strip() and not line.startswith("-")]
    data = json.loads((ROOT / "clients/conformance/scenarios.json").read_text())
    scenarios = data["scenarios"] if isinstance(data, dict) else data
    assert rows == [s["id"] for s in scenarios], "README.md's conformance table is stale: paste `make conformance`'s"

"""The README's quick start runs as written: its Python programs (those that
end in ``asyncio.run(main())``), in the root README and the Python client's,
each run as a file of its own from a directory whose ``./data`` is a real
sidecar's data dir, served with the README's own ``try.toml``. A snippet that
no longer runs, or a config it needs that is missing, fails here."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from sidecar_proc import ROOT, Sidecar

FENCE = re.compile(r"```(\w*)\n(.*?)```", re.S)
PAGES = ("README.md", "clients/python/README.md")


def _blocks(page: str, lang: str) -> list[str]:
    return [body for kind, body in FENCE.findall((ROOT / page).read_text()) if kind == lang]


def _programs() -> list[tuple[str, str]]:
    return [(f"{page}#{i}", body) for page in PAGES
            for i, body in enumerate(_blocks(page, "python")) if "asyncio.run(main())" in body]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    (config,) = [b for b in _blocks("README.md", "toml") if b.startswith("# try.toml")]
    work = tmp_path_factory.mktemp("readme")
    sc = Sidecar(work / "data", config=config).start()
    yield work
    sc.stop()


def test_the_readme_has_its_programs():
    names = [name for name, _ in _programs()]
    assert len(names) >= 4, names  # the first turn, a busy session, a hosted tool, the client's


@pytest.mark.parametrize("name,program", _programs(), ids=[name for name, _ in _programs()])
def test_a_readme_program_runs_as_written(workdir, name, program):
    path = workdir / (re.sub(r"\W", "_", name) + ".py")
    path.write_text(program)
    r = subprocess.run([sys.executable, str(path)], cwd=workdir, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{name}:\n{r.stdout}\n{r.stderr}"
    if "local.now" in program:
        assert "tool_call local.now" in r.stdout and "tool_result" in r.stdout, r.stdout
    if "reject_if_busy" in program:
        assert "busy; retry in" in r.stdout and "one two three four five" in r.stdout, r.stdout


def test_the_grpcurl_recipe_names_the_socket_as_grpcurl_takes_it():
    """grpcurl 1.9.2 and 1.9.3 dial `-unix PATH` over TCP ('missing port in
    address'): the recipe gives the socket as a unix:// address."""
    (recipe,) = [b for b in _blocks("README.md", "sh") if "grpcurl" in b]
    assert 'SOCK="unix://$PWD/data/sidecar.sock"' in recipe
    assert all("-unix" not in line for line in recipe.splitlines() if line.startswith("grpcurl")), recipe


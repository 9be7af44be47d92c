import sys
from pathlib import Path

import pytest

# Every test folder imports the one shared helper set (tests/helpers/) and the
# sidecar process class (tests/sidecar_proc.py) from here.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sidecar_proc import Sidecar  # noqa: E402


@pytest.fixture
def sidecar(tmp_path):
    """A fresh sidecar per test (echo model, Unix socket)."""
    sc = Sidecar(tmp_path / "data").start()
    yield sc
    sc.stop()


@pytest.fixture(scope="module")
def shared_sidecar(tmp_path_factory):
    """One sidecar for a whole module, for read-mostly tests."""
    sc = Sidecar(tmp_path_factory.mktemp("shared") / "data", tcp=True).start()
    yield sc
    sc.stop()


@pytest.fixture(scope="module")
def host(sc):
    """Tool host "test" (``test.add``) on the module's own ``sc`` sidecar."""
    from helpers.tools import AB_SCHEMA, ToolHost, answers
    with ToolHost(sc.tools(), "test", [("test.add", "test.add", AB_SCHEMA)],
                  answers({"test.add": lambda a: a["a"] + a["b"]})) as h:
        yield h

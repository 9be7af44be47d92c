"""Rules of the test suite itself (tests/conftest.py), checked on tests of
their own run by a pytest in a subprocess with the suite's conftest loaded:
what a test does in a helper thread counts for it; a ``store_free`` test
runs on the SQLite pass only, and only while it starts no sidecar."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent

THREAD_ASSERTS = '''
import threading

def test_a_client_thread_whose_check_fails():
    def client():
        assert 1 + 1 == 3, "the thread's own check"
    t = threading.Thread(target=client)
    t.start()
    t.join()
'''


STORE_FREE = '''
import pytest
from sidecar_proc import Sidecar

pytestmark = pytest.mark.store_free("claims to need no store")

def test_that_starts_a_sidecar_all_the_same(tmp_path):
    Sidecar(tmp_path / "data", workers=1).start().stop()
'''


def run_pytest(tmp_path, name: str, source: str, *args: str) -> str:
    """pytest on one test file under the suite's conftest; its output."""
    (tmp_path / name).write_text(source)
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider",
                        "-q", "--rootdir", str(tmp_path), *args, str(tmp_path / name)],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin"})
    return r.stdout + r.stderr


def test_an_assert_failing_in_a_helper_thread_fails_its_test(tmp_path):
    """A client loop or stream reader in a thread that asserts: its failure
    is the test's (pytest alone only warned, and the test passed)."""
    out = run_pytest(tmp_path, "test_thread.py", THREAD_ASSERTS)
    assert "1 failed" in out and "the thread's own check" in out, out[-3000:]


def test_a_store_free_test_that_starts_a_sidecar_fails_and_is_skipped_on_postgres(tmp_path):
    """The marker keeps a test off the PostgreSQL pass: one that starts a
    sidecar after all fails (on SQLite), so it cannot lose that pass's
    coverage unnoticed."""
    out = run_pytest(tmp_path, "test_free.py", STORE_FREE)
    assert "1 passed, 1 error" in out and "is marked store_free but started a sidecar" in out, out[-3000:]
    out = run_pytest(tmp_path, "test_free.py", STORE_FREE, "--backend", "postgres")
    assert "1 skipped" in out, out[-3000:]

"""Rules of the test suite itself (tests/conftest.py), checked on a test of
their own run by a pytest in a subprocess with the suite's conftest loaded:
what a test does in a helper thread counts for it."""

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


def test_an_assert_failing_in_a_helper_thread_fails_its_test(tmp_path):
    """A client loop or stream reader in a thread that asserts: its failure
    is the test's (pytest alone only warned, and the test passed)."""
    (tmp_path / "test_thread.py").write_text(THREAD_ASSERTS)
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider",
                        "-q", "--rootdir", str(tmp_path), str(tmp_path / "test_thread.py")],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin"})
    assert "1 failed" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    assert "the thread's own check" in r.stdout, r.stdout[-2000:]

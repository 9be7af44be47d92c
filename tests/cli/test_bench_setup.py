"""`agent-sidecar bench` before its points: the calibration that sets the
ideal turn. The real command in a subprocess
against a real sidecar; counts are checked against what the sidecar holds,
read back over gRPC. No figure is asserted: speed is for benchmarks/."""

from __future__ import annotations

import json

import pytest
from helpers.cli import cli
from helpers.config import echo
from helpers.sessions import get_session, held
from sidecar_proc import Sidecar

WORDS = 4


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    s = Sidecar(tmp_path_factory.mktemp("bench-setup") / "data", config=echo("main", 1)).start()
    yield s
    s.stop()


def bench(*args: str, timeout: float = 120):
    return cli("bench", *args, timeout=timeout)


def test_the_calibration_runs_on_one_warm_session(sc, tmp_path):
    """The calibration's turns run one after another on one session, after
    a warm-up there that is in no figure but is in the totals: a
    session runs on one worker slot, and a worker's first turn is slower
    than its later ones, so calibration turns spread over fresh sessions
    measured cold workers and inflated the ideal turn (on a sidecar just
    started, up to seven times), and the SLO and the knee with it."""
    out = tmp_path / "calibration.json"
    r = bench("--target", sc.target, "--sessions", "6", "--concurrency", "1", "--turns", "1", "--warmup", "0",
              "--calibrate", "4", "--prompt-words", str(WORDS), "--json", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    calibration = doc["calibration"]
    assert calibration["turn_ms"]["n"] == 4 and calibration["turns"] == 4  # the ideal: 4 warm turns
    assert calibration["warmup_s"] > 0
    sent = calibration["totals"]["started"]  # and the warm-up's, the first turn and the one started with it
    assert sent == calibration["totals"]["completed"] == 4 + 2
    assert doc["slo"]["ideal_s"] == pytest.approx(calibration["turn_ms"]["p50"] / 1e3)

    keys = doc["sessions"]["keys"]
    counts = [get_session(sc.sessions(), key).turn_count for key in keys]
    assert counts[0] >= sent, counts  # every calibration turn on the first session (the point's one anywhere)
    assert sum(counts) == doc["totals"]["completed"] == sent + 1
    assert held(sc.sessions(), keys) == (sent + 1, 2 * (sent + 1))


"""The bare server from the bench's side: ``BareProcess`` starts it
(bench/bare.py) in a child process beside the target, and ``bare_timing``
says how it should stream: given (``--bare-latency-ms``), or read off the
calibration so that it streams the frames the sidecar sent, at the model's
times (bench/run.py's docstring has the rules).
"""

from __future__ import annotations

import select
import shutil
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING

from .target import BenchError

if TYPE_CHECKING:
    from .options import BenchOptions

FIRST_DELAY_FLOOR_MS = 25.0
ONE_DELTA_FLOOR_MS = 5.0  # one delta per turn: below this its wait is overhead, not latency


class BareProcess:
    """The bare server (bench/bare.py) in a child process, on the same kind of
    transport as the target: a Unix socket in a temporary directory, or TCP
    on 127.0.0.1."""

    def __init__(self, timing: dict, unix: bool):
        self.timing = timing
        self.dir = tempfile.mkdtemp(prefix="sidecar-bench-bare-")
        self.listen = f"unix:{self.dir}/bare.sock" if unix else "127.0.0.1:0"
        self.proc: subprocess.Popen | None = None
        self.address = ""

    def start(self, timeout: float = 30.0) -> str:
        args = [sys.executable, "-m", "agent_sidecar.bench.bare", "--listen", self.listen,
                "--token-latency-ms", str(self.timing["delta_gap_ms"]),
                "--first-delta-ms", str(self.timing["first_delta_ms"]),
                "--reply-deltas", str(self.timing["reply_deltas"]),
                "--delta-words", str(self.timing["delta_words"])]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stdout, stderr = self.proc.stdout, self.proc.stderr
        assert stdout is not None and stderr is not None  # PIPE
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([stdout], [], [], 0.2)
            if ready:
                line = stdout.readline()
                if line.startswith("serving "):
                    self.address = line.split(None, 1)[1].strip()
                    return self.address
            if self.proc.poll() is not None:
                err = (stderr.read() or "").strip().splitlines()
                raise BenchError(f"the bare server exited ({self.proc.returncode}): "
                                 f"{err[-1] if err else 'no output'}")
        self.stop()
        raise BenchError(f"the bare server did not start within {timeout:g}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)  # its socket, and anything else it left


def bare_timing(opts: BenchOptions, calibration: dict | None, words: int) -> dict:
    """How the bare server should stream: given, or read off the calibration.
    The gap is the one the client saw between deltas, as it is: the bare
    server paces by deadline (models/_text.paced), so a late wake-up does not
    add up over a turn. The first delta is due one gap after ``started``, or
    when the calibration saw it if that was FIRST_DELAY_FLOOR_MS or more
    later (the model's own wait before its first token; less is the
    sidecar's overhead, not the model's). A sidecar that coalesces sends a
    turn's first delta at once and then one frame of several words per
    window: then the first is due after its own words at the pace of the
    words in the later frames."""
    if opts.bare_latency_ms is not None or not calibration or not calibration.get("turns"):
        gap = opts.bare_latency_ms or 0.0
        return {"delta_gap_ms": gap, "first_delta_ms": gap + opts.bare_first_delay_ms,
                "reply_deltas": 0, "delta_words": 1,
                "source": "given" if opts.bare_latency_ms is not None else "default"}
    gap = calibration["delta_gap_ms"]["p50"]
    first = calibration["first_delta_ms"]["p50"] or 0.0
    per_turn = calibration["deltas_per_turn"] or 0
    if gap is None:  # one delta per turn: all the wait is before it
        gap = first_delta = first if first >= ONE_DELTA_FLOOR_MS else 0.0
    elif first - gap >= FIRST_DELAY_FLOOR_MS:
        first_delta = first
    else:
        first_delta = _coalesced_first(calibration, gap) or gap
    reply = 0 if round(per_turn) == words else max(1, round(per_turn))
    # Fixed deltas carry the words the sidecar's did (several when it coalesces),
    # so both sides stream as much text and CPU per word compares like for like.
    delta_words = max(1, round((calibration.get("words_per_turn") or 0) / per_turn)) if reply and per_turn else 1
    return {"delta_gap_ms": round(gap, 3), "first_delta_ms": round(first_delta, 3),
            "reply_deltas": reply, "delta_words": delta_words, "source": "calibrated"}


def _coalesced_first(calibration: dict, gap: float) -> float | None:
    """When a coalescing sidecar's first delta would come at the model's
    pace: its words at the pace of the words in the frames after it. None
    when the frames carry one word each (no coalescing seen)."""
    frames, words = calibration["deltas_per_turn"] or 0, calibration.get("words_per_turn") or 0
    first_words = calibration.get("first_delta_words") or 0
    if frames < 2 or words - first_words <= frames - 1:
        return None
    return first_words * gap * (frames - 1) / (words - first_words)

"""A small progress bar for long CLI work (stderr, redrawn in place on a TTY,
one line per 10% otherwise, so logs stay readable)."""

from __future__ import annotations

import sys
import time
from collections import deque


class Progress:
    def __init__(self, label: str, total: int, stream=None):
        self.label, self.total = label, max(total, 1)
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.done = 0
        self._last_decile = -1
        self._start = time.monotonic()

    def advance(self, n: int = 1) -> None:
        self.done = min(self.done + n, self.total)
        self._draw()

    def _draw(self) -> None:
        frac = self.done / self.total
        if self.tty:
            bar = "#" * int(frac * 30)
            self.stream.write(f"\r{self.label:<22} [{bar:<30}] {frac:6.1%} ({self.done}/{self.total})")
            self.stream.flush()
        else:
            decile = int(frac * 10)
            if decile != self._last_decile:
                self._last_decile = decile
                self.stream.write(f"{self.label}: {frac:.0%} ({self.done}/{self.total})\n")

    def finish(self) -> None:
        self.done = self.total
        self._draw()
        if self.tty:
            self.stream.write(f"  {time.monotonic() - self._start:.1f}s\n")
        self.stream.flush()


class LiveLine:
    """One status line for work whose end is a rate, not a count (the bench):
    on a TTY ``show`` redraws it in place, cut to the terminal's width; ``log``
    writes a line that stays. Elsewhere (a log file, CI) ``show`` writes its
    line once ``every_s`` seconds have passed since the start or its last one,
    and ``log`` lines stay: a log shows a long step going on, without
    hundreds of redraws or a line for each short one."""

    def __init__(self, stream=None, every_s: float = 10.0, clock=time.monotonic):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._shown = False
        self.every_s, self._clock = every_s, clock
        self._logged_at = clock()  # when show last wrote a line, or the start (not a TTY)

    def _width(self) -> int:
        import shutil
        return max(20, shutil.get_terminal_size((100, 20)).columns - 1)

    def show(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r" + text[:self._width()] + "\x1b[K")
            self.stream.flush()
            self._shown = True
            return
        now = self._clock()
        if now - self._logged_at >= self.every_s:
            self._logged_at = now
            self.stream.write(text + "\n")
            self.stream.flush()

    def log(self, text: str) -> None:
        self.stream.write(("\r\x1b[K" if self._shown else "") + text + "\n")
        self.stream.flush()
        self._shown = False

    def close(self) -> None:
        if self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False


def bar(fraction: float, width: int = 20) -> str:
    """``[#######-------------]`` for a fraction in 0..1."""
    filled = int(max(0.0, min(1.0, fraction)) * width)
    return "[" + "#" * filled + "-" * (width - filled) + "]"


class StatusView:
    """Turns the runner's (label, point) reports into the one live line: phase,
    a bar of the measure window, the current rates (over the last ~2 s)."""

    def __init__(self, line, duration_s: float | None, turns: int | None):
        self.line, self.duration_s, self.turns = line, duration_s, turns
        self._recent: deque = deque(maxlen=5)
        self._label = ""

    def __call__(self, label: str, point) -> None:
        if point is None:
            self._recent.clear()
            (self.line.log if label.startswith("done") else self.line.show)(label)
            return
        if label != self._label:
            self._label = label
            self._recent.clear()
        s = point.snapshot()
        now = time.monotonic()
        self._recent.append((now, s["done"], s["deltas"]))
        t0, d0, x0 = self._recent[0]
        span = max(now - t0, 1e-9)
        rate = f"{(s['done'] - d0) / span:,.1f} turns/s · {(s['deltas'] - x0) / span:,.0f} deltas/s" \
            if len(self._recent) > 1 else "…"
        # the point's own length: the calibration's is its turns, whatever --duration says
        duration_s, turns = point.spec.duration_s, point.spec.turns
        if s["phase"] == "measure" and turns is None:
            elapsed = s['window_elapsed']
            where = f"measure {bar(elapsed / duration_s)} {elapsed:.1f}/{duration_s:g}s"
        elif s["phase"] == "measure":
            where = f"measure {bar(point.measured_started / turns)} {point.measured_started}/{turns} turns"
        else:
            where = f"{s['phase']} {s['elapsed']:.0f}s"
        absorbed = f" · {s['absorbed']} absorbed" if s.get("absorbed") else ""
        self.line.show(f"{label} {where} · {rate} · {s['in_flight']} in flight · {s['errors']} errors{absorbed}")

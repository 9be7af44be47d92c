"""A small progress bar for long CLI work (stderr, redrawn in place on a TTY,
one line per 10% otherwise, so logs stay readable)."""

from __future__ import annotations

import sys
import time


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

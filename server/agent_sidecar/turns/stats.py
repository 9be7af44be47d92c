"""What the turn engine counts for the metrics endpoint (obs/metrics.py reads
it at scrape time): plain ints and meters.Histogram, updated where the event
happens, on the event loop.

* a turn's end when its terminal frame commits (the frame bus), by outcome
  and reason, with its duration from its start when it started;
* its time to first token, from its start to its first text delta;
* frames and their bytes as they are persisted (committed);
* each model call, timed in the worker and reported with the turn's end
  (wire.TurnReport), by backend; the agent cache's hits, misses and evictions,
  reported the same way (and by the worker's sweeps, wire.Evicted);
* each tool call, timed here (the parent runs them), by namespace; one the
  worker refused (outside the profile's tools, wire.ToolRefused) is an error
  with no time.
"""

from __future__ import annotations

import time
from typing import Any

from ..meters import CALL_SECONDS, TURN_SECONDS, Counts, Histogram, Histograms


class TurnStats:
    def __init__(self) -> None:
        self.ended = Counts()  # (outcome, reason) -> turns
        self.duration = Histograms(TURN_SECONDS)  # by outcome
        self.first_token = Histogram(TURN_SECONDS)
        self.frames = 0
        self.frame_bytes = 0
        self.model_calls = Histograms(CALL_SECONDS)  # by backend
        self.model_errors = Counts()  # backend -> failed calls
        self.tool_calls = Histograms(CALL_SECONDS)  # by namespace
        self.tool_errors = Counts()  # namespace -> failed calls
        self.cache_hits = 0
        self.cache_misses = 0
        self.evictions = Counts()  # why (lru, ttl, pressure) -> agents

    def turn_ended(self, turn: Any, outcome: str, reason: str) -> None:
        self.ended.add((outcome, reason))
        if turn.began_at:
            self.duration[outcome].observe(time.monotonic() - turn.began_at)

    def first_delta(self, turn: Any) -> None:
        """The turn's first text delta reached the parent (once per turn)."""
        turn.first_token_seen = True
        if turn.began_at:
            self.first_token.observe(time.monotonic() - turn.began_at)

    def worker_report(self, report: dict[str, Any]) -> None:
        """A wire.TurnReport: the turn's model calls and its agent lookup."""
        backend = report["backend"]
        hist = self.model_calls[backend]
        for seconds, ok in report["model_calls"]:
            hist.observe(seconds)
            if not ok:
                self.model_errors.add(backend)
        if report["cache_hit"]:
            self.cache_hits += 1
        else:
            self.cache_misses += 1
        if report["evicted"]:
            self.evictions.add("lru", report["evicted"])

    def tool_refused(self, namespace: str) -> None:
        """A call the worker refused: an error of its namespace, with no
        duration (it never ran)."""
        self.tool_errors.add(namespace)

    def tool_call(self, namespace: str, seconds: float, ok: bool) -> None:
        self.tool_calls[namespace].observe(seconds)
        if not ok:
            self.tool_errors.add(namespace)

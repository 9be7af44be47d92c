"""Counting on the hot paths: histograms kept as plain Python lists.

The turn engine, the frame bus and the store's writer client record what
they do here, with an index lookup and two additions per observation; the
metrics endpoint (obs/metrics.py) reads these objects when it is scraped and
turns them into Prometheus samples. So nothing per frame or per turn goes
through prometheus_client, and this module imports nothing: the workers and
the writer process may import the modules that use it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable

# Upper bounds (inclusive, as Prometheus' ``le``) of the standard bucket sets.
# Each reaches past the longest its quantity runs by default, so that a
# quantile near the limit is resolved rather than lost in +Inf: a turn up to
# its timeout (agent.gateway_timeout, 1800 s), a model call up to the
# OpenAI-compatible backend's request timeout (120 s) and some streaming past
# it, a tool call up to its profile's tool_timeout_s (60 s). A group commit
# starts at 0.1 ms, where one lands whose fsync is cheap or skipped
# (synchronous = NORMAL), so that its median is resolved too.
TURN_SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0,
                1800.0, 3600.0)
CALL_SECONDS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                300.0)
COMMIT_SECONDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                  5.0, 10.0)
BATCH_JOBS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)


class Histogram:
    """Counts of observations per bucket, their sum; ``observe`` is O(log buckets)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Iterable[float]):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or below it), ending with (inf, count)."""
        out, total = [], 0
        for bound, n in zip(self.bounds + (float("inf"),), self.counts):
            total += n
            out.append((bound, total))
        return out


class Histograms(dict):
    """One Histogram per label value, made on first use."""

    def __init__(self, bounds: Iterable[float]):
        super().__init__()
        self.bounds = tuple(bounds)

    def __missing__(self, label: str) -> Histogram:
        h = self[label] = Histogram(self.bounds)
        return h


class Counts(dict):
    """Counters by label value (a str or a tuple of them), 0 until counted."""

    def __missing__(self, label) -> int:
        return 0

    def add(self, label, n: int = 1) -> None:
        self[label] = self.get(label, 0) + n

"""Numbers from a bench run: percentiles, latency summaries, per-second series,
and the knee of a sweep.

Kept free of gRPC and of the client so the developer benchmarks and the tests
can use it with nothing else loaded.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from fractions import Fraction

QUANTILES = (50, 90, 99)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted sequence (q in 0..100);
    NaN when empty. Nearest rank, not interpolation: the value at rank
    ceil(q/100 * n), a value that was actually measured (p99 of 100 values
    is the 99th, of 300 the 297th; p50 of 10 the 5th). The rank is computed
    exactly (a fraction, not a float rounded), so no q and n land a rank off."""
    if not sorted_values:
        return float("nan")
    n = len(sorted_values)
    rank = math.ceil(Fraction(str(q)) * n / 100)  # str: 99.9 is 999/10, not the float's binary value
    return sorted_values[max(0, min(n - 1, rank - 1))]


def summarize(values: Iterable[float], scale: float = 1.0) -> dict[str, float | int | None]:
    """``{"n", "p50", "p90", "p99", "max", "mean"}`` of ``values`` times
    ``scale`` (e.g. 1e3 for seconds to milliseconds); None where there are none."""
    data = sorted(v * scale for v in values)
    if not data:
        return {"n": 0, **{f"p{q}": None for q in QUANTILES}, "max": None, "mean": None}
    out: dict[str, float | int | None] = {"n": len(data)}
    for q in QUANTILES:
        out[f"p{q}"] = percentile(data, q)
    out["max"] = data[-1]
    out["mean"] = sum(data) / len(data)
    return out


def parse_slo(text: str) -> float:
    """``"10%"`` or ``"0.1"`` -> 0.1 (the allowed excess over the ideal)."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise ValueError(f"--slo: {text!r} is not a fraction (0.1) or a percentage (10%)") from None
    if not value > 0 or math.isinf(value):  # NaN fails the comparison too
        raise ValueError(f"--slo: {text!r} must be a finite number above 0")
    return value


# A bench client is one Python process: one event loop, bound by one core
# whatever the machine has. A point during which a client used at least this
# share of a core was paced by the client as much as by the server. Not only
# a full core: an event loop busy three quarters of the time already queues
# what it reads, and the first delta's p99 is where that shows first.
CLIENT_BOUND_SHARE = 0.75


def client_bound(procs: dict | None) -> bool | None:
    """Whether the busiest of the bench's processes during a point
    (``procs``, procs.TreeWindow) reached ``CLIENT_BOUND_SHARE`` of a core;
    None when it was not measured (a target on another host)."""
    if not procs or not procs.get("wall_s"):
        return None
    busiest = procs.get("bench_busiest_cpu_s", procs["bench_cpu_s"])  # (a document from before --clients)
    return busiest / procs["wall_s"] >= CLIENT_BOUND_SHARE


def knee(points: Sequence[tuple[int, float | None, bool]], limit_s: float) -> dict:
    """The largest concurrency of a sweep whose p99 turn duration stays within
    ``limit_s`` and that met the rest of the SLO, every lower point passing too.

    ``points`` are ``(concurrency, p99 seconds, clean)``: ``clean`` when the
    point had no errors and met the SLO's other bound (the first delta's p99,
    when one was given). The search stops at the first failing point, so a
    noisy pass above a failure does not raise the knee (``non_monotone`` says
    it happened). ``interpolated`` estimates where p99 crosses the limit,
    linearly between the last passing and the first failing point (None when
    either is missing or the failing point was not clean: then it is not the
    turn's p99 that failed it); ``beyond_sweep`` means every point passed, so
    the knee is at least the largest concurrency measured.
    """
    ordered = sorted(points, key=lambda p: p[0])
    last_ok: tuple[int, float] | None = None
    first_bad: tuple[int, float | None, bool] | None = None
    non_monotone = False
    for conc, p99, clean in ordered:
        ok = clean and p99 is not None and p99 <= limit_s
        if first_bad is None:
            if ok and p99 is not None:
                last_ok = (conc, p99)
            else:
                first_bad = (conc, p99, clean)
        elif ok:
            non_monotone = True
    interpolated = None
    if last_ok and first_bad and first_bad[2] and first_bad[1] is not None and first_bad[1] > last_ok[1]:
        (c0, p0), c1, p1 = last_ok, first_bad[0], first_bad[1]
        interpolated = c0 + (limit_s - p0) * (c1 - c0) / (p1 - p0)
    return {"concurrency": last_ok[0] if last_ok else None,
            "interpolated": interpolated,
            "first_failing": first_bad[0] if first_bad else None,
            "beyond_sweep": bool(ordered) and first_bad is None,
            "non_monotone": non_monotone,
            "limit_s": limit_s}


def series(turns: Iterable[tuple[float, float, bool]], deltas: dict[int, int], t0: float,
           t_end: float) -> list[dict]:
    """One row per second of a run, for the over-time plot.

    ``turns`` are ``(end, duration, ok)`` in the run's clock, ``deltas`` the
    text deltas received per whole second since ``t0``. Each row: second
    ``t``, turns completed, deltas received, and the p50/p99 duration (ms) of
    the turns that completed in that second.
    """
    n = max(1, int(math.ceil(t_end - t0)))
    done: list[list[float]] = [[] for _ in range(n)]
    failed = [0] * n
    for end, duration, ok in turns:
        i = min(n - 1, max(0, int(end - t0)))
        if ok:
            done[i].append(duration)
        else:
            failed[i] += 1
    rows = []
    for i in range(n):
        d = sorted(done[i])
        rows.append({"t": i, "turns": len(d), "errors": failed[i], "deltas": deltas.get(i, 0),
                     "turn_p50_ms": percentile(d, 50) * 1e3 if d else None,
                     "turn_p99_ms": percentile(d, 99) * 1e3 if d else None})
    return rows

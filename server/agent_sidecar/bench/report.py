"""What a bench run says: the ideal turn and the SLO, the knee of each server,
sidecar-vs-bare ratios, the totals the target's store must hold, and the
plain-text tables printed on stdout.

``analyse`` completes the document ``run`` builds (it is pure: no I/O), and
``render`` turns it into text, so the JSON and the table never disagree.
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import statistics
from typing import Any

from . import stats


def options_dict(opts) -> dict:
    """The run's options for the JSON document: never the token, the prompt
    as its size and its first words, TLS as a yes or no (never its key)."""
    t = opts.target  # the token and TLS options are every target's
    d = dataclasses.asdict(dataclasses.replace(opts, targets=()))
    d.update(target=",".join(x.address for x in opts.targets), targets=[x.address for x in opts.targets],
             tls=t.tls is not None, token_given=bool(t.token), channel_options=list(t.channel_options),
             insecure=t.insecure, connect_timeout_s=t.connect_timeout_s)
    text = d.pop("text")
    d["prompt"] = {"words": len(text.split()), "chars": len(text), "start": text[:60]}
    return d


def machine() -> dict:
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "system": platform.platform(), "load_avg": load}


# -- analysis -------------------------------------------------------------------------

def ideal_before_points(ideal_s: float | None, calibration: dict | None) -> tuple[float, str] | None:
    """The ideal turn as known before any point has run: ``--ideal``, else
    the calibration's median turn; None when neither is there."""
    if ideal_s:
        return ideal_s, "given (--ideal)"
    if calibration and calibration["turn_ms"]["p50"] is not None:
        return (calibration["turn_ms"]["p50"] / 1e3,
                f"median of {calibration['turn_ms']['n']} calibration turns at concurrency 1")
    return None


def _ideal(doc: dict) -> tuple[float | None, str]:
    known = ideal_before_points(doc["options"].get("ideal_s"), doc.get("calibration"))
    if known is not None:
        return known
    mine = sorted((p for p in doc["points"] if p["server"] == "sidecar" and p["turn_ms"]["p50"] is not None),
                  key=lambda p: p["concurrency"])
    if mine:
        return mine[0]["turn_ms"]["p50"] / 1e3, f"p50 turn at the lowest concurrency ({mine[0]['concurrency']})"
    return None, "unknown (no completed turn)"


KNEE_STEP = 1.5  # --find-knee: each level past the sweep this many times the one before


def next_level(level: int) -> int:
    """The level after ``level`` when ``--find-knee`` goes past the sweep:
    KNEE_STEP times it, rounded up to two significant digits (600, 900,
    1400, 2100, ...), so the points land on round numbers."""
    raw = math.ceil(level * KNEE_STEP)
    unit = 10 ** max(0, len(str(raw)) - 2)
    return max(level + 1, -(-raw // unit) * unit)


def _added(a: dict, b: dict, key: str, q: str) -> float | None:
    if a[key][q] is None or b[key][q] is None:
        return None
    return a[key][q] - b[key][q]


def _ratio(a, b) -> float | None:
    return a / b if a is not None and b else None


def round_of(p: dict) -> int:
    """The sweep a point belongs to (``--repeat``; 1 in documents from before it)."""
    return p.get("round", 1)


def _ratios(points: list[dict]) -> list[dict]:
    by = {(round_of(p), p["server"], p["concurrency"]): p for p in points}
    out = []
    for (r, server, conc), s in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][2])):
        b = by.get((r, "bare", conc))
        if server != "sidecar" or b is None:
            continue
        out.append({"round": r, "concurrency": conc,
                    "turns_per_s": _ratio(s["turns_per_s"], b["turns_per_s"]),
                    "deltas_per_s": _ratio(s["deltas_per_s"], b["deltas_per_s"]),
                    "turn_p50_added_ms": _added(s, b, "turn_ms", "p50"),
                    "turn_p99_added_ms": _added(s, b, "turn_ms", "p99"),
                    "first_delta_p50_added_ms": _added(s, b, "first_delta_ms", "p50"),
                    "first_delta_p99_added_ms": _added(s, b, "first_delta_ms", "p99"),
                    "cpu_per_delta": _ratio(s.get("server_cpu_us_per_delta"), b.get("server_cpu_us_per_delta")),
                    "cpu_per_word": _ratio(s.get("server_cpu_us_per_word"), b.get("server_cpu_us_per_word"))})
    return out


def _totals(doc: dict) -> dict:
    """Every turn sent to the target (calibration and warm-up included)."""
    parts = [p["totals"] for p in doc["points"] if p["server"] == "sidecar"]
    if doc.get("calibration"):
        parts.append(doc["calibration"]["totals"])
    failed: dict[str, int] = {}
    absorbed: dict[str, int] = {}  # prompts that ran in another's turn (absent from documents before them)
    refused: dict[str, int] = {}  # prompts the sidecar refused (absent from documents before them)
    for t in parts:
        for into, counts in ((failed, t["failed"]), (absorbed, t.get("absorbed", {})),
                             (refused, t.get("refused", {}))):
            for why, n in counts.items():
                into[why] = into.get(why, 0) + n
    return {"started": sum(t["started"] for t in parts), "completed": sum(t["completed"] for t in parts),
            "failed": failed, "absorbed": absorbed, "refused": refused, "deltas": sum(t["deltas"] for t in parts),
            "tool_calls": sum(t["tool_calls"] for t in parts)}


def analyse(doc: dict) -> dict:
    """Add ``slo``, each point's ``p99_over_ideal`` / ``first_delta_ok`` /
    ``within_slo`` / ``client_bound`` (stats.client_bound), ``knee`` (sweeps;
    its ``client_bound`` says the first failing point was), ``knee_by_turn``
    (with a first-delta bound: the knee the turns alone set), ``rounds``
    (``--repeat``: each sweep's knees; ``knee`` is then their median,
    _median_knees), ``ratios`` (with the bare server) and ``totals``.

    The SLO is the p99 turn within ``slo`` of the ideal, no errors and, when
    ``first_delta_slo_ms`` was given, the first delta's p99 within it: how
    soon a chat shows text, which a knee set by the turn alone can hide."""
    ideal, source = _ideal(doc)
    bound = doc["options"]["slo"]
    first_bound = doc["options"].get("first_delta_slo_ms")  # (absent from documents before the option)
    limit = ideal * (1 + bound) if ideal else None
    doc["slo"] = {"bound": bound, "ideal_s": ideal, "ideal_source": source, "limit_s": limit,
                  "first_delta_ms": first_bound}
    for p in doc["points"]:
        p99, first = p["turn_ms"]["p99"], p["first_delta_ms"]["p99"]
        p["p99_over_ideal"] = (p99 / 1e3 / ideal) if p99 is not None and ideal else None
        p["first_delta_ok"] = first_bound is None or (first is not None and first <= first_bound)
        p["within_slo"] = bool(limit and p99 is not None and p["error_count"] == 0 and p99 / 1e3 <= limit
                               and p["first_delta_ok"])
        p["client_bound"] = stats.client_bound(p.get("procs"))
    doc["knee"] = doc["knee_by_turn"] = doc["rounds"] = None
    if doc["options"]["sweep"] and limit:
        _sweep_knees(doc, limit, with_first_delta=first_bound is not None)
    doc["ratios"] = _ratios(doc["points"])
    doc["totals"] = _totals(doc)
    return doc


def _sweep_knees(doc: dict, limit: float, with_first_delta: bool) -> None:
    """``knee`` and ``knee_by_turn`` of a sweep; of several (``--repeat``),
    each one's in ``rounds`` and their median (_median_knees) in ``knee``."""
    rounds: dict[int, list[dict]] = {}
    for p in doc["points"]:
        rounds.setdefault(round_of(p), []).append(p)
    per: list[dict[str, Any]] = [
        {"round": r, "knee": _knees(pts, limit, with_first_delta=True),
         # beside it, where the turns alone would have put it
         "knee_by_turn": _knees(pts, limit, with_first_delta=False) if with_first_delta else None}
        for r, pts in sorted(rounds.items())]
    if len(per) == 1:
        doc["knee"], doc["knee_by_turn"] = per[0]["knee"], per[0]["knee_by_turn"]
    elif per:
        doc["rounds"] = per
        doc["knee"] = _median_knees([x["knee"] for x in per])
        if with_first_delta:
            doc["knee_by_turn"] = _median_knees([x["knee_by_turn"] for x in per])


def _knees(points: list[dict], limit: float, with_first_delta: bool) -> dict[str, Any]:
    """Each server's knee (stats.knee) and the sidecar/bare ratio. A point
    is clean with no errors and, ``with_first_delta``, its first delta
    within the SLO's bound."""
    knees: dict[str, Any] = {}
    for server in ("sidecar", "bare"):
        mine = [p for p in points if p["server"] == server]
        if not mine:
            continue
        knees[server] = k = stats.knee(
            [(p["concurrency"], None if p["turn_ms"]["p99"] is None else p["turn_ms"]["p99"] / 1e3,
              p["error_count"] == 0 and (p["first_delta_ok"] or not with_first_delta)) for p in mine], limit)
        # A knee set by a point the client could not drive is the client's.
        k["client_bound"] = any(p["client_bound"] for p in mine if p["concurrency"] == k["first_failing"])
        # How soon text starts there: a knee whose first delta lags is not one a chat can use.
        k["first_delta_p99_ms"] = next((p["first_delta_ms"]["p99"] for p in mine
                                        if p["concurrency"] == k["concurrency"]), None)
    if "bare" in knees:
        s, b = knees["sidecar"], knees["bare"]
        # A knee beyond the sweep is only a lower bound: no ratio from it.
        exact = not (s["beyond_sweep"] or b["beyond_sweep"])
        knees["ratio"] = _ratio(s["concurrency"], b["concurrency"]) if exact else None
        knees["ratio_interpolated"] = _ratio(s["interpolated"], b["interpolated"]) if exact else None
    return knees


def _median_knees(per_round: list[dict]) -> dict[str, Any]:
    """Several sweeps' knees as one. Each server's is the lower median of
    its rounds' knees (a level that was measured; a round with no passing
    point counts lowest), with that round's details, ``by_round`` (every
    round's knee) and ``beyond_sweep_by_round``. A knee beyond its sweep is
    only a lower bound, and so is the median when such a round lies at or
    below it (``beyond_sweep``). The ratio is the lower median of the
    rounds' ratios (one a sweep measured), given only when every round has
    one (``ratio_by_round``: each round's, None where it had none)."""
    out: dict[str, Any] = {}
    for server in ("sidecar", "bare"):
        mine = [k[server] for k in per_round if server in k]
        if not mine:
            continue
        order = sorted(mine, key=lambda k: -1 if k["concurrency"] is None else k["concurrency"])
        at = (len(order) - 1) // 2
        out[server] = {**order[at], "beyond_sweep": any(k["beyond_sweep"] for k in order[:at + 1]),
                       "by_round": [k["concurrency"] for k in mine],
                       "beyond_sweep_by_round": [k["beyond_sweep"] for k in mine]}
    if "bare" in out:
        for name in ("ratio", "ratio_interpolated"):
            each = [k.get(name) for k in per_round]
            out[f"{name}_by_round"] = each
            out[name] = statistics.median_low(each) if None not in each else None  # type: ignore[type-var]
    return out


# -- text ---------------------------------------------------------------------------------

def table(headers: list[str], rows: list[list], title: str = "") -> str:
    """A plain-text table, numbers right-aligned."""
    cells = [[str(h) for h in headers]] + [[fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [all(_is_num(r[i]) or r[i] is None for r in rows) if rows else False for i in range(len(headers))]

    def line(r):
        return "  ".join(c.rjust(w) if numeric[i] else c.ljust(w)
                         for i, (c, w) in enumerate(zip(r, widths))).rstrip()

    out = [title] if title else []
    out.append(line(cells[0]))
    out.append("  ".join("-" * w for w in widths))
    out.extend(line(r) for r in cells[1:])
    return "\n".join(out)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def fmt(v) -> str:
    """Numbers as a person reads them: thousands separators, 3 significant-ish digits."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v != v:
            return "-"
        if abs(v) >= 100:
            return f"{v:,.0f}"
        if abs(v) >= 10:
            return f"{v:.1f}"
        return f"{v:.2f}"
    return str(v)

"""The bench's PNG: a sweep as throughput and latency against concurrency, or
one point as its figures over time. matplotlib (the ``bench`` extra) with the
Agg backend, imported only when a plot is asked for. A sweep run several
times (``--repeat``) is drawn as its median at each level, each sweep's own
figures as faint dots around it.

The image is always ``SIZE_PX`` (no tight bounding box), so a report or a
test can rely on its size.
"""

from __future__ import annotations

import os
import statistics

from .report import round_of
from .text import first_bound

SIZE_PX = (1500, 500)
DPI = 100
COLORS = {"sidecar": "tab:blue", "bare": "tab:orange"}
FORMATS = ("png", "svg", "pdf")  # by the file name's suffix; the size is SIZE_PX at DPI in each


def available() -> str | None:
    """None when matplotlib imports, else why not (for a one-line error)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        return f"--plot needs matplotlib ({e}); install the bench extra: pip install 'agent-sidecar[bench]'"
    return None


def format_problem(path: str) -> str | None:
    """Why ``path`` names no format the plot is written in (None: it names
    one of ``FORMATS``), checked with the options, before anything runs."""
    if os.path.splitext(path)[1][1:].lower() in FORMATS:
        return None
    return f"--plot {path}: name a .png file (or {', '.join('.' + f for f in FORMATS[1:])})"


def _figure(title: str, columns: int):
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, axes = plt.subplots(1, columns, figsize=(SIZE_PX[0] / DPI, SIZE_PX[1] / DPI), dpi=DPI)
    fig.suptitle(title, fontsize=12)
    return plt, fig, axes


def _subtitle(doc: dict) -> str:
    o = doc["options"]
    per = f"{o['duration_s']:g} s/point" if o["turns"] is None else f"{o['turns']} turns/point"
    cut = f" · INTERRUPTED at {doc['interrupted']['at']}" if doc.get("interrupted") else ""
    return (f"{o['prompt']['words']}-word prompt · delivery {o['delivery']} · {per} · "
            f"{doc['machine']['cpus']} CPUs · {doc['machine']['host']}{cut}")


def write(doc: dict, path: str) -> None:
    """Write the plot of ``doc`` (a PNG, or another of ``FORMATS``): the
    sweep plot when there are several concurrency levels, the over-time plot
    for one."""
    levels = sorted({p["concurrency"] for p in doc["points"]})
    plt, fig = (_sweep if len(levels) > 1 else _over_time)(doc, levels)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def _by_server(doc: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for p in sorted(doc["points"], key=lambda p: (p["concurrency"], round_of(p))):
        out.setdefault(p["server"], []).append(p)
    return out


def _median(values: list) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _quantiles(points: list[dict], key: str) -> dict[str, float | None]:
    return {q: _median([p[key][q] for p in points]) for q in ("p50", "p99")}


def _medians(points: list[dict]) -> list[dict]:
    """One point per level, its plotted figures the median over the sweeps
    that ran it (the points of one server, ordered by level)."""
    levels: dict[int, list[dict]] = {}
    for p in points:
        levels.setdefault(p["concurrency"], []).append(p)
    return [{"concurrency": c, "turns_per_s": _median([p["turns_per_s"] for p in ps]),
             "turn_ms": _quantiles(ps, "turn_ms"), "first_delta_ms": _quantiles(ps, "first_delta_ms")}
            for c, ps in levels.items()]


def _ms_to_s(points: list[dict], key: str, q: str) -> list[float | None]:
    return [None if p[key][q] is None else p[key][q] / 1e3 for p in points]


def _knee_label(k: dict | None) -> str:
    if not k:
        return "-"
    if k.get("concurrency") is None:
        return "below the sweep"
    return (">= " if k.get("beyond_sweep") else "") + str(k["concurrency"])


def _sweep_title(doc: dict, levels: list[int]) -> str:
    knees, slo = doc.get("knee") or {}, doc["slo"]
    title = f"agent-sidecar bench: sweep of {len(levels)} concurrency levels"
    if doc.get("rounds"):
        title += f", median of {len(doc['rounds'])} sweeps"
    if knees.get("sidecar"):
        title += (f" · knee (p99 turn within +{100 * slo['bound']:g}% of ideal{first_bound(slo, ',')}): "
                  f"sidecar {_knee_label(knees['sidecar'])}")
        if knees.get("bare"):
            title += f", bare {_knee_label(knees['bare'])}"
            if knees.get("ratio") is not None:
                title += f" ({knees['ratio']:.2f}x)"
    return title + "\n" + _subtitle(doc)


def _sweep(doc: dict, levels: list[int]):
    plt, fig, (tput, lat, first) = _figure(_sweep_title(doc, levels), 3)
    slo, knees = doc["slo"], doc.get("knee") or {}
    lows = []
    for server, each in _by_server(doc).items():
        c = COLORS.get(server, None)
        pts = _medians(each) if doc.get("rounds") else each
        if pts is not each:  # every sweep's own figures, faint, around the median
            ex = [p["concurrency"] for p in each]
            tput.plot(ex, [p["turns_per_s"] for p in each], ".", color=c, alpha=0.35)
            lat.plot(ex, _ms_to_s(each, "turn_ms", "p99"), ".", color=c, alpha=0.35)
            first.plot(ex, [p["first_delta_ms"]["p99"] for p in each], ".", color=c, alpha=0.35)
        xs = [p["concurrency"] for p in pts]
        tput.plot(xs, [p["turns_per_s"] for p in pts], "o-", color=c, label=server)
        p50, p99 = _ms_to_s(pts, "turn_ms", "p50"), _ms_to_s(pts, "turn_ms", "p99")
        lows += [v for v in p50 if v is not None]
        lat.plot(xs, p50, "o--", color=c, label=f"{server} p50")
        lat.plot(xs, p99, "o-", color=c, label=f"{server} p99")
        first.plot(xs, [p["first_delta_ms"]["p99"] for p in pts], "o-", color=c, label=f"{server} p99")
        first.plot(xs, [p["first_delta_ms"]["p50"] for p in pts], "o--", color=c, label=f"{server} p50")
        k = knees.get(server)
        if k and k.get("concurrency"):
            at = xs.index(k["concurrency"])
            lat.plot([k["concurrency"]], [p99[at]], "*", color=c, markersize=16, markeredgecolor="black",
                     label=f"{server} knee {_knee_label(k)}")
            tput.axvline(k["concurrency"], color=c, alpha=0.4, linestyle=":")
    if slo.get("ideal_s"):
        lat.axhspan(slo["ideal_s"], slo["limit_s"], color="green", alpha=0.08)
        lat.axhline(slo["ideal_s"], color="gray", linewidth=1, label=f"ideal {slo['ideal_s']:.3g} s")
        lat.axhline(slo["limit_s"], color="red", linewidth=1, linestyle="--",
                    label=f"SLO +{100 * slo['bound']:g}%")
        lows.append(slo["ideal_s"])
    if slo.get("first_delta_ms") is not None:  # --first-delta-slo: the bound the p99 lines must stay under
        first.axhline(slo["first_delta_ms"], color="red", linewidth=1, linestyle="--",
                      label=f"SLO {slo['first_delta_ms']:g} ms (p99)")
    for ax, ylabel, title in ((tput, "turns / s", "Throughput"),
                              (lat, "turn duration (s)", "Turn duration (shaded: within the SLO)"),
                              (first, "time to first delta (ms)", "First text delta")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels)
        ax.set_xticklabels([str(x) for x in levels])
        ax.minorticks_off()
        ax.set_xlabel("concurrent sessions")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=11)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    tput.set_ylim(bottom=0)
    if lows:
        lat.set_ylim(bottom=0.95 * min(lows))
    firsts = [p["first_delta_ms"][q] for p in doc["points"] for q in ("p50", "p99")
              if p["first_delta_ms"][q]]
    if firsts and max(firsts) > 20 * min(firsts):
        first.set_yscale("log")
    fig.tight_layout()
    return plt, fig


def _over_time(doc: dict, levels: list[int]):
    plt, fig, (tput, lat) = _figure(f"agent-sidecar bench: concurrency {levels[0]} over time\n"
                                    + _subtitle(doc), 2)
    twin = tput.twinx()
    for server, pts in _by_server(doc).items():
        c = COLORS.get(server, None)
        rows = pts[0]["series"]
        xs = [r["t"] + 0.5 for r in rows]
        tput.plot(xs, [r["turns"] for r in rows], "-", color=c, label=f"{server} turns/s")
        twin.plot(xs, [r["deltas"] for r in rows], ":", color=c, label=f"{server} deltas/s")
        lat.plot(xs, [None if r["turn_p50_ms"] is None else r["turn_p50_ms"] / 1e3 for r in rows], "--",
                 color=c, label=f"{server} p50")
        lat.plot(xs, [None if r["turn_p99_ms"] is None else r["turn_p99_ms"] / 1e3 for r in rows], "-",
                 color=c, label=f"{server} p99")
        w0, w1 = pts[0]["series_window"]
        for ax in (tput, lat):
            ax.axvspan(w0, w1, color=c, alpha=0.06)
    slo = doc["slo"]
    if slo.get("ideal_s"):
        lat.axhline(slo["ideal_s"], color="gray", linewidth=1, label=f"ideal {slo['ideal_s']:.2f} s")
        lat.axhline(slo["limit_s"], color="red", linewidth=1, linestyle="--", label=f"SLO +{100 * slo['bound']:g}%")
    tput.set_ylabel("turns completed / s")
    twin.set_ylabel("text deltas / s")
    lat.set_ylabel("turn duration (s), turns ending in that second")
    for ax, title in ((tput, "Throughput (shaded: measure window)"), (lat, "Turn duration")):
        ax.set_xlabel("seconds since the point started")
        ax.set_title(title, fontsize=11)
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    twin.set_ylim(bottom=0)
    lines, labels = tput.get_legend_handles_labels()
    more, more_labels = twin.get_legend_handles_labels()
    tput.legend(lines + more, labels + more_labels, fontsize=8, loc="lower right")
    lat.legend(fontsize=8)
    fig.tight_layout()
    return plt, fig

"""The bench's stdout: a header, the throughput and latency table, CPU and
memory per process (local targets), the sidecar/bare ratios, and the headline
(the knee of a sweep, or the point's verdict)."""

from __future__ import annotations

from .report import fmt, round_of, table
from .stats import CLIENT_BOUND_SHARE

_SHORT = {"loop thread": "loop", "other threads": "threads", "sidecar-writer": "writer",
          "resource-tracker": "tracker"}


def _short(name: str) -> str:
    for long, short in _SHORT.items():
        if name.endswith(long):
            return short
    return name.removeprefix("sidecar-")


def header(doc: dict) -> list[str]:
    o, m = doc["options"], doc["machine"]
    where = (f"local, pid {doc['sidecar_pid']}" if doc["local"]
             else f"{len(o['targets'])} targets: no CPU/RSS figures" if len(o.get("targets", ())) > 1
             else "not on this host: no CPU/RSS figures")
    per_point = f"{o['duration_s']:g} s per point" if o["turns"] is None else f"{o['turns']} turns per point"
    warm = ("auto (one turn per lane)" if o["warmup_s"] is None
            else f"{o['warmup_s']:g} s" + (", and until every lane has started" if o["turns"] is None else ""))
    ramp = doc.get("ramp")  # (absent from a document written before --ramp auto)
    if ramp:
        warm += f" · first turns spread over {ramp['s']:.3g} s"
    load = " ".join(f"{x:.2f}" for x in m["load_avg"]) if m["load_avg"] else "?"
    lines = [f"agent-sidecar bench · {o['target']} ({where}) · profile {o['profile'] or 'main'} · "
             f"prompt {o['prompt']['words']} words · delivery {o['delivery']}"
             + (" · tools" if o["tools"] else ""),
             f"{doc['sessions']['count']} sessions{sessions_fate(doc['sessions'])} · {per_point} · warm-up {warm} · "
             + (f"{o['clients']} client processes · " if o.get("clients", 1) > 1 else "")
             + f"{m['cpus']} CPUs · load avg {load}"]
    slo = doc["slo"]
    if slo["ideal_s"]:
        lines.append(f"ideal turn {slo['ideal_s']:.3f} s ({slo['ideal_source']}) · SLO: p99 turn <= "
                     f"{slo['limit_s']:.3f} s (+{100 * slo['bound']:g}%){first_bound(slo)} with no errors")
    if doc.get("bare"):
        b = doc["bare"]
        reply = ("echo of the prompt" if not b["reply_deltas"]
                 else f"{b['reply_deltas']} deltas of {b.get('delta_words', 1)} word(s)")
        lines.append(f"bare server ({b['source']}): first delta at {b['first_delta_ms']:g} ms, then one every "
                     f"{b['delta_gap_ms']:g} ms, reply {reply}, no persistence")
        caveat = bare_caveat(doc)
        if caveat:
            lines.append(caveat)
    return lines


def sessions_fate(s: dict) -> str:
    """What became of the run's sessions (bench/sessions.py): deleted at the
    end, kept (--keep-sessions), or some left and why; nothing for a
    document written before the bench deleted them."""
    if s.get("kept"):
        return " (kept: --keep-sessions)"
    if "deleted" not in s:
        return ""
    if not s["left"]:
        return " (deleted after the run)"
    return f" ({s['left']:,} of them left in the store: {s['error']})"


def bare_caveat(doc: dict) -> str | None:
    """A warning when the bare server was not reached the way the target
    was: it always runs on this host, with no TLS (bare_process), so against
    a TLS target, or one on another host, the ratios price TLS and the
    network too, not only what the sidecar does (None: reached alike)."""
    o = doc["options"]
    remote = not doc["local"] and len(o.get("targets", ())) <= 1  # (several: never measured as local)
    ways = [(way, cost) for way, cost, yes in (("over TLS", "TLS", o["tls"]),
                                              ("from a host not found here", "the network", remote)) if yes]
    if not ways:
        return None
    return (f"warning: the target is reached {' and '.join(w for w, _ in ways)}, the bare server here over "
            f"plain loopback: the sidecar/bare ratios and added latencies include {' and '.join(c for _, c in ways)}, "
            "not only what the sidecar costs")


def _repeated(doc: dict) -> bool:
    return doc["options"].get("repeat", 1) > 1  # (absent from documents before --repeat)


def _lead(doc: dict, p: dict) -> list:
    """A point's first cells in the tables: its server, its sweep (with --repeat), its level."""
    return [p["server"], *([round_of(p)] if _repeated(doc) else []), p["concurrency"]]


def _lead_headers(doc: dict) -> list[str]:
    return ["server", *(["sweep"] if _repeated(doc) else []), "conc"]


def _where(doc: dict, p: dict) -> str:
    """A point as the warnings name it."""
    return f"{p['server']} c={p['concurrency']}" + (f" (sweep {round_of(p)})" if _repeated(doc) else "")


def _absorbed(doc: dict) -> bool:
    """Whether any prompt ran in another's turn (steered, merged): then the
    tables count them in a column of their own."""
    return any(p.get("absorbed_count") for p in doc["points"]) or bool(doc["totals"].get("absorbed"))


def latency_table(doc: dict) -> str:
    rows = []
    absorbed = _absorbed(doc)
    for p in doc["points"]:
        f, t = p["first_delta_ms"], p["turn_ms"]
        rows.append([*_lead(doc, p), p["turns"], *([p.get("absorbed_count", 0)] if absorbed else []),
                     p["turns_per_s"], p["deltas_per_s"],
                     f["p50"], f["p99"], t["p50"], t["p90"], t["p99"], t["max"], p["p99_over_ideal"],
                     "yes" if p["within_slo"] else "no", p["error_count"]])
    out = table([*_lead_headers(doc), "turns", *(["absorbed"] if absorbed else []), "turns/s", "deltas/s",
                 "first p50", "first p99", "turn p50", "turn p90", "turn p99", "turn max", "p99/ideal", "SLO",
                 "errors"], rows, title="Throughput and latency (ms; first = time to the first text delta)")
    if absorbed:
        out += ("\n  absorbed: prompts that ran in another prompt's turn, not turns of their own (steered into "
                "the running turn, or merged into a newer prompt's turn), in no rate, latency or error")
    return out


def target_table(doc: dict) -> str | None:
    """With several targets: each one's share of every point."""
    rows = []
    for p in doc["points"]:
        for address, t in (p.get("by_target") or {}).items():
            rows.append([*_lead(doc, p), address, t["turns"], t["turns_per_s"],
                         t["first_delta_ms"]["p99"], t["turn_ms"]["p50"], t["turn_ms"]["p99"], t["error_count"]])
    if not rows:
        return None
    return table([*_lead_headers(doc), "target", "turns", "turns/s", "first p99", "turn p50", "turn p99",
                  "errors"], rows, title="Per target (ms)")


# What an error reason says about the load rather than the sidecar, and what to change.
_ERROR_HINTS = {
    "OVERLOADED": "the sidecar refused prompts past its admission limits ([sidecar.limits] "
                  "max_prompts_in_flight, default 1000, and max_prompt_bytes_in_flight): raise them "
                  "to measure beyond",
}


def error_lines(doc: dict) -> list[str]:
    out, seen = [], set()
    for p in doc["points"]:
        if p["errors"]:
            seen.update(p["errors"])
            out.append(f"  errors, {_where(doc, p)}: "
                       + ", ".join(f"{r} {n}" for r, n in sorted(p["errors"].items(), key=lambda kv: -kv[1])))
    out += [f"  {reason}: {hint}" for reason, hint in _ERROR_HINTS.items() if reason in seen]
    return out


def cpu_table(doc: dict) -> str | None:
    """CPU and memory per point; with a column for the processes serving
    the server's own connections (its PostgreSQL backends: bench/sockets.py)
    when any point found some, named after them."""
    peers = _peer_names(doc)
    rows = []
    for p in doc["points"]:
        u = p.get("procs")
        if not u:
            continue
        wall = u["wall_s"] or 1e-9
        parts = " · ".join(f"{_short(g)} {100 * s / wall:.0f}" for g, s in u["threads"].items())
        rss = sum(x["rss_mb"] or 0 for x in u["processes"])
        rows.append([*_lead(doc, p), 100 * u["server_cpu_s"] / wall,
                     p.get("server_cpu_us_per_delta"), p.get("server_cpu_us_per_word"), parts, rss,
                     *([100 * u.get("peers_cpu_s", 0.0) / wall] if peers else []),
                     100 * u["bench_cpu_s"] / wall,
                     100 * u["others_cpu_s"] / wall])
    if not rows:
        return None
    cores = doc["machine"]["cpus"]
    served = f"; {peers} = the processes serving the server's own connections, in no other column" if peers else ""
    return table([*_lead_headers(doc), "CPU %", "µs/delta", "µs/word", "CPU % by process", "RSS MB",
                  *([f"{peers} %"] if peers else []), "bench %", "others %"],
                 rows, title=f"CPU and memory on this host during each measure window "
                             f"(100% = one core of {cores}; bench = {_bench_is(doc)}{served})")


def _peer_names(doc: dict) -> str | None:
    """The names of the peer processes any point found (``postgres``), or None."""
    names = sorted({x["name"] for p in doc["points"] for x in (p.get("procs") or {}).get("peers", ())})
    if not names:
        return None
    return "+".join(names) if len(names) <= 2 else "peers"


def _bench_is(doc: dict) -> str:
    clients = doc["options"].get("clients", 1)
    return "this client" if clients == 1 else f"this process and its {clients} client processes"


def idle_line(doc: dict) -> str | None:
    idle = doc.get("idle_memory")
    if not idle:
        return None
    parts = [f"{x['name']} {fmt(x['rss_mb'])}/{fmt(x['pss_mb'])}" for x in idle]
    rss = sum(x["rss_mb"] or 0 for x in idle)
    pss = sum(x["pss_mb"] or 0 for x in idle)
    return ("sidecar memory before the run (MB RSS/PSS): " + " · ".join(parts)
            + f" · total {fmt(rss)}/{fmt(pss)}")


def ratio_table(doc: dict) -> str | None:
    if not doc["ratios"]:
        return None
    sweep = _repeated(doc)
    rows = [[*([r["round"]] if sweep else []), r["concurrency"], r["turns_per_s"], r["deltas_per_s"],
             r["turn_p50_added_ms"], r["turn_p99_added_ms"], r["first_delta_p50_added_ms"],
             r["first_delta_p99_added_ms"], r["cpu_per_delta"], r["cpu_per_word"]]
            for r in doc["ratios"]]
    return table([*(["sweep"] if sweep else []), "conc", "turns/s x", "deltas/s x", "turn p50 +ms",
                  "turn p99 +ms", "first p50 +ms", "first p99 +ms", "CPU/delta x", "CPU/word x"], rows,
                 title="sidecar / bare (same load and timing, this run): ratios (x) and added latency (+ms)")


def first_bound(slo: dict, sep: str = " and") -> str:
    """The SLO's bound on the first delta, as the header, the headline and the plot's title add it ("" without one)."""
    bound = slo.get("first_delta_ms")
    return f"{sep} first delta p99 <= {bound:g} ms" if bound is not None else ""


def _level_text(concurrency: int | None, lowest: int) -> str:
    return f"< {lowest}" if concurrency is None else str(concurrency)


def _knee_text(k: dict | None, lowest: int, top: int | None) -> str:
    if k is None:
        return "-"
    if "by_round" in k:  # the median of several sweeps': each one's knee is on its own line
        each = [(">= " if beyond else "") + _level_text(c, lowest)
                for c, beyond in zip(k["by_round"], k["beyond_sweep_by_round"])]
        return (">= " if k["beyond_sweep"] else "") + _level_text(k["concurrency"], lowest) + \
            f" (sweeps: {', '.join(each)})"
    if k["concurrency"] is None:
        return f"< {lowest} (the lowest point already missed the SLO)"
    if k["beyond_sweep"]:
        further = f"; the next level would pass --find-knee {top}" if top else ""
        return f">= {k['concurrency']} (every point met the SLO{further})"
    notes = []
    if k["interpolated"] is not None:
        notes.append(f"~{k['interpolated']:.0f} interpolated")
    if k.get("first_delta_p99_ms") is not None:
        notes.append(f"first delta p99 {k['first_delta_p99_ms']:,.0f} ms there")
    if k["non_monotone"]:
        notes.append("a higher point passed again: noisy run")
    if k.get("client_bound"):
        notes.append("client-bound: see the warning")
    return f"{k['concurrency']}" + (f" ({'; '.join(notes)})" if notes else "")


def _knees_text(k: dict, lowest: int, top: int | None) -> str:
    line = f"sidecar {_knee_text(k.get('sidecar'), lowest, top)}"
    if "bare" in k:
        line += f" · bare {_knee_text(k['bare'], lowest, top)}"
        if k["ratio"] is not None:
            line += f" · sidecar/bare {k['ratio']:.2f}x"
            if k["ratio_interpolated"] is not None:
                line += f" ({k['ratio_interpolated']:.2f}x interpolated)"
        elif "ratio_by_round" in k:
            line += " · sidecar/bare: no median (a sweep's knee was only a bound)"
    return line


def client_bound_line(doc: dict) -> str | None:
    """A warning naming the points the bench's own client paced."""
    bound = [_where(doc, p) for p in doc["points"] if p.get("client_bound")]
    if not bound:
        return None
    one = doc["options"].get("clients", 1) == 1
    return (f"warning: {'this bench client' if one else 'a bench client process'} used >= "
            f"{100 * CLIENT_BOUND_SHARE:.0f}% of a core at " + ", ".join(bound)
            + ": there its own CPU paced the load, so those points (and a knee they set) measure the "
            "client as much as the server, which may sustain more than the bench drove"
            + (" (--clients N spreads the load over N processes)" if one else ""))


def headline(doc: dict) -> str:
    slo = doc["slo"]
    if doc.get("knee"):
        k = doc["knee"]
        lowest = min(p["concurrency"] for p in doc["points"])
        top = doc["options"].get("find_knee")  # (absent from documents before the option)
        rounds = doc.get("rounds")  # (absent from documents before --repeat)
        line = (f"knee (largest concurrency with p99 turn <= {slo['limit_s']:.3f} s{first_bound(slo, ',')}, "
                f"no errors){f', median of {len(rounds)} sweeps' if rounds else ''}: "
                + _knees_text(k, lowest, top))
        for x in rounds or ():
            line += f"\n  sweep {x['round']}: " + _knees_text(x["knee"], lowest, top)
        if doc.get("knee_by_turn"):
            line += ("\nby the turn alone (the first delta not bounded): "
                     + _knees_text(doc["knee_by_turn"], lowest, None))
        return line
    parts = []
    for p in doc["points"]:
        verdict = "within" if p["within_slo"] else "NOT within"
        late = "" if p.get("first_delta_ok", True) else f", first delta p99 {fmt(p['first_delta_ms']['p99'])} ms"
        if p["p99_over_ideal"] is not None:
            parts.append(f"{p['server']} c={p['concurrency']}: p99 turn {p['p99_over_ideal']:.2f}x ideal{late}, "
                         f"{verdict} the SLO")
    for r in doc["ratios"]:
        if r["turns_per_s"] is not None:
            parts.append(f"sidecar/bare c={r['concurrency']}: {r['turns_per_s']:.2f}x turns/s, "
                         f"turn p99 {r['turn_p99_added_ms']:+.1f} ms")
    return "; ".join(parts) or "no completed turn"


def render(doc: dict) -> str:
    blocks = ["\n".join(header(doc)), latency_table(doc)]
    errs = error_lines(doc)
    if errs:
        blocks[-1] += "\n" + "\n".join(errs)
    for extra in (target_table(doc), cpu_table(doc), client_bound_line(doc), idle_line(doc), ratio_table(doc)):
        if extra:
            blocks.append(extra)
    t = doc["totals"]
    several = len(doc["options"].get("targets", ())) > 1
    absorbed = sum(t.get("absorbed", {}).values())
    refused = sum(t.get("refused", {}).values())
    blocks.append(f"sent to the target{'s' if several else ''}: {t['started']:,} turns ({t['completed']:,} completed"
                  + "".join(f", {n:,} {r}" for r, n in t["failed"].items()) + ")"
                  + (f", {refused:,} prompts refused ("
                     + ", ".join(f"{n:,} {r}" for r, n in sorted(t["refused"].items())) + ")" if refused else "")
                  + (f", {absorbed:,} prompts absorbed into them ("
                     + ", ".join(f"{n:,} {how}" for how, n in sorted(t["absorbed"].items())) + ")" if absorbed else "")
                  + f", {t['deltas']:,} text deltas"
                  + (f", {t['tool_calls']:,} tool calls ({doc['tool_invocations']:,} answered by the bench's "
                     f"tool host)" if doc["options"]["tools"] else ""))
    if doc.get("interrupted"):  # (absent from documents before runs stopped early kept their points)
        cut, n = doc["interrupted"], len(doc["points"])
        blocks.append(f"INTERRUPTED at {cut['at']}, {cut['message']}: the figures above are the {n} "
                      f"point{'s' if n > 1 else ''} that finished; a point cut short is in none of them")
    blocks.append(headline(doc))
    return "\n\n".join(blocks)

"""``agent-sidecar status``: ask a running sidecar's StatusService (GetStatus)
and show it, as a table (default) or as one JSON object (``--json``).

Exit status 0 with an answer, 1 without one (no sidecar, no admin
credential over TCP, no answer within the timeout), 2 for target options that
cannot work (connection.py); the reason goes to stderr.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from .connection import TargetError, call_metadata, failure, open_channel
from .report import error


def run(args) -> int:
    import grpc

    from ..v1 import status_service_pb2 as pb
    from ..v1 import status_service_pb2_grpc as pb_grpc

    try:
        channel = open_channel(args)
    except TargetError as e:
        error("status", e)
        return 2
    metadata = call_metadata(args)
    with channel:
        try:
            response = pb_grpc.StatusServiceStub(channel).GetStatus(
                pb.GetStatusRequest(), metadata=metadata, timeout=args.timeout)
        except grpc.RpcError as e:
            error("status", f"{args.target}: {failure(args, e)}")
            return 1
    status = as_dict(response)
    print(json.dumps(status, indent=2) if args.json else as_table(status))
    return 0


def as_dict(r) -> dict[str, Any]:
    """The response as plain JSON types (numbers as numbers, times in RFC 3339;
    the store's size and full-text backlog null when the sidecar could not
    read them: its 0 then is no measurement)."""
    from ..delivery import MODE_NAMES
    started = datetime.fromtimestamp(r.started_at.ToNanoseconds() / 1e9, UTC)
    s, c = r.store, r.cluster
    cluster = {"lanes_held": c.lanes_held, "lanes_taken_over": c.lanes_taken_over,
               "leases_lost": c.leases_lost, "fenced_writes": c.fenced_writes} if r.HasField("cluster") else None
    return {
        "version": r.version, "node_id": r.node_id,
        "started_at": started.isoformat(timespec="seconds").replace("+00:00", "Z"),
        "uptime_seconds": round(r.uptime_seconds, 3), "serving": r.serving,
        "workers": [{"index": w.index, "pid": w.pid, "alive": w.alive, "rss_bytes": w.rss_bytes,
                     "turns_run": w.turns_run, "turns_running": w.turns_running,
                     "restarts": w.restarts} for w in r.workers],
        "turns_in_flight": r.turns_in_flight, "prompts_admitted": r.prompts_admitted,
        "queues": {MODE_NAMES.get(q.delivery, str(q.delivery)): q.prompts for q in r.queues},
        "store": {"backend": s.backend, "size_bytes": None if s.stats_unavailable else s.size_bytes,
                  "fts_backlog": None if s.stats_unavailable else s.fts_backlog,
                  "writable": s.writable, "writer_pid": s.writer_pid,
                  "writer_rss_bytes": s.writer_rss_bytes, "writer_backlog": s.writer_backlog,
                  "last_commit_seconds": s.last_commit_seconds, "commits": s.commits,
                  "writer_stalled_seconds": s.writer_stalled_seconds},
        "cluster": cluster,
    }


def _bytes(n: int) -> str:
    x = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if x < 1024 or unit == "GiB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return ""


def _duration(seconds: float) -> str:
    s = int(seconds)
    d, h, m = s // 86400, s // 3600 % 24, s // 60 % 60
    return (f"{d}d " if d else "") + (f"{h}h " if d or h else "") + f"{m}m {s % 60}s"


def _rows(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(x) for x in col) for col in zip(headers, *rows)]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [headers, *rows]]


def as_table(st: dict[str, Any]) -> str:
    out = [f"agent-sidecar {st['version']}  node {st['node_id']}",
           f"  {'SERVING' if st['serving'] else 'NOT SERVING'} · up {_duration(st['uptime_seconds'])} "
           f"(since {st['started_at']})", "", "workers"]
    out += _rows(["slot", "pid", "alive", "rss", "turns run", "running", "restarts"],
                 [[str(w["index"]), str(w["pid"]), "yes" if w["alive"] else "no", _bytes(w["rss_bytes"]),
                   str(w["turns_run"]), str(w["turns_running"]), str(w["restarts"])] for w in st["workers"]])
    out += ["", f"turns in flight {st['turns_in_flight']} · prompts admitted {st['prompts_admitted']}",
            "queued  " + "  ".join(f"{mode} {n}" for mode, n in st["queues"].items()), ""]
    s = st["store"]
    out += ["store",
            f"  {s['backend']} · " + ("size unknown" if s["size_bytes"] is None else _bytes(s["size_bytes"]))
            + " · " + ("writable" if s["writable"] else "NOT WRITABLE") + " · full-text backlog "
            + ("unknown" if s["fts_backlog"] is None else f"{s['fts_backlog']} messages"),
            f"  writer pid {s['writer_pid']} ({_bytes(s['writer_rss_bytes'])}) · backlog "
            f"{s['writer_backlog']} jobs · last commit {s['last_commit_seconds'] * 1e3:.2f} ms · "
            f"{s['commits']} commits"
            + (f" · NO ANSWER for {s['writer_stalled_seconds']:.1f} s" if s["writer_stalled_seconds"] >= 1 else "")]
    c = st["cluster"]
    if c is not None:
        out += ["", "cluster",
                f"  lanes held {c['lanes_held']} · taken over {c['lanes_taken_over']} · leases lost "
                f"{c['leases_lost']} · fenced writes {c['fenced_writes']}"]
    return "\n".join(out)

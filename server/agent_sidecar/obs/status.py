"""The snapshot GetStatus answers with (and ``agent-sidecar status`` shows):
what the sidecar is, how long it has run, its processes, its turns and
queues, its store, and on a cluster its leases. Read from the live state (live.py) when asked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .live import ClusterInfo, Live, WorkerInfo, WriterInfo


@dataclass(frozen=True)
class StatusSnapshot:
    version: str
    node_id: str
    started_at: float  # Unix time
    uptime_seconds: float
    serving: bool
    workers: list[WorkerInfo]
    turns_in_flight: int
    prompts_admitted: int
    queued: dict[int, int]  # delivery mode -> prompts waiting
    backend: str  # the store's: sqlite or postgres
    store_writable: bool
    writer: WriterInfo | None
    store: Any = None  # store.records.StoreStats, or None when it could not be read
    cluster: ClusterInfo | None = None  # None off a cluster


async def snapshot(live: Live) -> StatusSnapshot:
    turns = live.turns
    return StatusSnapshot(
        version=live.version, node_id=live.node_id(), started_at=live.started_at,
        uptime_seconds=live.uptime(), serving=live.serving(), workers=live.workers(),
        turns_in_flight=live.in_flight(), prompts_admitted=len(turns.live) if turns is not None else 0,
        queued=live.queue_depths(), backend=live.runtime.cfg.store.backend,
        store_writable=live.store_writable(), writer=live.writer(), store=await live.store_stats(),
        cluster=live.cluster())

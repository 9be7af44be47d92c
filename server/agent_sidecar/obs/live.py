"""The running sidecar's state, read on demand for a scrape or a GetStatus
call: nothing here runs unless asked, so the hot paths pay nothing for it.

``Live`` reads the objects runtime.py wires (the turn manager, its worker
pool, the store, the tool registry) and the counters they keep as plain
numbers (turns/stats.py, store/writer/client.py CommitStats, api/auth.py).
It imports none of them (duck-typed on purpose: obs/ sits beside the layers,
and every layer may hook into obs/ without an import cycle). Everything is
read on the event loop, where those objects change, so a read never sees one
half-updated.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from .. import __version__
from ..delivery import MODE_NAMES

log = logging.getLogger("agent_sidecar.obs")

# The longest a scrape or a GetStatus waits for the store's size and index
# backlog (Live.store_stats): they answer without them after that.
STATS_WAIT_S = 1.0


def rss_bytes(pid: int) -> int:
    """A process's resident memory (VmRSS of /proc/PID/status); 0 when it is gone."""
    if pid <= 0:
        return 0
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


@dataclass(frozen=True)
class WorkerInfo:
    index: int
    pid: int
    alive: bool  # ready (a dead one is being replaced)
    rss_bytes: int
    turns_run: int  # turns dispatched to the slot since the start
    turns_running: int  # its turns in flight now
    restarts: int


@dataclass(frozen=True)
class WriterInfo:
    pid: int
    rss_bytes: int
    backlog: int  # jobs not answered yet
    last_commit_seconds: float
    commits: int
    stalled_seconds: float  # jobs waiting with no answer from the writer for this long (0: none waits)


@dataclass(frozen=True)
class ClusterInfo:
    lanes_held: int
    lanes_taken_over: int
    leases_lost: int
    fenced_writes: int


class Live:
    """``runtime``: the Sidecar of runtime.py (its cfg, store, turns, tools, auth)."""

    def __init__(self, runtime: Any):
        self.runtime = runtime
        self.started_at = time.time()
        self._t0 = time.monotonic()
        self.version = __version__
        self._stats_read: asyncio.Future | None = None  # the store stats read under way, if any

    @property
    def turns(self) -> Any:
        return self.runtime.turns

    def node_id(self) -> str:
        return self.runtime.cfg.node_id()

    def uptime(self) -> float:
        return time.monotonic() - self._t0

    def large_request_bytes(self) -> int:
        """Bytes of the large requests being handled (api/request_budget.py)."""
        return self.runtime.requests.held

    def serving(self) -> bool:
        """What health says (api/readiness.py): the restore done, no drain,
        the store writable and its writer not stalled past ``[store]
        stall_not_serving_s``."""
        turns, readiness = self.turns, self.runtime.readiness
        return bool(turns is not None and turns.ready.is_set() and turns.accepting
                    and not turns.draining and self.store_writable()
                    and not (readiness is not None and readiness.stalled))

    def store_writable(self) -> bool:
        store = self.runtime.store
        return bool(store is not None and store.writable)

    def workers(self) -> list[WorkerInfo]:
        turns = self.turns
        pool = turns.pool if turns is not None else None
        if pool is None:
            return []
        running: dict[int, int] = {}
        for t in turns.live.values():
            if t.worker is not None and t.in_flight:
                running[t.worker.index] = running.get(t.worker.index, 0) + 1
        return [WorkerInfo(h.index, h.pid, h.ready.is_set(), rss_bytes(h.pid) if h.ready.is_set() else 0,
                           h.turns_run, running.get(h.index, 0), h.restarts) for h in pool.handles]

    def in_flight(self) -> int:
        """Turns started whose end has not committed."""
        return self.turns.open_turns() if self.turns is not None else 0

    def queue_depths(self) -> dict[int, int]:
        """Prompts waiting in their lanes, by delivery mode (every mode, 0 included)."""
        out = dict.fromkeys(MODE_NAMES, 0)
        if self.turns is not None:
            for lane in self.turns.lanes.values():
                if lane.depth():
                    for t in lane.waiting():
                        out[t.delivery] = out.get(t.delivery, 0) + 1
        return out

    def cluster(self) -> ClusterInfo | None:
        """This node's leases and what it lost of them (cluster/leases.py);
        None off a cluster."""
        leases = self.turns.leases if self.turns is not None else None
        if leases is None:
            return None
        return ClusterInfo(len(leases.held), leases.taken_over, leases.leases_lost, leases.fenced_writes)

    def writer(self) -> WriterInfo | None:
        store = self.runtime.store
        if store is None:
            return None
        c = store.commit_stats
        return WriterInfo(c.pid, rss_bytes(c.pid), c.backlog, c.last_seconds, c.seconds.count, c.stalled_seconds)

    async def store_stats(self) -> Any:
        """The store's StoreStats, or None when it cannot be read now (closed,
        failing) or does not answer within STATS_WAIT_S.

        Bounded because a scrape and GetStatus are how an operator sees a
        database or disk that hangs (``store_writer_stalled_seconds``, the
        status's ``NO ANSWER``): they must answer while it hangs, not hang
        with it (a read on a connection to a stalled PostgreSQL waits for
        as long as the stall). At most one read is under way: one that
        outlives its wait goes on, and the next callers wait on it rather
        than pile reads (and read connections) up behind a store that does
        not answer."""
        store = self.runtime.store
        if store is None:
            return None
        if self._stats_read is None or self._stats_read.done():
            self._stats_read = asyncio.ensure_future(_read_stats(store))
        try:
            async with asyncio.timeout(STATS_WAIT_S):
                return await asyncio.shield(self._stats_read)
        except TimeoutError:
            log.debug("store stats not answered in time", extra={"wait_s": STATS_WAIT_S})
            return None


async def _read_stats(store: Any) -> Any:
    try:
        return await store.stats()
    except Exception as e:  # a read of a failing store: the rest of the answer still counts
        log.debug("store stats unavailable", extra={"error": f"{type(e).__name__}: {e}"})
        return None

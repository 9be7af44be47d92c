"""What grpc.health.v1 says while the sidecar serves, and why.

SERVING, unless:

* the store cannot write (a fault: a full disk, an I/O error, a database
  out of reach): every write and new prompt is refused meanwhile, so a
  probe must send new conversations elsewhere; or
* the store's writer has left writes unanswered for ``[store]
  stall_not_serving_s`` (a disk or a database that hangs rather than fails).
  Nothing is refused then, the writes wait, but a prompt sent now waits
  too, for as long as the hang lasts: a readiness probe should take the
  sidecar out of rotation until it answers again.

The start (NOT_SERVING until the restore is done) and the drain
(``enter_graceful_shutdown``) are the runtime's; after ``close`` nothing
here touches health any more. The unit's ``STATUS=`` (sd_notify) says the
same in words.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from grpc_health.v1 import health_pb2

from ..store import Store
from .server import SidecarHealth

log = logging.getLogger("agent_sidecar.health")


class Readiness:
    """Health following the store: its faults (``store_changed``, a
    ``Store.watch_faults`` listener) and its writer's stalls (polled)."""

    def __init__(self, health: SidecarHealth, store: Store, stall_s: float,
                 notify: Callable[[str], object]):
        self.health, self.store, self.stall_s, self.notify = health, store, stall_s, notify
        self.stalled = False
        self._closed = False
        self._watch: asyncio.Task | None = None
        self._sets: set[asyncio.Task] = set()

    async def start(self) -> None:
        """Set health now (the restore is done; the caller sends ``READY=1``
        with ``status_line``), then follow the writer's stalls."""
        await self.health.set("", self._status())
        if self.stall_s > 0:
            self._watch = asyncio.get_running_loop().create_task(self._follow_stalls())

    def close(self) -> None:
        """The drain has health now: stop following the store."""
        self._closed = True
        if self._watch is not None:
            self._watch.cancel()

    def store_changed(self, fault) -> None:
        self.publish()

    def status_line(self) -> str:
        """sd_notify's STATUS= for the store's state."""
        if self.store.fault is not None:
            return "STATUS=serving reads only: the store cannot write"
        if self.stalled:
            return f"STATUS=serving: the store has not answered writes for over {self.stall_s:g} s"
        return "STATUS=serving"

    def _status(self) -> int:
        if self.store.fault is None and not self.stalled:
            return health_pb2.HealthCheckResponse.SERVING
        return health_pb2.HealthCheckResponse.NOT_SERVING

    def publish(self) -> None:
        if self._closed:
            return
        self.notify(self.status_line())
        task = asyncio.get_running_loop().create_task(self.health.set("", self._status()))
        self._sets.add(task)
        task.add_done_callback(self._sets.discard)

    async def _follow_stalls(self) -> None:
        stats = self.store.commit_stats
        while True:
            await asyncio.sleep(min(1.0, self.stall_s / 4))
            waited = stats.stalled_seconds
            stalled = waited >= self.stall_s
            if stalled == self.stalled:
                continue
            self.stalled = stalled
            if stalled:
                log.warning("the store has not answered writes: health NOT_SERVING until it does",
                            extra={"waited_s": round(waited, 1), "stall_not_serving_s": self.stall_s})
            else:
                log.info("the store answers writes again")
            self.publish()

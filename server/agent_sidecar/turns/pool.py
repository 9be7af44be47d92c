"""The worker pool, parent side: spawn, route, watch, replace.

Workers are spawned (``spawn`` start method) and answering before the gRPC
server starts. A session key maps to a worker *slot* by rendezvous hashing of
the key over the slots, so a session always meets its warm agent; a dead
worker is replaced in the same slot, so its sessions stay put.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..children import Channel, ChildProcess, spawn, start_together
from ..logs import FaultEpisode
from . import wire

log = logging.getLogger("agent_sidecar.workers")
WORKER_MAIN = "agent_sidecar.turns.worker:worker_main"  # what a worker process runs
RESPAWN_FIRST_S, RESPAWN_MAX_S = 0.5, 5.0  # a failed replacement's retry: doubling, at most this


@functools.lru_cache(maxsize=1 << 16)
def rendezvous(key: str, slots: int) -> int:
    """Highest-random-weight hashing: the slot with the largest hash(key, slot).
    Asked for every turn: the answers for the keys seen lately are kept."""
    best, best_score = 0, b""
    kb = key.encode()
    for slot in range(slots):
        score = hashlib.blake2b(kb + slot.to_bytes(4, "big"), digest_size=8).digest()
        if score > best_score:
            best, best_score = slot, score
    return best


class WorkerHandle:
    def __init__(self, index: int):
        self.index = index
        self.process: ChildProcess | None = None
        self.channel: Channel | None = None
        self.ready = asyncio.Event()
        self.pid = 0
        self.info: dict[str, Any] = {}
        self.generation = 0
        self.turns_run = 0  # turns dispatched to this slot, every incarnation
        self.restarts = 0  # deaths of this slot's worker (each is replaced)
        # Why the slot's replacement worker failed to start, while it keeps
        # failing (a broken install); ``failing`` is set meanwhile, so turns
        # waiting for the slot end instead of waiting out their timeout.
        self.failure: str | None = None
        self.failing = asyncio.Event()

    def send(self, msg: Mapping[str, Any]) -> None:
        if self.channel is not None:
            self.channel.send(msg)


class WorkerPool:
    """``on_message(handle, msg)`` gets every message a worker sends;
    ``on_exit(handle)`` runs when a worker dies (before its replacement)."""

    def __init__(self, count: int, settings: dict[str, Any],
                 on_message: Callable[[WorkerHandle, dict], None],
                 on_exit: Callable[[WorkerHandle], None]):
        self.settings = settings
        self.handles = [WorkerHandle(i) for i in range(count)]
        self.on_message, self.on_exit = on_message, on_exit
        self._readers: list[asyncio.Task] = []
        self._stopping = False

    def slot_for(self, key: str) -> WorkerHandle:
        return self.handles[rendezvous(key, len(self.handles))]

    async def start(self) -> None:
        """Every worker up and answering; if one cannot start, none is left
        starting (those up already are the caller's to stop)."""
        await start_together(*(self._spawn(h) for h in self.handles))

    async def _spawn(self, h: WorkerHandle, timeout: float = 60.0, quiet: bool = False) -> None:
        lost = asyncio.Event()
        proc, channel, info = await spawn(
            WORKER_MAIN, (h.index, self.settings), f"agent-sidecar-worker-{h.index}",
            functools.partial(self.on_message, h), lost.set, timeout, quiet=quiet)
        h.process, h.channel, h.pid, h.info = proc, channel, info["pid"], info
        h.generation += 1
        h.failure = None
        h.failing.clear()
        h.ready.set()
        log.info("worker ready", extra={"index": h.index, "pid": h.pid,
                                        "grpc_loaded": info.get("grpc_loaded")})
        self._readers.append(asyncio.get_running_loop().create_task(self._watch(h, channel, lost, proc)))

    async def _watch(self, h: WorkerHandle, channel: Channel, lost: asyncio.Event, proc) -> None:
        """Wait for the worker's end of the pipe to close; replace a dead worker."""
        await lost.wait()
        if self._stopping:
            return
        h.ready.clear()
        if h.channel is channel:
            h.channel = None
        await asyncio.get_running_loop().run_in_executor(None, proc.join, 5)
        said = {"error": proc.failure} if proc.failure else {}  # why, if it could say (child.py)
        log.error("worker died", extra={"index": h.index, "pid": h.pid, **proc.ending(), **said})
        h.restarts += 1
        try:
            self.on_exit(h)
        except Exception:
            log.exception("cleaning up after a dead worker failed")
        await self._respawn(h)

    async def _respawn(self, h: WorkerHandle) -> None:
        """Replace the worker of slot ``h`` until one starts, waiting longer
        after each failure (RESPAWN_FIRST_S doubling to RESPAWN_MAX_S). A
        replacement that keeps failing (a broken install) is one warning, the
        first child's own line and the rest at debug: not two error lines, a
        traceback and a new process every half second for as long as it lasts."""
        episode, wait = FaultEpisode(log, "respawning worker failed; retrying"), RESPAWN_FIRST_S
        while not self._stopping:
            try:
                await self._spawn(h, quiet=episode.failing)
                return
            except Exception as e:
                h.failure = str(e) or type(e).__name__
                h.failing.set()
                episode.failed(index=h.index, error=h.failure, retry_in_s=wait)
            await asyncio.sleep(wait)
            wait = min(wait * 2, RESPAWN_MAX_S)

    def broadcast(self, msg: dict) -> None:
        for h in self.handles:
            h.send(msg)

    async def stop(self, timeout: float = 5.0) -> None:
        """Ask every worker to stop and give them ``timeout`` seconds in all
        (not each: a pool of stuck workers, their loops blocked, would keep
        the stop 5 s per worker, past a supervisor's stop timeout on a large
        machine); those still running then are killed, and named."""
        self._stopping = True
        self.broadcast(wire.STOP)
        loop = asyncio.get_running_loop()
        procs = {h.index: h.process for h in self.handles if h.process is not None}
        await loop.run_in_executor(None, _join_all, list(procs.values()), timeout)
        stuck = {index: p for index, p in procs.items() if p.is_alive()}
        if stuck:
            log.warning("workers did not stop in time; killed", extra={"workers": list(stuck), "timeout_s": timeout})
            for p in stuck.values():
                p.kill()
            await loop.run_in_executor(None, _join_all, list(stuck.values()), timeout)  # reaped
        for t in self._readers:
            t.cancel()


def _join_all(procs: list[ChildProcess], timeout: float) -> None:
    """Wait for every process to exit, ``timeout`` seconds at most in all."""
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))

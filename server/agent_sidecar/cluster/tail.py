"""The cluster tail: frames of turns run on any sidecar sharing this store,
delivered to this sidecar's watchers; and the other sidecars' deletes,
mirrored here.

One task per sidecar follows the store (``SharedStore.follow_cluster``: one
connection LISTENing on the frames and control channels). Every commit with
frames, on any node, notifies its highest cursor; the tail then reads every
frame after its own cursor, a page at a time in cursor order, and hands each
to the WatchActivity subscribers of its session key and platform (the
FrameBus's ``by_key``/``by_platform``, which the bus itself no longer feeds)
and of its request id (``follow_request``: a turn running on another node).
Frame cursors grow with commit order across the cluster (store/postgres/
ledger.py), so reading ``cursor > last`` never skips a frame that commits
later: each subscriber gets every frame once, in cursor order, this node's
own frames included.

What a subscriber may rely on: at the moment it subscribes, every frame up to
the tail's cursor has committed and every later one will be pushed to it. So
a watcher that subscribes first and then replays the store from its resume
point, skipping what it already sent (by cursor, or by seq for one request),
has neither a gap nor a duplicate. Nobody watching, the cursor just moves on
to the newest commit without reading frames (checked again after any read it
awaited, so a watcher arriving meanwhile is never skipped).

The follower yields 0 once it listens, after every reconnect and after every
quiet interval (``CATCH_UP_EVERY_S``): the tail then catches up by cursor. That
is the safety net for a notification lost with its connection, not the main
path: notifications wake the tail as each commit lands.

A ``ClusterOp`` from another node (ClearAll, DeleteSession, Prune it ran) is
mirrored here as this node's own call would act before its job: its lanes'
turns end, cached agents leave the workers, request ids leave the dedup index.
Announces are not replayed: those sent while the listening connection was
down are caught up on from the tables when it listens again
(``forget_deleted``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from ..store import StoreUnavailable
from ..store.interface import SharedStore
from ..store.records import ClusterOp, FrameRecord
from ..turns import lane_admin, wire
from ..turns.frames import frame_from_record
from ..turns.subscriber import StreamedFrame, Subscriber
from ..turns.supervision import until_ended

log = logging.getLogger("agent_sidecar.cluster")

PAGE = 1000  # frames per read while catching up
KNOWN_CHUNK = 10_000  # request ids per read when catching up on missed deletes
CATCH_UP_EVERY_S = 10.0  # the safety net's period: a catch-up after this long without one
RETRY_MIN_S, RETRY_MAX_S = 0.05, 2.0  # following again after a lost connection


class FrameTail:
    """``await start()`` before any watcher can subscribe; ``await stop()`` at the end."""

    def __init__(self, store: SharedStore, turns: Any, node_id: str, *, page: int = PAGE,
                 idle_s: float = CATCH_UP_EVERY_S):
        self.store, self.turns, self.node_id = store, turns, node_id
        self.bus = turns.bus
        self.page, self.idle_s = page, idle_s
        self.cursor = 0  # every frame up to here was delivered (or nobody watched it)
        self.by_request: dict[str, set[Subscriber]] = {}
        self._task: asyncio.Task | None = None
        self._mirrors: set[asyncio.Task] = set()  # other nodes' deletes mirrored here, and catch-ups
        self._listened = False  # whether the follower listened before (a reconnect: catch up on deletes)

    async def start(self) -> None:
        """From the newest committed frame on; the bus stops feeding the watchers."""
        self.cursor = self.bus.watch_head = await self.store.last_frame_cursor()
        self.bus.feeds_watchers = False
        self._task = asyncio.get_running_loop().create_task(self._run(), name="cluster-tail")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._mirrors) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- following one request (a turn another node runs) ------------------------------------

    def follow_request(self, request_id: str) -> Subscriber:
        """A queue of that request's frames from now on (subscribe, then read the store)."""
        sub = self.bus.subscriber()
        self.by_request.setdefault(request_id, set()).add(sub)
        return sub

    def unfollow_request(self, request_id: str, sub: Subscriber) -> None:
        subs = self.by_request.get(request_id)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self.by_request[request_id]

    # -- the loop ------------------------------------------------------------------------

    async def _run(self) -> None:
        delay = RETRY_MIN_S
        while True:
            listening = False
            try:
                async with contextlib.aclosing(self.store.follow_cluster(self.idle_s)) as notes:
                    async for note in notes:
                        if not listening:  # the first note: listening, again after a lost connection
                            listening = True
                            if self._listened:  # what was announced meanwhile is not replayed
                                self._spawn(forget_deleted(self.store, self.turns))
                            self._listened = True
                        if isinstance(note, ClusterOp):
                            self._mirror(note)
                        elif note == 0 or note > self.cursor:
                            await self._catch_up(note)
                            if delay > RETRY_MIN_S:
                                log.info("cluster tail: following the store again")
                            delay = RETRY_MIN_S
            except asyncio.CancelledError:
                raise
            except StoreUnavailable as e:  # one line per outage, not one per attempt
                log.log(logging.WARNING if delay == RETRY_MIN_S else logging.DEBUG,
                        "cluster tail: the store is out of reach; following again",
                        extra={"error": e.message, "cause": e.cause or None, "retry_in_s": delay})
            except Exception:
                log.exception("cluster tail failed; following again")
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)

    def _watched(self) -> bool:
        return bool(self.bus.by_key or self.bus.by_platform or self.by_request)

    async def _catch_up(self, target: int) -> None:
        """Every frame after the cursor, in cursor order, to its subscribers.
        ``target``: the commit that woke us (0: find the newest)."""
        if not self._watched():
            top = target or await self.store.last_frame_cursor()
            if not self._watched():  # still nobody: nothing to read
                self.cursor = self.bus.watch_head = max(self.cursor, top)
                return
        while True:
            records = await self.store.frames_after(self.cursor, limit=self.page)
            for record in records:
                self._deliver(record)
            if records:
                self.cursor = self.bus.watch_head = max(self.cursor, records[-1].cursor)
            if len(records) < self.page:
                return

    def _deliver(self, r: FrameRecord) -> None:
        by_key, by_platform = self.bus.by_key.get(r.session_key), self.bus.by_platform.get(r.platform)
        by_request = self.by_request.get(r.request_id)
        if not (by_key or by_platform or by_request):
            return
        item = StreamedFrame(frame_from_record(r))
        if by_key or by_platform:
            self.bus.to_watchers(item, r.session_key, r.platform)
        if by_request:
            for sub in tuple(by_request):
                if not sub.push(item):  # dropped: its stream reads on from the store, or says where to resume
                    self.unfollow_request(r.request_id, sub)

    # -- other nodes' deletes --------------------------------------------------------------

    def _mirror(self, op: ClusterOp) -> None:
        if op.origin == self.node_id:  # ours: done before the job ran
            return
        self._spawn(mirror(self.turns, op))

    def _spawn(self, work) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._mirrors.add(task)
        task.add_done_callback(self._mirrors.discard)


async def mirror(turns: Any, op: ClusterOp) -> None:
    """Another node's ClearAll, DeleteSession or Prune, on this node. Its
    job committed already and revoked the lanes' leases, so nothing this node
    still writes of them can land (the fence): the leases it held of them are
    forgotten and their turns here stop at once, unwritten, their streams
    ending CANCELLED (``ClusterLeases.cleared``); then what this node's own
    call does (``lane_admin.clear_all``; for a delete, ``lane_admin.evict``,
    short of taking the lane's lease): cached agents evicted, request ids
    forgotten (their ledger rows are gone, so a reuse runs anew). Pruned
    lanes were idle: only their cached agents go."""
    log.info("mirroring another node's delete", extra={"op": op.op, "keys": len(op.keys),
                                                       "origin": op.origin})
    try:
        if op.op == "clear_all":
            turns.recent.forget(None)
            if turns.leases is not None:  # the job revoked every lease: what runs here stops unwritten
                turns.leases.cleared(None)
            await lane_admin.clear_all(turns)
        elif op.op == "delete":
            if turns.leases is not None:
                turns.leases.cleared(op.keys)
            for key in op.keys:
                turns.recent.forget(key)
                lane_admin.evict(turns, key)
            await until_ended(turns, [t for t in turns.live.values() if t.key in op.keys])
        elif op.op == "prune":
            busy = turns.busy_keys()
            for key in op.keys:
                if key not in busy and turns.pool is not None:
                    turns.pool.slot_for(key).send(wire.evict(key))
        else:
            log.warning("unknown cluster op", extra={"op": op.op, "origin": op.origin})
    except StoreUnavailable as e:  # the turns cannot end now; the store's recovery closes them
        log.warning("could not mirror another node's delete", extra={"op": op.op, "error": e.message})
    except Exception:
        log.exception("could not mirror another node's delete", extra={"op": op.op})


async def forget_deleted(store: SharedStore, turns: Any) -> None:
    """After the listening connection came back: the deletes announced while it
    was down are not replayed (NOTIFY reaches connected listeners only), so
    what their mirror does to this node's memory is done from the tables. The
    request ids this node remembers whose ledger rows are gone are forgotten
    (a reuse runs a new turn instead of answering REQUEST_NOT_FOUND for the
    whole dedup window), and their sessions' cached agents leave the workers
    where no turn runs. The missed delete's lanes are its lease renewal's to
    find, within a third of a TTL (cluster/leases.py: their turns end
    CANCELLED); a missed prune only leaves cached agents, which age out."""
    remembered = turns.recent.snapshot()
    rids = list(remembered)
    try:
        known: set[str] = set()
        for i in range(0, len(rids), KNOWN_CHUNK):
            known |= await store.known_requests(rids[i:i + KNOWN_CHUNK])
    except StoreUnavailable as e:
        log.warning("cluster tail: could not catch up on deletes missed while not listening",
                    extra={"error": e.message})
        return
    gone = {rid: e for rid, e in remembered.items() if rid not in known and rid not in turns.live}
    if not gone:
        return
    turns.recent.forget_ids(gone)
    busy = turns.busy_keys()
    for key in {key for _, key in gone.values()} - busy:
        if turns.pool is not None:
            turns.pool.slot_for(key).send(wire.evict(key))
    log.info("cluster tail: forgot request ids deleted while not listening", extra={"ids": len(gone)})

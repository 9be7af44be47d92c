"""``ClusterLeases``: this node's leases on the lanes it runs (turns/leasing.py's
``LaneLeases``), on a PostgreSQL store several sidecars share.

Guarantees, and why:

* A lane runs on at most one node. A prompt (or a lane admin call) for a lane
  this node does not hold takes the lease first (``hold``), in a store job
  that also restores what the lane's last node left (cluster/jobs.py); a
  lane another live node holds raises ``LaneElsewhere`` and api/ forwards
  the call there.
* Every write of a turn carries the epoch its lane was held at, and the store
  refuses it once the epoch has moved (the fence, checked in the same
  transaction as the write). So a node that stalled past its lease (a
  SIGSTOP, a partition) can never write after another node took the lane,
  whatever its clock says.
* Leases are renewed every third of ``lease_ttl_s``; a lane whose renewal has
  not been confirmed for ``SAFE`` of the TTL (measured on this node's
  monotonic clock from when the renewal was *sent*, so a slow answer only
  shortens it) is dropped here before its lease can run out in the database,
  where expiry is judged on the database's clock: the node stops running the
  lane before anyone else may start it (``distrusted``). Its turns' streams
  end as the store says the lane went (cluster/verdict.py): LANE_MOVED, or
  CANCELLED when the session was deleted meanwhile. A node that stalls
  itself cannot stop them: each turn's worker stops it by itself at
  ``stop_at`` (a renewal moves it on, ``supervision.trust``), between the end of
  the trust and that of the lease, and a tool call it sent meanwhile is not
  made (turns/worker_events.py).
* A lane idle here for a TTL is let go, so the next prompt can land on any
  node without waiting; a clean stop lets every lane go (except those whose
  turn its drain cut off: left to run out, for a continue turn elsewhere)
  and writes the node's marker. Lanes whose node died with work acknowledged
  or a turn cut off are taken over by a reaper on every node once their
  lease runs out (cluster/jobs.py take_orphans: once per holder gone).
* A delete revokes its lanes' leases (``cleared``): this node forgets them
  and stops their turns, unwritten.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING

from ..config import Config
from ..errors import LANE_MOVED, SidecarError
from ..logs import FaultEpisode
from ..store import StoreUnavailable
from ..store.interface import SharedStore
from ..store.records import LeaseHolder
from ..turns import supervision
from ..turns.leasing import LaneElsewhere
from . import jobs, verdict

if TYPE_CHECKING:
    from ..turns.manager import TurnManager

log = logging.getLogger("agent_sidecar.cluster")

SAFE = 0.8  # of the TTL: how long a confirmed lease is trusted here
SWEEP_EVERY = 0.1  # of the TTL: the longest a lane may be run past its trust


class ClusterLeases:
    def __init__(self, cfg: Config, store: SharedStore):
        self.cfg, self.store = cfg, store
        self.node_id = cfg.node_id()
        self.address = cfg.cluster.advertise
        self.ttl = cfg.cluster.lease_ttl_s
        self.how = jobs.Restoring(cfg.gateway_auto_continue_freshness, cfg.auto_resume)
        self.held: dict[str, int] = {}  # lane -> epoch held
        self.trusted_until: dict[str, float] = {}  # lane -> loop time its lease is trusted to
        self.idle_since: dict[str, float] = {}
        # What GetStatus and the metrics report of this node (counted from its start):
        self.fenced_writes = 0  # writes the store refused because a lane's epoch moved
        self.leases_lost = 0  # lanes stopped here because their lease moved on
        self.taken_over = 0  # lanes taken with work their last holder left
        self._taking: dict[str, asyncio.Future] = {}
        self._reaping: asyncio.Future | None = None  # a reaper's take and adoption under way
        self._manager: TurnManager | None = None
        self._tasks: list[asyncio.Task] = []  # the keeper and the sweeper
        self._telling: set[asyncio.Task] = set()  # distrusted lanes' streams waiting for the store's word

    def attach(self, manager: TurnManager) -> None:
        self._manager = manager

    # -- LaneLeases ---------------------------------------------------------------------

    def epoch(self, key: str) -> int:
        return self.held.get(key, 0)

    def trusted(self, key: str) -> bool:
        return key in self.held and self.trusted_until[key] > asyncio.get_running_loop().time()

    def stop_at(self, key: str) -> float:
        left = self.trusted_until.get(key, 0.0) - asyncio.get_running_loop().time()
        return time.monotonic() + left + self.ttl * SWEEP_EVERY  # the sweeper's longest delay past it

    async def route(self, key: str) -> None:
        if key in self.held:
            return
        lease = await self.store.lease_holder(key)
        if lease is not None and lease.node_id != self.node_id:
            raise LaneElsewhere(key, lease.node_id, lease.address, lease.seconds_left)

    async def hold(self, key: str) -> int:
        """The epoch this node holds ``key`` at, taking the lane first if need
        be. One take per lane at a time, the other callers waiting for it; it
        runs as a task of its own, so a caller that goes away (its deadline,
        the server's stop) cannot cut it off between its commit and the lease
        being recorded here, or in the middle of adopting what the lane's last
        node left."""
        loop = asyncio.get_running_loop()
        epoch = self.held.get(key)
        if epoch and self.trusted_until[key] > loop.time():
            self.idle_since.pop(key, None)  # in use: not let go as idle under the caller
            return epoch
        if epoch:  # its renewal is overdue: this node stops running it, then takes it anew
            self.distrusted([key])
        taking = self._taking.get(key)
        if taking is None:
            if self._reaping is not None:
                # The reaper's take may be taking this very lane: a take of ours
                # behind it in the writer would take it again from ourselves (a
                # new epoch, the lane restored twice). Its answer first, then look again.
                await asyncio.shield(self._reaping)
                return await self.hold(key)
            taking = self._taking[key] = loop.create_task(self._take(key))
            taking.add_done_callback(functools.partial(self._taken, key))
        await asyncio.shield(taking)
        if key not in self.held:  # lost while its restore ran (for longer than a lease is trusted)
            raise SidecarError(LANE_MOVED, "the session's lane was lost as it was taken; retry")
        return self.held[key]

    def _taken(self, key: str, task: asyncio.Task) -> None:
        if self._taking.get(key) is task:
            del self._taking[key]
        if not task.cancelled():
            task.exception()  # retrieved: every caller may have gone away

    async def _take(self, key: str) -> int:
        sent = asyncio.get_running_loop().time()
        take = await self.store.write(jobs.take_lane, key, self.address, self.ttl, self.how)
        lease = take.lease
        if isinstance(lease, LeaseHolder):
            raise LaneElsewhere(key, lease.node_id, lease.address, lease.seconds_left)
        self._granted(key, lease.epoch, sent)
        if take.work:
            self.taken_over += 1
            log.info("lane taken over", extra={"key": key, "from": lease.previous_node,
                                                "clean": lease.previous_clean})
            assert self._manager is not None and take.plan is not None  # attached at startup; work: a plan
            await supervision.adopt(self._manager, take.plan, lease.epoch)
        return lease.epoch

    def _granted(self, key: str, epoch: int, sent: float) -> None:
        self.held[key] = epoch
        self.trusted_until[key] = sent + self.ttl * SAFE
        self.idle_since.pop(key, None)

    def _forget(self, key: str) -> bool:
        """Drop what this node keeps of its lease on ``key``; whether it held one."""
        self.trusted_until.pop(key, None)
        self.idle_since.pop(key, None)
        return self.held.pop(key, None) is not None

    def lost(self, keys: Iterable[str]) -> None:
        """Lanes this node may no longer run, as the store said (a write of
        theirs fenced, a renewal refused): their turns here stop at once,
        unwritten; their streams end as ``_tell`` finds."""
        keys = list(keys)
        for key in keys:
            if self._forget(key):
                self.leases_lost += 1
                log.warning("lane lease lost", extra={"key": key})
        self._stop(keys, counted=True)

    def distrusted(self, keys: Iterable[str]) -> None:
        """Lanes whose lease this node no longer trusts (its renewal was not
        confirmed in time: a stalled store, or this node itself stalled, a
        SIGSTOP, a long pause): their turns stop at once, writing nothing more,
        before anyone else may start the lane; their streams end as ``_tell``
        finds (counted as lost unless the lane was deleted)."""
        keys = list(keys)
        for key in keys:
            self._forget(key)
        self._stop(keys, counted=False)

    def _stop(self, keys: list[str], counted: bool) -> None:
        m = self._manager
        streams = {key: supervision.stop_lane(m, key, LANE_MOVED) for key in keys} if m is not None else {}
        if counted:  # nothing to tell of a lane without turns here
            streams = {key: stopped for key, stopped in streams.items() if stopped}
        if streams:
            task = asyncio.get_running_loop().create_task(self._tell(streams, counted))
            self._telling.add(task)
            task.add_done_callback(self._telling.discard)

    async def _tell(self, streams: dict[str, list[supervision.Stopped]], counted: bool) -> None:
        """End the streams of turns a lost lane stopped as the store says it
        went (cluster/verdict.py); a distrusted lane not deleted counts as lost."""
        revoked: AbstractSet[str] = frozenset()
        try:
            revoked = await verdict.tell(self.store, streams)
        finally:
            for key in streams:
                if not counted and key not in revoked:
                    self.leases_lost += 1
                    log.warning("lane lease lost", extra={"key": key})

    def cleared(self, keys: Iterable[str] | None = None) -> None:
        """These lanes (None: every lane) were deleted (DeleteSession,
        ClearAllSessions, run here or on another node), and the delete's job
        revoked their leases (their epochs moved on, so the store refuses
        whatever this node still had on its way). This node forgets what it
        held of them, so the next prompt on such a lane takes it anew instead
        of writing under a dead epoch; their turns here stop at once, writing
        nothing, their streams ending CANCELLED (the session is gone, frames
        and all)."""
        m = self._manager
        if keys is None:
            gone = set(self.held) | set(self._taking)
            if m is not None:
                gone |= set(m.lanes) | {t.key for t in m.live.values()}
        else:
            gone = set(keys)
        error = verdict.deleted()
        for key in gone:
            self._forget(key)
            if m is not None:
                supervision.abandon(m, key, error)

    def refused(self, epochs: dict[str, int], writes: int, revoked: AbstractSet[str] = frozenset()) -> None:
        """The store fenced ``writes`` writes of these lanes, written under
        these epochs. A lane held anew since (a newer epoch: its old turns were
        dropped when it was taken) stays; the others stop here: as deleted
        (``cleared``) the ``revoked`` ones (a delete's job revoked their
        leases: the fence often refuses their next write before the delete's
        notification arrives), as lost the rest."""
        self.fenced_writes += writes
        log.warning("fenced writes refused", extra={"keys": sorted(epochs), "writes": writes,
                                                    "total": self.fenced_writes})
        stopped = [k for k, e in epochs.items() if self.held.get(k, 0) <= e]
        self.cleared([k for k in stopped if k in revoked])
        self.lost([k for k in stopped if k not in revoked])

    # -- the node's life ------------------------------------------------------------------

    async def restore(self) -> None:
        """The node's start: its lanes from its last run back, then the keeper runs."""
        await self._refuse_a_second_run()
        sent = asyncio.get_running_loop().time()
        clean, takes = await self.store.write(jobs.arrive, self.address, self.ttl, self.how)
        log.info("cluster node arrived", extra={"node": self.node_id, "clean": clean,
                                                "lanes": len(takes)})
        self.taken_over += len(takes)
        await self._adopt_all(takes, sent)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._keep()), loop.create_task(self._sweep())]

    async def _refuse_a_second_run(self) -> None:
        """Start only if no live sidecar runs under this node id: a second one
        (a node id copied into two configs) would take every lane of the first
        as its own last run's, cutting its turns off, and the two would take
        lanes from each other from then on. A live node's heartbeat moves every
        third of the TTL (``_keep``); a row that did not stop cleanly with a
        heartbeat younger than a TTL is watched for two thirds of one: it
        moved, so that node is alive and this start is refused (RuntimeError:
        ``cannot start``); it did not, so it was this node's own run, ended
        by a crash moments ago, and the start goes on."""
        seen = await self.store.write(jobs.presence)
        if seen is None or seen[0] or seen[2] > self.ttl:
            return
        await asyncio.sleep(self.ttl * 2 / 3)
        again = await self.store.write(jobs.presence)
        if again is not None and not again[0] and again[1] != seen[1]:
            raise RuntimeError(f"a sidecar with node id {self.node_id!r} is already running on this database"
                               f" (advertising {again[3]}): give each sidecar a node id of its own"
                               " ([cluster] node_id)")

    async def _adopt_all(self, takes: list[jobs.LaneTake], sent: float) -> None:
        self.lost([t.lease.session_key for t in takes])  # an older hold of ours is over
        for take in takes:
            self._granted(take.lease.session_key, take.lease.epoch, sent)
        m = self._manager
        assert m is not None  # attached at startup
        plans = [t.plan for t in takes]
        assert None not in plans  # a lane taken comes with what its last node left
        await asyncio.gather(*(supervision.adopt(m, p, t.lease.epoch) for t, p in zip(takes, plans) if p is not None))

    async def stop(self) -> None:
        """A clean stop, after the drain: every lane let go, the marker written."""
        for task in self._tasks:
            task.cancel()
        leases = list(self.held.items())
        self.held.clear()
        await self.store.write(jobs.leave, leases)

    # -- renewing, letting go, taking over ---------------------------------------------------

    async def _keep(self) -> None:
        loop = asyncio.get_running_loop()
        every = self.ttl / 3
        renewals = FaultEpisode(log, "cluster lease renewal failed")
        while True:
            await asyncio.sleep(every)
            try:
                await self._renew(loop.time())
                await self._release_idle(loop.time())
                renewals.ended()
            except StoreUnavailable as e:
                renewals.failed(error=e.message)
            except Exception:
                log.exception("cluster lease renewal failed")
            try:
                await self._reap(loop.time())
            except StoreUnavailable:
                pass
            except Exception:
                log.exception("taking over orphaned lanes failed")

    async def _sweep(self) -> None:
        """Stop the lanes whose trust ran out as it runs out, not after the
        keeper's renewal answers, which a stalled store may hold up for longer
        than the lease lasts. It looks at least every SWEEP_EVERY of the TTL
        (a lease granted meanwhile may be trusted from a take sent long ago),
        well within the TTL's 1 - SAFE margin before the lease runs out."""
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            self.distrusted([k for k, t in self.trusted_until.items() if t <= now])
            first = min(self.trusted_until.values(), default=now + self.ttl)
            await asyncio.sleep(min(first - now, self.ttl * SWEEP_EVERY))

    async def _renew(self, sent: float) -> None:
        """Extend every lease held here, and the node's heartbeat (with no
        lane held too), and tell the workers of the renewed lanes' turns how
        long they may run now. A lane whose lease a delete revoked stops as
        deleted (``cleared``: its turns end CANCELLED), one taken from this
        node as lost."""
        keys = list(self.held)
        kept, revoked = await self.store.write(jobs.renew, keys, self.ttl)
        gone, trusted = [], set()
        for key in keys:
            if key in self.held and kept.get(key) == self.held[key]:
                self.trusted_until[key] = sent + self.ttl * SAFE
                trusted.add(key)
            elif key in self.held:
                gone.append(key)
        if self._manager is not None and trusted:
            supervision.trust(self._manager, trusted, self.stop_at)
        self.cleared([k for k in gone if k in revoked])
        self.lost([k for k in gone if k not in revoked])

    async def _release_idle(self, now: float) -> None:
        m = self._manager
        assert m is not None  # attached before the keeper runs
        if m.draining:  # the stop lets every lane go at once, after the drain (jobs.leave)
            return
        busy = set(m.lanes) | {t.key for t in m.live.values()} | set(self._taking)
        idle = []
        for key, epoch in self.held.items():
            if key in busy:
                self.idle_since.pop(key, None)
            elif now - self.idle_since.setdefault(key, now) >= self.ttl:
                idle.append((key, epoch))
        for key, _ in idle:
            self._forget(key)
        if idle:
            await self.store.write(jobs.release, idle)

    async def _reap(self, sent: float) -> None:
        """Take the orphaned lanes over; a ``hold`` meanwhile waits for it to
        end (``_reaping``). A take sent before it is ahead of it in the
        writer: its lane's fresh lease is nobody's orphan. Not while this node
        drains: it could not run what it took (its restore would close the
        cut-off turn, whose continue turn it then refuses to start)."""
        assert self._manager is not None  # attached before the keeper runs
        if self._manager.draining:
            return
        self._reaping = asyncio.get_running_loop().create_future()
        try:
            takes = await self.store.write(jobs.take_orphans, self.address, self.ttl, self.how)
            if takes:
                self.taken_over += len(takes)
                log.info("orphaned lanes taken over", extra={"lanes": [t.lease.session_key for t in takes]})
                await self._adopt_all(takes, sent)
        finally:
            self._reaping.set_result(None)
            self._reaping = None

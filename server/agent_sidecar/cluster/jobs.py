"""The cluster's store jobs: taking a lane (its lease, then the restore of
what the lane's last node left), renewing and letting go of leases, a node's
arrival and clean leave. They run in the writer process like every job; the
rules of what a taken-over lane needs are the startup restore's
(recovery/startup.py), scoped to the lanes taken."""

from __future__ import annotations

from collections.abc import Iterable

from ..recovery.startup import RestorePlan, restore
from ..store import UnitOfWork
from ..store.record_type import record
from ..store.records import LeaseGrant, LeaseHolder


@record
class Restoring:
    """How a taken lane is restored: recovery's settings."""

    freshness_s: float
    auto_resume: str


@record
class LaneTake:
    """A take's answer: the lease (or who holds it) and, when this node got
    it, what the lane's last node left to do."""

    lease: LeaseGrant | LeaseHolder
    plan: RestorePlan | None = None

    @property
    def work(self) -> bool:
        p = self.plan
        return p is not None and bool(p.queued or p.resume or p.closed_turns)


def _take(uow: UnitOfWork, key: str, address: str, ttl_s: float, how: Restoring,
          clean: bool = True) -> LaneTake:
    assert uow.leases is not None, "a cluster job on a backend without leases"
    got = uow.leases.take(key, uow.node_id, address, ttl_s)
    if isinstance(got, LeaseHolder):
        return LaneTake(got)
    plan = restore(uow, clean and got.previous_clean, how.freshness_s, how.auto_resume, keys=[key])
    return LaneTake(got, plan)


def _take_all(uow: UnitOfWork, keys: Iterable[str], address: str, ttl_s: float, how: Restoring,
              clean: bool = True) -> list[LaneTake]:
    """Take each lane another node does not hold alive; the takes with work
    to do are returned, the others let go at once (a lane taken with nothing
    to do must not stay held, nor be an orphan again)."""
    assert uow.leases is not None
    takes = []
    for key in keys:
        take = _take(uow, key, address, ttl_s, how, clean)
        if isinstance(take.lease, LeaseHolder):
            continue
        if take.work:
            takes.append(take)
        else:
            uow.leases.release(key, uow.node_id, take.lease.epoch)
    return takes


def take_lane(uow: UnitOfWork, key: str, address: str, ttl_s: float, how: Restoring) -> LaneTake:
    """This node takes the lane's lease if nobody else holds it alive; then
    the lane is restored as after a restart: a turn its last node was running
    is closed (interrupted, with synthetic tool results), its queued prompts
    come back in order, auto-resume by the recovery rules. A lane its last
    node let go cleanly (idle) gets no continue turn: nothing was cut off
    since, and a mark it still has (a dead worker's, whose turn ended failed
    then) waits for a restart, as on one sidecar."""
    take = _take(uow, key, address, ttl_s, how)
    if take.plan is not None and isinstance(take.lease, LeaseGrant) and take.lease.previous_clean:
        take.plan.resume = []
    return take


def take_orphans(uow: UnitOfWork, address: str, ttl_s: float, how: Restoring,
                 limit: int = 50) -> list[LaneTake]:
    """Lanes whose node died, stalled, or stopped with a turn cut off:
    taken over and restored. Those with nothing to do (no queued prompt, no
    continue turn due by the recovery rules) are let go at once, as ``arrive``
    does, so a lane is taken over once per holder that went away, never again
    and again by every reaper pass."""
    assert uow.leases is not None
    return _take_all(uow, uow.leases.orphaned(limit), address, ttl_s, how)


def arrive(uow: UnitOfWork, address: str, ttl_s: float, how: Restoring) -> tuple[bool, list[LaneTake]]:
    """A node starts: its marker read (did its last run stop cleanly?), the
    lanes its last run held taken back and restored; those with nothing to do
    are let go at once."""
    assert uow.leases is not None and uow.nodes is not None
    clean = uow.nodes.arrive(uow.node_id, address)
    return clean, _take_all(uow, uow.leases.of_node(uow.node_id), address, ttl_s, how, clean)


def presence(uow: UnitOfWork) -> tuple[bool, float, float, str] | None:
    """What the store knows of this node id's last run (NodeRepo.presence)."""
    assert uow.nodes is not None
    return uow.nodes.presence(uow.node_id)


def renew(uow: UnitOfWork, keys: list[str], ttl_s: float) -> tuple[dict[str, int], set[str]]:
    """This node's leases on ``keys`` extended (their epochs), and its
    heartbeat: a node starting under the same id can tell it is alive
    (leases.py). Of the leases not extended, the ones a delete revoked: their
    lanes were deleted, not taken (the delete's notification may not have
    arrived yet)."""
    assert uow.leases is not None and uow.nodes is not None
    uow.nodes.heartbeat(uow.node_id)
    if not keys:
        return {}, set()
    kept = uow.leases.renew(uow.node_id, keys, ttl_s)
    missed = [k for k in keys if k not in kept]
    return kept, (uow.leases.revoked(missed) if missed else set())


def release(uow: UnitOfWork, leases: Iterable[tuple[str, int]]) -> None:
    assert uow.leases is not None
    for key, epoch in leases:
        uow.leases.release(key, uow.node_id, epoch)


def leave(uow: UnitOfWork, leases: list[tuple[str, int]]) -> None:
    """A clean stop: every lease let go (queued prompts are taken over by the
    other nodes at once), then the node's marker. A lane its drain marked
    ``resume_pending`` (a turn cut off by the drain timeout) is not let go
    but left to run out now: to the other nodes its node went away with its
    work cut off, so one of them (or this node, restarted) takes it over and
    restores it, its continue turn by the recovery rules, as one sidecar's
    next start would."""
    assert uow.leases is not None and uow.nodes is not None
    for key, epoch in leases:
        head = uow.routing.head(key)
        if head is not None and head.resume_pending and not head.suspended:
            uow.leases.expire(key, uow.node_id, epoch)
        else:
            uow.leases.release(key, uow.node_id, epoch)
    uow.nodes.leave(uow.node_id)

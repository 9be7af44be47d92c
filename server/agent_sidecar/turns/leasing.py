"""What the turn engine needs from a cluster: the lease of each lane it runs.

On one sidecar (SQLite, the embedded default) the manager has no ``leases``
and every lane is its own. With several sidecars on one database a lane's
turns run only on the node holding its lease (cluster/leases.py implements
this protocol); the manager asks for the lease before it places a prompt,
tags every write of a turn with the epoch it holds (the store refuses a write
whose epoch has moved: the fence), and drops a lane's turns, without writing,
when the lease is lost: the node that took the lane over closes and reruns
them from the ledger, as a restart would.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from typing import Protocol

from ..errors import LANE_MOVED, SidecarError


class LaneElsewhere(Exception):
    """The lane's lease is held by another live node: the call belongs there
    (api/ forwards it to ``address``)."""

    def __init__(self, key: str, node_id: str, address: str, seconds_left: float):
        super().__init__(f"lane {key!r} is run by {node_id} at {address}")
        self.key, self.node_id, self.address, self.seconds_left = key, node_id, address, seconds_left


class LaneLeases(Protocol):
    async def restore(self) -> None:
        """The node's start: its lanes from its last run taken back and restored."""

    async def hold(self, key: str) -> int:
        """This node's epoch on the lane, taking the lease (and restoring what
        the lane's last node left) when it has none; raises LaneElsewhere when
        another live node holds it."""

    def epoch(self, key: str) -> int:
        """The epoch held on ``key`` (0: none)."""

    async def route(self, key: str) -> None:
        """Raise LaneElsewhere when another live node holds the lane (a read:
        no lease is taken)."""

    def trusted(self, key: str) -> bool:
        """Whether this node may run the lane now: its lease confirmed within
        the time it is trusted (past it the lane stops here, ``distrusted``)."""

    def stop_at(self, key: str) -> float:
        """When a worker stops the lane's turn by itself (time.monotonic(), the
        host's one clock; wire.Run ``stop_at``) should this node fail to: a
        little after its trust in the lease ends, before the lease can run out
        in the database."""

    def distrusted(self, keys: Iterable[str]) -> None:
        """These lanes' leases are no longer trusted here: their turns stop at
        once, writing nothing more; their streams end as the store says the
        lane went."""

    def refused(self, epochs: dict[str, int], writes: int, revoked: AbstractSet[str] = frozenset()) -> None:
        """The store refused ``writes`` writes of these lanes at these epochs
        (their epoch moved; ``revoked``: the lane was deleted): the lanes stop
        here unless held anew since."""

    def cleared(self, keys: Iterable[str] | None = None) -> None:
        """These lanes (None: every lane) were deleted and their leases
        revoked: forget them here; their turns here stop, writing nothing."""

    async def stop(self) -> None:
        """A clean stop: every lane let go (those whose turn the drain cut off
        left to run out, for another node to resume), the node's marker written."""


class LeaseLost(SidecarError):
    """The store refused a write of these lanes (lane -> the epoch it was
    written under): the epoch moved on (another node, or this node anew, took
    the lane; or the lane was deleted: ``revoked``, its lease revoked by a
    DeleteSession or ClearAllSessions). What the write belonged to was not
    acknowledged."""

    def __init__(self, epochs: dict[str, int], revoked: Iterable[str] = ()):
        self.epochs = dict(epochs)
        self.revoked = frozenset(revoked)
        super().__init__(LANE_MOVED, "the session's lane is run by another sidecar now; retry",
                         retry_after_s=0.2)

    @property
    def keys(self) -> list[str]:
        return sorted(self.epochs)

    def __reduce__(self):  # raised in the writer process, re-raised in the parent
        return (LeaseLost, (self.epochs, self.revoked))


def check_fence(uow, fences: dict[str, int] | None) -> None:
    """In a job: refuse the whole job (raise LeaseLost) unless this node still
    holds each lane at the epoch given; the lease rows stay locked until the
    job's transaction ends, so none can change hands before it commits."""
    if fences and uow.leases is not None:
        lost = uow.leases.fenced(uow.node_id, fences)
        if lost:
            raise LeaseLost({k: fences[k] for k in lost}, uow.leases.revoked(lost))

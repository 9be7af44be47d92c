"""How the streams of turns end when this node stopped running their lane
because its lease moved on, or was no longer trusted here: as the store says
the lane went (cluster/leases.py stops the turns at once, then asks).

Guarantees, and why:

* A turn whose session was deleted meanwhile (the lane's lease revoked, or
  its acknowledged request gone from the ledger, whoever took the lane
  since) ends CANCELLED, as on a node that hears of the delete: a LANE_MOVED
  an adapter retries would run the prompt anew in a fresh session.
* A turn whose session was reset meanwhile (ResetSession on the node that
  took the lane, which ended the turn's incarnation) ends CANCELLED, as a
  reset's cancel of the running turn does on one sidecar; so does one whose
  session was suspended by a SuspendSession (/stop) meanwhile, as a /stop's
  cancel does. Not a prompt whose start had not committed: the node that
  took the lane took it over too, and the reset or /stop ended it there
  (``superseded``, or cancelled had it begun there first): LANE_MOVED, whose
  retry with its request id gets that end. A lane the stuck-loop guard
  suspended as it was taken over is not a /stop: its turn ends LANE_MOVED
  (the store tells the two apart by the restart count the guard leaves,
  recovery/startup.py).
* Any other ends LANE_MOVED (``LeaseLost``), whose retry with the same
  request id follows the turn to the lane's new holder.
* With no word from the store within ``VERDICT_S`` (a stalled or
  unreachable store): LANE_MOVED, the lease may well have moved.
"""

from __future__ import annotations

import asyncio
from collections.abc import Set as AbstractSet

from ..errors import CANCELLED, SidecarError
from ..recovery.startup import STUCK_LOOP_RESTARTS
from ..store import StoreUnavailable
from ..store.interface import SharedStore
from ..turns.leasing import LeaseLost
from ..turns.supervision import Stopped

VERDICT_S = 2.0  # the longest a stopped lane's streams wait for the store to say why


def deleted() -> SidecarError:
    """How a turn's stream ends when its session was deleted under it."""
    return SidecarError(CANCELLED, "the session was deleted while this prompt was in flight")


def _reset() -> SidecarError:
    return SidecarError(CANCELLED, "the session was reset while this prompt was in flight")


def _stopped() -> SidecarError:
    return SidecarError(CANCELLED, "the session was suspended (/stop) while this prompt was in flight")


async def tell(store: SharedStore, streams: dict[str, list[Stopped]]) -> AbstractSet[str]:
    """End the streams of the turns stopped on these lanes, each as the
    store says its lane went; returns the lanes whose lease a delete revoked
    (nothing to count as lost there). The streams are told even when this
    is cancelled (the node's stop)."""
    revoked: AbstractSet[str] = frozenset()
    known: AbstractSet[str] | None = None
    reset: AbstractSet[str] = frozenset()
    suspended: AbstractSet[str] = frozenset()
    acked = [s.request_id for stopped in streams.values() for s in stopped if s.acked]
    try:
        async with asyncio.timeout(VERDICT_S):
            revoked = await store.revoked_leases(list(streams))
            if acked:
                known = await store.known_requests(acked)
                reset = await store.reset_requests(acked)
                suspended = await store.stopped_requests(acked, STUCK_LOOP_RESTARTS)
            else:
                known = frozenset()
    except (StoreUnavailable, TimeoutError):
        pass  # no word: the lease may well have moved
    finally:
        for key, stopped in streams.items():
            for s in stopped:
                error = _end(key in revoked or (s.acked and known is not None and s.request_id not in known),
                             s.started and s.request_id in reset, s.started and s.request_id in suspended, key)
                for sub in s.subscribers:
                    sub.push(error)
    return revoked


def _end(was_deleted: bool, was_reset: bool, was_stopped: bool, key: str) -> SidecarError:
    if was_deleted:
        return deleted()
    if was_reset:
        return _reset()
    return _stopped() if was_stopped else LeaseLost({key: 0})

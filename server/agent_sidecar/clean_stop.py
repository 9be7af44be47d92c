"""What a clean stop leaves behind, and when it may say so: the full-text
index complete, a cluster node's lanes let go, and the clean-shutdown marker
(seed 001 §7), written only when everything acknowledged is on disk. The
marker is a promise to the next start (it skips the suspension pass), so
every doubt (frames the bus still holds, turns whose ends could not commit,
writes the store left unanswered, a marker that cannot be written) leaves it
out, and the next start recovers as after a crash, losing nothing.
runtime.py's stop calls these, in its order.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .store import Store, StoreUnavailable
from .store.jobs import index_messages

if TYPE_CHECKING:
    from .cluster.forward import Forwarder
    from .turns.leasing import LaneLeases
    from .turns.manager import TurnManager

log = logging.getLogger("agent_sidecar")


async def final_index(store: Store) -> bool:
    """The full-text index complete on disk, as a clean stop should leave
    it; whether the store answered in time (supervision.answered)."""
    from .turns.supervision import answered
    try:
        if await answered(store.write(index_messages)):
            return True
        log.warning("final full-text indexing skipped", extra={"error": "the store did not answer"})
    except StoreUnavailable as e:
        log.warning("final full-text indexing skipped", extra={"error": e.message})
    except Exception:
        log.exception("final full-text indexing failed")
    return False


def unsaved(store: Store, turns: TurnManager | None, answered: bool) -> str | None:
    """What acknowledged work may not be on disk, None when all of it is:
    frames the bus holds, turns whose end never came while the store
    cannot write, writes its writer left unanswered (unless ``answered``:
    a last write answered says the ones before it are committed)."""
    fault = store.fault
    unanswered = 0 if answered else store.commit_stats.backlog
    if turns is not None and (not turns.bus.idle() or (fault is not None and turns.open_turns())):
        return f"frames of turns were not saved: {fault.message}" if fault else "frames of turns were not saved"
    if unanswered:
        return f"the store did not answer {unanswered} writes"
    return None


async def leave_cluster(leases: LaneLeases, forward: Forwarder | None) -> None:
    """A clean stop of a cluster node: its lanes let go (the other nodes
    take their queued prompts at once), its marker row written."""
    try:
        await leases.stop()
    except StoreUnavailable as e:
        log.warning("leaving the cluster failed; its leases run out instead", extra={"error": e.message})
    if forward is not None:
        await forward.close()


def mark_clean(data_dir: str, error: str | None) -> bool:
    """The marker, only when everything acknowledged is on disk (``error``
    None); whether it was written. When the store could not write it all
    (frames held for a full disk) or the marker itself cannot be written, no
    marker, and the log says why: the caller exits with status 1, and the
    next start treats this stop as a crash (its restore closes the turns
    whose ends did not commit)."""
    from .recovery.startup import write_marker
    if error is None:
        try:
            write_marker(data_dir)
            return True
        except OSError as e:
            error = f"cannot write the marker: {e.strerror or e}"
    log.error("stopped without a clean-shutdown marker", extra={
        "error": error, "next_start": "recovers as after a crash"})
    return False

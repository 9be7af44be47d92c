"""Background housekeeping (seed 001 §10): retention of frames and ledger rows,
pruning of old routing entries. It never ends or prunes a transcript.

Deletes go in small batches, each its own store job, so a large backlog never
holds the writer for long: other sessions' writes interleave between batches
(how a backend finds old frames fast is its own: FrameRepo.delete_before).
"""

from __future__ import annotations

import logging
import time

# asyncio is imported in the coroutines that use it: the store writer process
# imports this module for its jobs and runs no event loop.
from ..sessions import lifecycle as life
from ..store import StoreUnavailable, UnitOfWork
from ..store.jobs import index_messages as index_job

log = logging.getLogger("agent_sidecar.housekeeping")
BATCH = 1000


def delete_frames_before(uow: UnitOfWork, cutoff: float, limit: int = BATCH) -> int:
    return uow.frames.delete_before(cutoff, limit)


def delete_ledger_before(uow: UnitOfWork, cutoff: float, limit: int = BATCH) -> int:
    """Closed ledger rows past retention (open ones are the restore's)."""
    return uow.ledger.delete_closed_before(cutoff, limit)


async def _in_batches(store, delete, *args) -> int:
    """Run ``delete(conn, *args)`` as its own small writer job until a batch
    comes back short, yielding to the loop between batches; returns the rows
    deleted."""
    import asyncio
    total = 0
    while True:
        n = await store.write(delete, *args)
        total += n
        if n < BATCH:
            return total
        await asyncio.sleep(0)


async def prune_retention(store, retention_s: float) -> dict[str, int]:
    cutoff = time.time() - retention_s
    frames = await _in_batches(store, delete_frames_before, cutoff)
    prompts = await _in_batches(store, delete_ledger_before, cutoff)
    return {"frames": frames, "prompts": prompts}


INDEX_INTERVAL_S = 1.0
INDEX_BATCH = 20_000


async def index_messages(store) -> None:
    """Keep the full-text index at most about a second behind the transcripts
    (the backend's batch indexing); cancelled at shutdown."""
    import asyncio
    while True:
        try:
            while await store.write(index_job, INDEX_BATCH) == INDEX_BATCH:
                await asyncio.sleep(0)  # a backlog (after a crash): in batches
        except StoreUnavailable:  # the store says so itself; we catch up when it can write
            pass
        except Exception:  # not CancelledError (a BaseException): shutdown still stops us
            log.exception("full-text indexing failed")
        await asyncio.sleep(INDEX_INTERVAL_S)


async def run(cfg, store, busy_keys) -> None:
    """The timer loop; cancelled at shutdown."""
    import asyncio
    last_prune = 0.0
    while True:
        try:
            totals = await prune_retention(store, cfg.retention_days * 86400)
            if any(totals.values()):
                log.info("retention pruned", extra=totals)
            now = time.time()
            if cfg.session_store_max_age_days > 0 and now - last_prune >= 3600:
                last_prune = now
                busy = busy_keys()
                n = await store.write(life.prune, cfg.session_store_max_age_days, busy)
                if n:
                    log.info("routing entries pruned", extra={"pruned": n})
        except StoreUnavailable:  # the next pass retries
            pass
        except Exception:  # not CancelledError (a BaseException): shutdown still stops us
            log.exception("housekeeping pass failed")
        await asyncio.sleep(cfg.housekeeping_interval_s)

"""Background housekeeping (seed 001 §10): retention of frames and ledger rows,
pruning of old routing entries. It never ends or prunes a transcript.

Deletes go in small batches, each its own writer job, so a large backlog never
holds the writer for long: other sessions' writes interleave between batches.
Frames are found by id range (ids grow with time), so no index on ``at`` is
needed and no step scans the table.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ..sessions import lifecycle as life
from ..sessions import transcripts as tx
from ..store import StoreUnavailable

log = logging.getLogger("agent_sidecar.housekeeping")
BATCH = 1000


def frame_cutoff_id(conn, cutoff: float) -> int:
    """The smallest frame id with ``at >= cutoff`` (binary search over rowids;
    each probe is a primary-key lookup)."""
    # Two subqueries, each one step to an end of the rowid b-tree (a combined
    # min/max would scan the whole table).
    lo_row = conn.execute("SELECT (SELECT min(id) FROM frames), (SELECT max(id) FROM frames)").fetchone()
    lo, hi = lo_row
    if lo is None:
        return 0
    while lo < hi:
        mid = (lo + hi) // 2
        row = conn.execute("SELECT id, at FROM frames WHERE id >= ? ORDER BY id LIMIT 1", (mid,)).fetchone()
        if row is None or row[1] >= cutoff:
            hi = mid
        else:
            lo = row[0] + 1
    row = conn.execute("SELECT at FROM frames WHERE id = ?", (lo,)).fetchone()
    return lo if row is None or row[0] >= cutoff else lo + 1


def delete_frames_before(conn, cutoff_id: int, limit: int = BATCH) -> int:
    conn.execute("DELETE FROM frames WHERE id IN (SELECT id FROM frames WHERE id < ? ORDER BY id LIMIT ?)",
                 (cutoff_id, limit))
    return conn.changes()


def delete_ledger_before(conn, cutoff: float, limit: int = BATCH) -> int:
    conn.execute(
        "DELETE FROM prompts WHERE request_id IN (SELECT request_id FROM prompts"
        " WHERE created_at < ? AND status NOT IN ('queued', 'running') LIMIT ?)", (cutoff, limit))
    return conn.changes()


async def _in_batches(store, delete, *args) -> int:
    """Run ``delete(conn, *args)`` as its own small writer job until a batch
    comes back short, yielding to the loop between batches; returns the rows
    deleted."""
    total = 0
    while True:
        n = await store.write(delete, *args)
        total += n
        if n < BATCH:
            return total
        await asyncio.sleep(0)


async def prune_retention(store, retention_s: float) -> dict[str, int]:
    cutoff = time.time() - retention_s
    cutoff_id = await store.read_async(lambda c: frame_cutoff_id(c, cutoff))
    frames = await _in_batches(store, delete_frames_before, cutoff_id) if cutoff_id else 0
    prompts = await _in_batches(store, delete_ledger_before, cutoff)
    return {"frames": frames, "prompts": prompts}


INDEX_INTERVAL_S = 1.0
INDEX_BATCH = 20_000


async def index_messages(store) -> None:
    """Keep the full-text index at most about a second behind the transcripts
    (see sessions/transcripts.py); cancelled at shutdown."""
    while True:
        try:
            while await store.write(tx.index_pending, INDEX_BATCH) == INDEX_BATCH:
                await asyncio.sleep(0)  # a backlog (after a crash): in batches
        except StoreUnavailable:  # the store says so itself; we catch up when it can write
            pass
        except Exception:  # not CancelledError (a BaseException): shutdown still stops us
            log.exception("full-text indexing failed")
        await asyncio.sleep(INDEX_INTERVAL_S)


async def run(cfg, store, busy_keys) -> None:
    """The timer loop; cancelled at shutdown."""
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

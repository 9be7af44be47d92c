"""The PostgreSQL backend's frame inserts (store/postgres/ledger.py
PostgresFrames): FRAMES_LOCK, which orders frame cursors across the writers
of a cluster, held by every transaction that inserts frames. A test of a
backend may use its SQL."""

from __future__ import annotations

import asyncio

import pytest
from helpers.store import frames_refused, opened_store

from agent_sidecar.turns.flush import LanesRefused, run_flush

pytestmark = pytest.mark.postgres_only("the PostgreSQL backend's frame inserts and their lock")


def _insert_frames(uow, rows: list[tuple]) -> bool:
    """Insert frames; whether this transaction holds FRAMES_LOCK now (the
    only advisory lock the writer takes)."""
    uow.frames.insert(rows)
    return _frames_locked(uow)


def _frames_locked(uow) -> bool:
    return uow.conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                            " AND pid = pg_backend_pid()").fetchone()[0] > 0


def test_frames_inserted_after_a_refused_insert_in_one_transaction_still_commit_in_cursor_order(tmp_path):
    """FRAMES_LOCK (taken at a transaction's first frame insert) orders frame
    cursors across the cluster's writers. A frame insert the store refuses
    is undone to its savepoint, and the lock with it: the next insert of the
    transaction must take it again. It did not (the backend still took it
    for held), so its frames could commit out of cursor order: after a frame
    flush refused whole (a job's savepoint), or one a session of which was
    refused (turns/flush.py runs it again session by session)."""
    good, bad = "agent:main:t:dm:good", "agent:main:t:dm:bad"
    good_row = ("rg", 1, good, "good", "t", 1.0, "text_delta", b'{"text":"fine"}')
    bad_row = ("rb", 1, bad, "bad", "t", 1.0, "text_delta", b'{"text":"poisoned"}')

    async def go():
        async with opened_store(tmp_path / "s.db", writes=True, log_format="text") as store:
            with frames_refused(tmp_path / "s.db", "%poisoned%"):
                refused, locked = await asyncio.gather(store.write(run_flush, (1, 0), [bad_row], [], None, []),
                                                       store.write(_insert_frames, [good_row]),
                                                       return_exceptions=True)
                assert isinstance(refused, Exception) and locked is True, (refused, locked)
                again = ("rg", 2, *good_row[2:])
                split, locked = await asyncio.gather(store.write(run_flush, (1, 0), [bad_row, again], [], None, []),
                                                     store.write(_frames_locked))
                assert isinstance(split[1], LanesRefused) and split[1].lanes == {bad} and locked is True, \
                    (split, locked)

    asyncio.run(go())

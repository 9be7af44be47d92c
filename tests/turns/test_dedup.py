"""The dedup window's index (turns/dedup.py) on a real store: what it
preloads from the ledger at startup, and that it says when an id it does not
hold may still be in the ledger (the preload was cut at its limit)."""

from __future__ import annotations

import asyncio
import time

from helpers.store import local_store, opened_store

from agent_sidecar.store.records import LedgerEntry
from agent_sidecar.turns.dedup import RecentRequests

KEY = "agent:main:t:dm:1"


def ledger(path, *rows: tuple[str, float]) -> None:
    with local_store(path) as s:
        for rid, at in rows:
            s.job(lambda uow, rid=rid, at=at: uow.ledger.insert(
                LedgerEntry(rid, KEY, "s", "t", "completed", 1, "x", {}, at)))


def with_store(path, body) -> None:
    async def go():
        async with opened_store(path) as store:
            await body(store)
    asyncio.run(go())


def test_preload_then_the_ledger_for_ids_past_the_limit(tmp_path):
    path = tmp_path / "sidecar.db"
    now = time.time()

    async def body(store):
        ledger(path, ("old", now - 1000), ("a", now - 10), ("b", now - 5), ("c", now - 1))
        capped = RecentRequests(window_s=300)
        await capped.load(store, limit=2)
        assert len(capped) == 2  # the newest two: b and c
        assert capped.seen("b", now) == capped.seen("c", now) == KEY
        assert capped.seen("a", now) is None and capped.may_be_in_ledger("a", now)
        assert (await store.ledger("a")).session_key == KEY  # what dedup.is_twin asks then
        whole = RecentRequests(window_s=300)
        await whole.load(store, limit=10)
        assert len(whole) == 3
        assert whole.seen("a", now) == KEY and not whole.seen("old", now)
        assert not whole.may_be_in_ledger("never", now)  # it holds the whole window
    ledger(path)  # migrate first
    with_store(path, body)


def test_remembered_ids_age_out_of_the_window(tmp_path):
    async def body(store):
        recent = RecentRequests(window_s=0.2)
        await recent.load(store)
        now = time.time()
        recent.remember("r1", now, KEY)
        assert recent.seen("r1", now + 0.1)
        assert not recent.seen("r1", now + 0.3)  # the window passed
        await asyncio.sleep(0.25)
        recent.remember("r2", time.time(), KEY)  # remembering trims what aged out
        assert len(recent) == 1
    with_store(tmp_path / "sidecar.db", body)


def test_forget_drops_the_ids_of_a_deleted_session(tmp_path):
    """DeleteSession / ClearAllSessions: the index forgets what the ledger lost."""
    async def body(store):
        recent = RecentRequests(window_s=300)
        await recent.load(store)
        now = time.time()
        recent.remember("a1", now, "agent:main:t:dm:a")
        recent.remember("b1", now, "agent:main:t:dm:b")
        recent.remember("a2", now, "agent:main:t:dm:a")
        recent.forget("agent:main:t:dm:a")
        assert [recent.seen(r, now) for r in ("a1", "b1", "a2")] == [None, "agent:main:t:dm:b", None]
        recent.forget(None)
        assert len(recent) == 0
    with_store(tmp_path / "sidecar.db", body)

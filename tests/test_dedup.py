"""The dedup window's index (turns/dedup.py) on a real store file: what it
preloads from the ledger at startup, and the ledger fallback it keeps for one
window when the last run accepted more ids than it preloads."""

from __future__ import annotations

import asyncio
import time

import apsw

from agent_sidecar.store import Store
from agent_sidecar.turns.dedup import RecentRequests


def ledger(path, *rows: tuple[str, float]) -> None:
    conn = apsw.Connection(str(path))
    with conn:
        conn.executemany(
            "INSERT INTO prompts (request_id, session_key, session_id, platform, status, delivery,"
            " text, created_at) VALUES (?, 'agent:main:t:dm:1', 's', 't', 'completed', 1, 'x', ?)", rows)
    conn.close()


def test_preload_then_the_ledger_for_ids_past_the_limit(tmp_path):
    path = tmp_path / "sidecar.db"
    store = Store(path)  # migrated; reads need no writer process
    try:
        now = time.time()
        ledger(path, ("old", now - 1000), ("a", now - 10), ("b", now - 5), ("c", now - 1))
        capped = RecentRequests(window_s=300)
        capped.load(store, limit=2)
        assert len(capped) == 2  # the newest two: b and c
        assert capped.seen("b", store, now) and capped.seen("c", store, now)
        assert capped.seen("a", store, now)  # not preloaded: the ledger knows it
        # and for which session: the key decides twin or reuse (turns/dedup.is_twin)
        assert capped.seen("a", store, now) == capped.seen("c", store, now) == "agent:main:t:dm:1"
        assert not capped.seen("old", store, now)  # in the ledger, out of the window
        assert not capped.seen("never", store, now)

        whole = RecentRequests(window_s=300)
        whole.load(store, limit=10)
        assert len(whole) == 3
        ledger(path, ("late", now))  # e.g. written behind our back: only asked while capped
        assert not whole.seen("late", store, now)
        assert capped.seen("late", store, now)
    finally:
        asyncio.run(store.close())


def test_remembered_ids_age_out_of_the_window(tmp_path):
    store = Store(tmp_path / "sidecar.db")
    try:
        recent = RecentRequests(window_s=0.2)
        recent.load(store)
        now = time.time()
        recent.remember("r1", now, "agent:main:t:dm:1")
        assert recent.seen("r1", store, now + 0.1)
        assert not recent.seen("r1", store, now + 0.3)  # the window passed
        time.sleep(0.25)
        recent.remember("r2", time.time(), "agent:main:t:dm:1")  # remembering trims what aged out
        assert len(recent) == 1
    finally:
        asyncio.run(store.close())


def test_forget_drops_the_ids_of_a_deleted_session(tmp_path):
    """DeleteSession / ClearAllSessions: the index forgets what the ledger lost."""
    store = Store(tmp_path / "sidecar.db")
    try:
        recent = RecentRequests(window_s=300)
        recent.load(store)
        now = time.time()
        recent.remember("a1", now, "agent:main:t:dm:a")
        recent.remember("b1", now, "agent:main:t:dm:b")
        recent.remember("a2", now, "agent:main:t:dm:a")
        recent.forget("agent:main:t:dm:a")
        assert [recent.seen(r, store, now) for r in ("a1", "b1", "a2")] == [None, "agent:main:t:dm:b", None]
        recent.forget(None)
        assert len(recent) == 0
    finally:
        asyncio.run(store.close())

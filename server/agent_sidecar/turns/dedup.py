"""The dedup window's index of request ids: a request id accepted within the
last ``dedup_window_s`` (docs/semantics.md: five minutes) never starts a second turn.

Every prompt asks, so the answer is a dict lookup, not a store read: the ids
accepted within the window, oldest first, trimmed as they age out. The ledger
(persisted) stays the authority across restarts: ``load`` brings the last
run's ids of the window into memory at startup, and only when there were more
than ``limit`` of them is the ledger asked, for one window, about an id not
found here.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from . import jobs

RECENT_PRELOAD = 200_000  # request ids loaded from the ledger at startup, at most


class RecentRequests:
    def __init__(self, window_s: float):
        self.window_s = window_s
        self._at: OrderedDict[str, float] = OrderedDict()
        # Until this time, an id missing from ``_at`` may still be in the ledger
        # from the last run (see load).
        self._ledger_until = time.time() + window_s

    def __len__(self) -> int:
        return len(self._at)

    def load(self, store, limit: int = RECENT_PRELOAD) -> None:
        """At startup: the ids the last run accepted within the window."""
        now = time.time()
        rows = store.read(lambda c: c.execute(
            "SELECT request_id, created_at FROM prompts WHERE created_at >= ?"
            " ORDER BY created_at DESC LIMIT ?", (now - self.window_s, limit + 1)).fetchall())
        for rid, at in reversed(rows[:limit]):
            self._at[rid] = at
        if len(rows) <= limit:
            self._ledger_until = 0.0

    def seen(self, rid: str, store, now: float) -> bool:
        """Was ``rid`` accepted within the window before ``now``?"""
        at = self._at.get(rid)
        if at is None and now < self._ledger_until:
            row = store.read(lambda c: jobs.ledger_lookup(c, rid))
            at = row[1] if row else None
        return at is not None and now - at < self.window_s

    def remember(self, rid: str, at: float) -> None:
        self._at[rid] = at
        self._at.move_to_end(rid)
        horizon = time.time() - self.window_s
        while self._at:
            oldest, t = next(iter(self._at.items()))
            if t >= horizon:
                break
            del self._at[oldest]

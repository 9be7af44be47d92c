"""The dedup window's index of request ids: a request id accepted within the
last ``dedup_window_s`` (docs/semantics.md: five minutes) never starts a second turn.

Every prompt asks, so the answer is a dict lookup, not a store read: the ids
accepted within the window, oldest first, trimmed as they age out. The ledger
(persisted) stays the authority across restarts: ``load`` brings the last
run's ids of the window into memory at startup, and only when there were more
than ``limit`` of them is the ledger asked, for one window, about an id not
found here.

A request id belongs to the session key it was accepted for: a call naming
the same key is a twin and replays the original turn; a call naming another
key is refused (INVALID_ARGUMENT on ``request_id``), so one caller's retry can
never land on, or reveal, another session's turn. DeleteSession and
ClearAllSessions delete the ledger rows of the lanes they remove, and their
ids leave this index with them (``forget``): a reuse after them runs a new turn.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from . import jobs

RECENT_PRELOAD = 200_000  # request ids loaded from the ledger at startup, at most


class RecentRequests:
    def __init__(self, window_s: float):
        self.window_s = window_s
        self._at: OrderedDict[str, tuple[float, str]] = OrderedDict()  # rid -> (accepted at, key)
        # Until this time, an id missing from ``_at`` may still be in the ledger
        # from the last run (see load).
        self._ledger_until = time.time() + window_s

    def __len__(self) -> int:
        return len(self._at)

    async def load(self, store, limit: int = RECENT_PRELOAD) -> None:
        """At startup: the ids the last run accepted within the window."""
        rows = await store.recent_requests(time.time() - self.window_s, limit + 1)
        for rid, at, key in reversed(rows[:limit]):
            self._at[rid] = (at, key)
        if len(rows) <= limit:
            self._ledger_until = 0.0

    def seen(self, rid: str, now: float) -> str | None:
        """The session key ``rid`` was accepted for within the window before
        ``now``, or None (for an id this index does not hold, ask the ledger
        while ``may_be_in_ledger``)."""
        entry = self._at.get(rid)
        if entry is None or now - entry[0] >= self.window_s:
            return None
        return entry[1]

    def may_be_in_ledger(self, rid: str, now: float) -> bool:
        """Whether an id missing here may still be in the ledger from the last
        run (the startup preload was cut at its limit)."""
        return rid not in self._at and now < self._ledger_until

    def remember(self, rid: str, at: float, key: str) -> None:
        self._at[rid] = (at, key)
        self._at.move_to_end(rid)
        horizon = time.time() - self.window_s
        while self._at:
            oldest, (t, _) = next(iter(self._at.items()))
            if t >= horizon:
                break
            del self._at[oldest]

    def snapshot(self) -> dict[str, tuple[float, str]]:
        """The ids held now: rid -> (accepted at, session key)."""
        return dict(self._at)

    def forget_ids(self, gone: dict[str, tuple[float, str]]) -> None:
        """Drop these ids (a ``snapshot``'s entries whose ledger rows were
        deleted), unless an id was accepted again since (its entry changed)."""
        for rid, entry in gone.items():
            if self._at.get(rid) == entry:
                del self._at[rid]

    def forget(self, key: str | None) -> None:
        """Drop the ids of session ``key`` (every id for None): their ledger
        rows were deleted. A scan: deletes are rare, lookups are not."""
        if key is None:
            self._at.clear()
            return
        for rid in [rid for rid, (_, k) in self._at.items() if k == key]:
            del self._at[rid]


async def is_twin(m, rid: str, key: str) -> bool:
    """Is this Prompt a twin of a known one (live, or accepted within the
    window) for the same session key? Raises INVALID_ARGUMENT naming
    ``request_id`` when the id is known for another key (see the module doc).
    Answered from memory; the ledger is read only for ids the startup preload
    may have missed, and then the live turns are asked again after that read."""
    now = time.time()
    owner = _owner(m, rid, now)
    if owner is None and m.recent.may_be_in_ledger(rid, now):
        e = await m.store.ledger(rid)
        if e is not None and now - e.created_at < m.recent.window_s:
            owner = e.session_key
        owner = _owner(m, rid, now) or owner
    if owner is None:
        return False
    if owner != key:
        raise jobs.request_id_reused(rid)
    return True


def _owner(m, rid: str, now: float) -> str | None:
    twin = m.live.get(rid)
    return twin.key if twin is not None else m.recent.seen(rid, now)

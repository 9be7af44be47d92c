"""The system prompt a turn runs with: the profile's prompt plus the session
context section of seed 001 §9 (with PII redaction where configured).

``SystemPrompts`` builds it once per incarnation and caches it: the context
section depends only on the lane's origin and incarnation, which do not change
from one turn to the next.
"""

from __future__ import annotations

from datetime import datetime, timezone

import orjson

from ..config import Config, Profile
from ..sessions.context import build_session_context_prompt
from ..sessions.source import SessionSource

CACHE_MAX = 8192  # prompts kept; past it the cache starts over


def system_prompt_for(cfg: Config, profile: Profile, key: str, row: tuple) -> str:
    """``row`` is (session_id, created_at, origin JSON) of the lane."""
    session_id, created_at, origin = row
    if not origin:
        return profile.system_prompt
    section = build_session_context_prompt(
        SessionSource.from_dict(orjson.loads(origin)), session_key=key, session_id=session_id,
        created_at=datetime.fromtimestamp(created_at, timezone.utc),
        connected_platforms=cfg.connected_platforms, home_channels=cfg.home_channels,
        redact_pii=cfg.redact_pii, pii_safe_platforms=cfg.pii_safe_platforms(),
        group_sessions_per_user=cfg.group_sessions_per_user,
        thread_sessions_per_user=cfg.thread_sessions_per_user)
    return f"{profile.system_prompt}\n\n{section}"


class SystemPrompts:
    def __init__(self, cfg: Config, store):
        self.cfg, self.store = cfg, store
        self._cache: dict[tuple, str] = {}

    def routing_row(self, key: str) -> tuple | None:
        """(session_id, created_at, origin JSON) of the lane, or None."""
        return self.store.read(lambda c: c.execute(
            "SELECT session_id, created_at, origin FROM routing WHERE session_key = ?",
            (key,)).fetchone())

    def for_turn(self, turn) -> tuple[Profile, str]:
        """The turn's profile and system prompt."""
        profile = self.cfg.profile(turn.profile) or self.cfg.profile("main")
        row = turn.routing_row or self.routing_row(turn.key) or (turn.sid, turn.created_at, None)
        cache_key = (profile.name, turn.key, row[0])
        text = self._cache.get(cache_key)
        if text is None:
            if len(self._cache) >= CACHE_MAX:
                self._cache.clear()
            text = self._cache[cache_key] = system_prompt_for(self.cfg, profile, turn.key, row)
        return profile, text

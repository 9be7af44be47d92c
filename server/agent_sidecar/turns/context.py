"""The system prompt a turn runs with: the profile's prompt plus the session
context section of seed 001 §9 (with PII redaction where configured).

``SystemPrompts`` builds it once per incarnation and caches it: the context
section depends only on the lane's origin and incarnation, which do not change
from one turn to the next. What it needs of the lane (``LaneState``) comes
with the store's answer to the turn's accept or start, read in the same job.
"""

from __future__ import annotations

from datetime import UTC, datetime

from ..config import Config, Profile
from ..sessions.context import build_session_context_prompt
from ..sessions.source import SessionSource
from .jobs import LaneState

CACHE_MAX = 8192  # prompts kept; past it the cache starts over


def system_prompt_for(cfg: Config, profile: Profile, key: str, lane: LaneState) -> str:
    if not lane.origin:
        return profile.system_prompt
    section = build_session_context_prompt(
        SessionSource.from_dict(lane.origin), session_key=key, session_id=lane.session_id,
        created_at=datetime.fromtimestamp(lane.created_at, UTC),
        connected_platforms=cfg.connected_platforms, home_channels=cfg.home_channels,
        redact_pii=cfg.redact_pii, pii_safe_platforms=cfg.pii_safe_platforms(),
        group_sessions_per_user=cfg.group_sessions_per_user,
        thread_sessions_per_user=cfg.thread_sessions_per_user)
    return f"{profile.system_prompt}\n\n{section}"


class SystemPrompts:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self._cache: dict[tuple, str] = {}

    def for_turn(self, turn, lane: LaneState) -> tuple[Profile, str]:
        """The turn's profile and system prompt in ``lane``."""
        profile = self.cfg.profile(turn.profile) or self.cfg.profile("main")
        assert profile is not None  # the config always has a "main" profile (config.load)
        cache_key = (profile.name, turn.key, lane.session_id)
        text = self._cache.get(cache_key)
        if text is None:
            if len(self._cache) >= CACHE_MAX:
                self._cache.clear()
            text = self._cache[cache_key] = system_prompt_for(self.cfg, profile, turn.key, lane)
        return profile, text

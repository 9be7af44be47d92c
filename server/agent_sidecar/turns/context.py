"""The system prompt a turn runs with: the profile's prompt plus the session
context section of seed 001 §9 (with PII redaction where configured).

``SystemPrompts`` caches it per incarnation and origin: the context section
depends only on those, and the origin is the latest source a prompt or
GetOrCreateSession gave the lane (sessions/lifecycle.py ``kept``), so a chat
renamed (or retitled) mid-conversation gets a section naming it as it is now,
the same text GetSessionContext renders for that source (seed 001 §9: where
the current message came from). Keyed on the incarnation alone, the first
turn's section stayed for the whole incarnation and disagreed with
GetSessionContext and the Session's display name. A lane's origin rarely
changes, so the model's prompt cache is kept across turns all the same. What
it needs of the lane (``LaneState``) comes with the store's answer to the
turn's accept or start, read in the same job.
"""

from __future__ import annotations

from datetime import UTC, datetime

import orjson

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


def _origin_key(lane: LaneState) -> bytes:
    """The lane's origin as a cache key, but for its ``message_id``: the
    section never shows it (sessions/context.py), and most prompts carry a
    new one, which would make each turn a miss."""
    if not lane.origin:
        return b""
    return orjson.dumps({k: v for k, v in lane.origin.items() if k != "message_id"},
                        option=orjson.OPT_SORT_KEYS)


class SystemPrompts:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self._cache: dict[tuple, str] = {}

    def for_turn(self, turn, lane: LaneState) -> tuple[Profile, str]:
        """The turn's profile and system prompt in ``lane``."""
        profile = self.cfg.profile(turn.profile) or self.cfg.profile("main")
        assert profile is not None  # the config always has a "main" profile (config.load)
        cache_key = (profile.name, turn.key, lane.session_id, lane.created_at, _origin_key(lane))
        text = self._cache.get(cache_key)
        if text is None:
            if len(self._cache) >= CACHE_MAX:
                self._cache.clear()
            text = self._cache[cache_key] = system_prompt_for(self.cfg, profile, turn.key, lane)
        return profile, text

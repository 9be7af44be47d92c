"""The system prompt a turn runs with: the profile's prompt plus the session
context section of seed 001 §9 (with PII redaction where configured)."""

from __future__ import annotations

from datetime import datetime, timezone

from ..config import Config, Profile
from ..sessions.context import build_session_context_prompt
import orjson

from ..sessions.source import SessionSource


def system_prompt_for(cfg: Config, profile: Profile, key: str, row: tuple) -> str:
    """``row`` is (session_id, created_at, origin JSON) of the lane."""
    session_id, created_at, origin = row
    if not origin:
        return profile.system_prompt
    section = build_session_context_prompt(
        SessionSource.from_dict(orjson.loads(origin)), session_key=key, session_id=session_id,
        created_at=datetime.fromtimestamp(created_at, timezone.utc),
        connected_platforms=cfg.connected_platforms, home_channels=cfg.home_channels,
        redact_pii=cfg.redact_pii, group_sessions_per_user=cfg.group_sessions_per_user,
        thread_sessions_per_user=cfg.thread_sessions_per_user)
    return f"{profile.system_prompt}\n\n{section}"

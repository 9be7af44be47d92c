"""``SessionEntry``: one routing row, the per-lane record of seed 001 §2.

The routing table holds every field as a real column, so token accounting and
flag changes are single UPDATE statements inside writer jobs. ``turn_count``
comes from the current incarnation (seed 000's session row).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import orjson

from .source import SessionSource

ROUTING_COLUMNS = (
    "session_key", "session_id", "profile", "platform", "chat_type", "created_at",
    "updated_at", "origin", "display_name", "input_tokens", "output_tokens",
    "cache_read_tokens", "cache_write_tokens", "total_tokens", "estimated_cost_usd",
    "cost_status", "last_prompt_tokens", "was_auto_reset", "auto_reset_reason",
    "reset_had_activity", "is_fresh_reset", "expiry_finalized", "suspended",
    "resume_pending", "resume_reason", "last_resume_marked_at", "running",
)
# SELECT list for an entry: routing columns plus the incarnation's turn count.
ENTRY_SELECT = (
    "SELECT " + ", ".join("r." + c for c in ROUTING_COLUMNS)
    + ", COALESCE(i.turn_count, 0) FROM routing r"
    " LEFT JOIN incarnations i ON i.session_id = r.session_id"
)
_BOOLS = {"was_auto_reset", "reset_had_activity", "is_fresh_reset", "expiry_finalized",
          "suspended", "resume_pending", "running"}


@dataclass(slots=True)
class SessionEntry:
    session_key: str
    session_id: str
    profile: str
    platform: str
    chat_type: str
    created_at: float
    updated_at: float
    origin: SessionSource | None = None
    display_name: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    total_tokens: int = 0
    estimated_cost_usd: float = 0.0
    cost_status: str = "unknown"
    last_prompt_tokens: int = 0
    was_auto_reset: bool = False
    auto_reset_reason: str = ""
    reset_had_activity: bool = False
    is_fresh_reset: bool = False
    expiry_finalized: bool = False
    suspended: bool = False
    resume_pending: bool = False
    resume_reason: str = ""
    last_resume_marked_at: float | None = None
    running: bool = False
    turn_count: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: tuple) -> "SessionEntry":
        values = dict(zip(ROUTING_COLUMNS, row))
        values["turn_count"] = row[len(ROUTING_COLUMNS)]
        origin = values["origin"]
        values["origin"] = SessionSource.from_dict(orjson.loads(origin)) if origin else None
        for b in _BOOLS:
            values[b] = bool(values[b])
        return cls(**values)


def load_entry(conn, session_key: str) -> SessionEntry | None:
    row = conn.execute(ENTRY_SELECT + " WHERE r.session_key = ?", (session_key,)).fetchone()
    return SessionEntry.from_row(row) if row else None


def new_session_id(now: float | None = None) -> str:
    """seed 001's format, UTC: ``YYYYMMDD_HHMMSS_<8hex>``."""
    t = datetime.fromtimestamp(now if now is not None else time.time(), tz=timezone.utc)
    return t.strftime("%Y%m%d_%H%M%S_") + os.urandom(4).hex()

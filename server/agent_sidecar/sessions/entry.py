"""``SessionEntry``: one routing row, the per-lane record of seed 001 §2 (the
record itself is the store's, store/records.py), and the session id format."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime

from ..store.records import SessionEntry
from .source import SessionSource

__all__ = ["SessionEntry", "new_session_id", "origin_of"]


def new_session_id(now: float | None = None) -> str:
    """seed 001's format, UTC: ``YYYYMMDD_HHMMSS_<8hex>``."""
    t = datetime.fromtimestamp(now if now is not None else time.time(), tz=UTC)
    return t.strftime("%Y%m%d_%H%M%S_") + os.urandom(4).hex()


def origin_of(entry: SessionEntry) -> SessionSource:
    """The source that last reached the lane (a bare one of its platform when
    none was recorded, e.g. a lane written only through AppendMessages)."""
    if entry.origin:
        return SessionSource.from_dict(entry.origin)
    return SessionSource(platform=entry.platform)

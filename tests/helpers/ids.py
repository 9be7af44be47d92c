"""Ids no other test uses (tests share one sidecar per module), sources and
filler text."""

from __future__ import annotations

import itertools
import os
import re
import time

from agent_sidecar.v1 import common_pb2 as c

SESSION_ID_RE = re.compile(r"^\d{8}_\d{6}_[0-9a-f]{8}$")
_ids = itertools.count(1)


def rid(prefix: str = "r") -> str:
    """A request id unique across processes and runs."""
    return f"{prefix}-{os.getpid()}-{next(_ids)}-{time.monotonic_ns()}"


def uniq(prefix: str = "c") -> str:
    """A short id unique in this test process (chat ids, names)."""
    return f"{prefix}{os.getpid()}x{next(_ids)}"


def chat() -> str:
    return uniq("chat")


def source(platform: str = "telegram", chat_id: str | None = None, **kw) -> c.SessionSource:
    """A SessionSource on a chat no other test uses (unless ``chat_id`` is given)."""
    return c.SessionSource(platform=platform, chat_id=chat() if chat_id is None else chat_id, **kw)


def words(n: int, tag: str = "w") -> str:
    """``n`` distinct words: an echo turn streams one per token."""
    return " ".join(f"{tag}{i}" for i in range(n))

"""Store-level jobs: work every backend does through the unit of work, with no
domain rule in it (the rules' jobs live in sessions/, turns/, recovery/)."""

from __future__ import annotations


def nothing(uow) -> None:
    """A barrier: its answer means every job written before it has committed."""
    return None


def index_messages(uow, limit: int | None = None) -> int:
    """Bring the full-text index up to date (at most ``limit`` rows)."""
    return uow.index_messages(limit)

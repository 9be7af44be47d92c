"""TurnManager: the parent-side owner of turns (placeholder until turns land)."""

from __future__ import annotations


class TurnManager:
    def __init__(self, cfg, store):
        self.cfg, self.store = cfg, store

    async def start_workers(self) -> None:
        pass

    def servicers(self, auth) -> list:
        return []

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def queue_depth(self, key: str) -> int:
        return 0

    def busy_keys(self) -> set[str]:
        return set()

    async def on_reset(self, key: str) -> None:
        pass

    async def on_suspend(self, key: str) -> None:
        pass

    async def on_delete(self, key: str) -> None:
        pass

    async def on_clear_all(self) -> None:
        pass

"""``WriterBacked``: the write half of interface.Store, the same for every
backend whose writes go through a ``GroupCommitWriter`` (store/writer/): the
one write API, the barrier, and what the writer's fault monitor says about
whether the store can write. A backend class mixes it in and sets
``self.writer``; it adds its reads and its own start and close."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ..faults import StoreClosed, StoreUnavailable
from ..jobs import nothing
from .client import GroupCommitWriter


class WriterBacked:
    writer: GroupCommitWriter

    def write(self, job: Callable[..., Any], *args: Any, retry: bool = False) -> asyncio.Future:
        """``job(uow, *args)`` in the writer process (see interface.py)."""
        return self.writer.write(job, *args, retry=retry)

    def flush(self) -> None:
        self.writer.flush()

    async def barrier(self) -> None:
        """Returns once every write submitted before it has committed."""
        await self.writer.write(nothing)

    @property
    def fault(self) -> StoreUnavailable | None:
        """What keeps the store from writing now, or None when it can."""
        return self.writer.faults.fault

    @property
    def writable(self) -> bool:
        return self.fault is None and not self.writer.closed

    def check_writable(self) -> None:
        """Raise StoreUnavailable while the store is failing: for callers that
        would change state in memory before their first write."""
        if self.writer.closed:
            raise StoreClosed("the store is closed")
        self.writer.faults.refuse()

    def watch_faults(self, listener: Callable[[StoreUnavailable | None], None]) -> None:
        self.writer.faults.listen(listener)

    def add_retrier(self, retrier: Callable[[], None]) -> None:
        self.writer.faults.add_retrier(retrier)

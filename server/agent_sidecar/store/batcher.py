"""Coalescing writes of one kind into one writer job per loop iteration.

``Batcher(store, run_many)``: every ``submit(item)`` made during one event-loop
iteration goes to the writer as ONE job, ``run_many(conn, items)`` (a
module-level function; items are plain data, pickled to the writer), which
returns one result (or exception) per item. Group commit already shares the
fsync; this also shares the Python work — one executemany instead of a job
per caller — which is what lets a hundred sessions appending at once approach
SQLite's bulk-insert speed.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable


class Batcher:
    def __init__(self, store, run_many: Callable[[Any, list], list]):
        self.store = store
        self.run_many = run_many
        self._items: list = []
        self._futures: list[asyncio.Future] = []
        self._scheduled = False

    def submit(self, item) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._items.append(item)
        self._futures.append(fut)
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        items, futures = self._items, self._futures
        self._items, self._futures, self._scheduled = [], [], False
        self.store.send_now(self.run_many, (items,), lambda ok, value: _resolve(ok, value, futures))


def _resolve(ok: bool, value: Any, futures: list[asyncio.Future]) -> None:
    if not ok:
        for f in futures:
            if not f.done():
                f.set_exception(value)
        return
    for f, result in zip(futures, value):
        if f.done():
            continue
        if isinstance(result, BaseException):
            f.set_exception(result)
        else:
            f.set_result(result)

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
import logging
from typing import Any, Callable

log = logging.getLogger("agent_sidecar.store")


class Batcher:
    def __init__(self, store, run_many: Callable[[Any, list], list]):
        self.store = store
        self.run_many = run_many
        self._items: list = []
        self._futures: list[asyncio.Future] = []
        self._thens: list[Callable[[Any], None] | None] = []
        self._scheduled = False

    def submit(self, item, then: Callable[[Any], None] | None = None) -> asyncio.Future:
        """Queue ``item``; the future resolves to its result. ``then(result or
        exception)`` runs first, synchronously, as the commit is answered: in
        commit order with every other write's callback, and even if the caller
        stopped awaiting the future."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._items.append(item)
        self._futures.append(fut)
        self._thens.append(then)
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return fut

    def flush_now(self) -> None:
        """Send what is queued now instead of at the next loop iteration, so a
        job submitted right after it runs after it."""
        self._flush()

    def _flush(self) -> None:
        if not self._items:  # flushed early by flush_now
            self._scheduled = False
            return
        items, futures, thens = self._items, self._futures, self._thens
        self._items, self._futures, self._thens, self._scheduled = [], [], [], False
        try:
            self.store.send_now(self.run_many, (items,),
                                lambda ok, value: _resolve(ok, value, futures, thens))
        except Exception as e:  # the store closed (or the job cannot be sent): callers hear it
            _resolve(False, e, futures, thens)


def _resolve(ok: bool, value: Any, futures: list[asyncio.Future], thens: list) -> None:
    results = value if ok else [value] * len(futures)
    for f, then, result in zip(futures, thens, results):
        if then is not None:
            try:
                then(result)
            except Exception:
                log.exception("a batched write's callback failed")
        if f.done():
            continue
        if isinstance(result, BaseException):
            f.set_exception(result)
        else:
            f.set_result(result)

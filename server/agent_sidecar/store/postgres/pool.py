"""``ReadPool``: the parent's read connections (psycopg_pool), and what a read
does while the database cannot be reached.

Guarantees, and why:

* A read never waits for a connection longer than ``WAIT_S``, and only
  ``WAIT_DOWN_S`` while the database is known to be out of reach (the last
  read failed for it, or the store cannot write; a read that merely waited
  out ``WAIT_S`` while the store writes met a busy pool, which says nothing
  of the database, and does not hurry the next ones): it then fails
  ``StoreUnavailable`` (UNAVAILABLE, STORE_UNAVAILABLE, retry), well inside
  any caller's deadline, instead of queueing behind connection attempts that
  cannot succeed until the call's deadline runs out.
* A read that meets a connection lost with the server (a restart, a
  failover, an operator's pg_terminate_backend, a role's
  ``idle_session_timeout``: the pool still holds the dead connections) runs
  again on another (waiting ``WAIT_DOWN_S`` for it), as often as the pool
  may hold connections, each dead one discarded as it is met: reads are one
  statement each, so running one again is harmless, and the first read after
  the database came back does not fail for the connections it happened to
  get, however many of them died.
* Read connections come back when the database does, not on the pool's own
  schedule: psycopg_pool retries a lost connection with a doubling delay for
  up to its ``reconnect_timeout``, so after a long outage its next attempt
  could come minutes after the database is back, and every read would fail
  while health already says SERVING. Here each round of attempts gives up
  after ``RECONNECT_S``, and the next read that finds no connection makes a
  new one at once; once the store writes again (``revive``) reads wait for
  it as usual, so a read made when health says SERVING again gets an answer.
* One log line per outage: the pool's line per failed connection attempt
  (several a second while reads keep coming) is only kept for the first
  attempt of an episode; ``StoreUnavailable`` says the rest to the callers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from .codec import configure
from .connection import connect_kwargs, is_fault, unavailable

log = logging.getLogger("agent_sidecar.store")
# A read that waited out its time for a connection: an outage, or every connection busy.
NO_CONNECTION = "no PostgreSQL connection came in time (the database out of reach, or every connection busy)"

WAIT_S = 5.0  # the longest wait for a free read connection while the database answers
WAIT_DOWN_S = 0.5  # ... while it is out of reach: time enough to connect, when it is back
RECONNECT_S = 1.0  # one round of the pool's attempts to replace a lost connection
_POOL_LOG = "psycopg.pool"
_ATTEMPT_LINES = ("error connecting in", "reconnection attempt in pool")


async def _configure(conn: psycopg.AsyncConnection) -> None:
    configure(conn)


class ReadPool:
    """``await open()``, ``await run(fn, *args)`` (``fn(conn, *args)``, one
    statement), ``await close()``. ``failing()`` tells whether the store
    already knows it cannot write (the writer's fault state)."""

    def __init__(self, dsn: str, size: int, failing: Callable[[], bool]):
        self._failing = failing
        self.down = False  # the last read failed because the database could not be reached (logged once)
        self._hurry = False  # reads wait WAIT_DOWN_S: down, and the store has not written since
        self._size = max(1, size)
        self._pool = AsyncConnectionPool(dsn, min_size=1, max_size=self._size, open=False,
                                         kwargs=connect_kwargs(dsn, autocommit=True), configure=_configure,
                                         reconnect_timeout=RECONNECT_S, name="agent-sidecar-reads")
        self._quiet = _EpisodeFilter(self)
        logging.getLogger(_POOL_LOG).addFilter(self._quiet)

    async def open(self, timeout: float = 30.0) -> None:
        await self._pool.open(wait=True, timeout=timeout)

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        for attempt in range(self._size + 1):  # every connection the pool holds may be dead
            last = attempt == self._size
            wait = WAIT_DOWN_S if attempt or self._hurry or self._failing() else WAIT_S
            conn: psycopg.AsyncConnection | None = None
            try:
                async with self._pool.connection(timeout=wait) as conn:
                    result = await fn(conn, *args)
            except Exception as e:
                if not (is_fault(e) or isinstance(e, TimeoutError)):
                    raise
                waited = isinstance(e, (PoolTimeout, TimeoutError))
                # Lost, not merely refused (a statement_timeout's cancel leaves it usable: not run again).
                stale = conn is not None and conn.broken and not waited
                if last or not stale:
                    if not waited or self._failing():  # a wait alone may be a busy pool, not an outage
                        self._went_down(e)
                    raise unavailable(e, NO_CONNECTION if waited and not self.down else None) from None
                continue  # a connection lost since its last use: again, on another
            if self.down:
                log.info("store reads answer again")
            self.down = self._hurry = False
            return result
        raise AssertionError("unreachable")

    def revive(self) -> None:
        """The store writes again (its fault state ended): the next read waits
        for a connection as usual (``WAIT_S``) instead of giving up early,
        while the pool connects again."""
        self._hurry = False

    def _went_down(self, e: BaseException) -> None:
        if not self.down:
            log.warning("store reads failing", extra={"error": f"{type(e).__name__}: {e}"})
        self.down = self._hurry = True

    async def close(self) -> None:
        logging.getLogger(_POOL_LOG).removeFilter(self._quiet)
        await self._pool.close()


class _EpisodeFilter(logging.Filter):
    """Drops psycopg_pool's line per failed connection attempt while the
    reads are already known to be failing (the episode was logged once)."""

    def __init__(self, pool: ReadPool):
        super().__init__()
        self._pool = pool

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._pool.down:
            return True
        return not any(record.getMessage().startswith(s) for s in _ATTEMPT_LINES)

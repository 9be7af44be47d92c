"""When the store cannot write: one error, one state, one way back.

A full disk, an I/O error, a read-only remount, a database locked past the busy
timeout, a lost database connection: the backend's driver raises them in the
writer process, from a job or from COMMIT. For a client they are one condition
(nothing can be made durable now; retry later), so they become one error,
``StoreUnavailable``: a SidecarError with reason STORE_UNAVAILABLE and a
RetryInfo delay, which the API layer sends as UNAVAILABLE. The mapping happens
in ONE place, the writer process (writer/group.py asks its backend which
exceptions are faults), so handlers never see a driver's error and never
answer INTERNAL for one. ``StoreClosed`` (the writer gone) is a
``StoreUnavailable`` too.

``FaultMonitor`` is the state. The first store fault makes the store *failing*:
listeners hear it (health goes NOT_SERVING, the turn manager ends its running
turns), and every new job is refused at once with the same error: callers
learn fast, and a failing disk is not hammered. Only *retry* jobs pass. After a
backoff a retry round runs: each retrier re-sends what it holds (the frame bus,
the frames it could not commit), then a probe writes one row. The store is
writable again only when EVERY job of a round committed: a nearly full disk
with room for the one-row probe but not for the held frames must not flap
between failing and writable.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import STORE_UNAVAILABLE, SidecarError

if TYPE_CHECKING:  # the monitor's loop is the parent's; the store writer process imports
    import asyncio  # this module for its errors and runs no event loop

log = logging.getLogger("agent_sidecar.store")

RETRY_AFTER_S = 1.0  # the RetryInfo delay clients get; the slowest retry round comes this often
FIRST_ROUND_S = 0.05  # the first retry round: a brief fault (a checkpoint's burst) ends fast
_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS})


class StoreUnavailable(SidecarError):
    """The store cannot write now; retry after ``retry_after_s``. ``message``
    is what callers are told, in the product's words; ``cause`` the driver's
    own text, for the log lines only (it can name the database's host, socket
    or role, which a client has no business seeing)."""

    def __init__(self, message: str, cause: str = ""):
        super().__init__(STORE_UNAVAILABLE, message, retry_after_s=RETRY_AFTER_S)
        self.cause = cause

    def __reduce__(self):
        return (type(self), (self.message, self.cause))


def is_store_fault(e: BaseException, driver_faults: tuple[type, ...] = ()) -> bool:
    """Whether ``e`` says the store cannot write (as opposed to a job's own
    failure, a domain refusal or a bug, which a retry would not cure).
    ``driver_faults``: the backend driver's exception types that mean it
    (a full disk, an I/O error, a lost connection)."""
    if isinstance(e, StoreUnavailable) or (driver_faults and isinstance(e, driver_faults)):
        return True
    return isinstance(e, OSError) and e.errno in _ERRNOS


def unavailable(e: BaseException) -> StoreUnavailable:
    if isinstance(e, StoreUnavailable):
        return e
    return StoreUnavailable(f"the store failed ({e}); retry later")


def probe(uow) -> None:
    """The retry round's own write (a job): the backend's proof that it can
    write again (see UnitOfWork.probe)."""
    uow.probe()


class CommitOutcomeUnknown(Exception):
    """Raised by a writer backend's ``commit`` when its connection was lost
    with the COMMIT sent: the transaction may have committed. ``resolve()``
    finds out: True (committed), False (not), None (cannot tell yet: ask
    again later). SQLite never raises it: a COMMIT that failed there did not
    commit."""

    def __init__(self, cause: BaseException, resolve: Callable[[], bool | None]):
        super().__init__(str(cause))
        self.cause, self.resolve = cause, resolve


class StoreClosed(StoreUnavailable):
    """The store was closed (or its writer died); no more writes are accepted.
    For a client the same as any store that cannot write: UNAVAILABLE,
    STORE_UNAVAILABLE, retry (the next sidecar will take it)."""


class FaultMonitor:
    """Whether the store is failing, for one writer (see the module docstring).
    ``send_probe()`` sends the probe job (a retry job) through that writer."""

    def __init__(self, send_probe: Callable):
        self._send_probe = send_probe
        self.fault: StoreUnavailable | None = None
        self.since = 0.0
        self._listeners: list[Callable[[StoreUnavailable | None], None]] = []
        self._retriers: list[Callable[[], None]] = []
        self._round: set[int] | None = None  # job ids of the open round, while it is being sent
        self._waiting: set[int] = set()  # of the round sent, those not answered yet
        self._round_ok = True
        self._round_done: asyncio.Future | None = None
        self._task: asyncio.Task | None = None
        self._closed = False

    def listen(self, listener: Callable[[StoreUnavailable | None], None]) -> None:
        """``listener(fault)`` when the store starts failing, ``listener(None)``
        when it writes again."""
        self._listeners.append(listener)

    def add_retrier(self, retrier: Callable[[], None]) -> None:
        """``retrier()`` at each retry round: re-send held writes as retry jobs."""
        self._retriers.append(retrier)

    def refuse(self) -> None:
        """Raise (a fresh copy of) the fault while the store is failing."""
        if self.fault is not None:
            raise StoreUnavailable(self.fault.message, self.fault.cause)

    # -- what the writer tells us ----------------------------------------------------------

    def sent(self, jid: int) -> None:
        """A retry job left; it belongs to the round being sent, if any."""
        if self._round is not None:
            self._round.add(jid)

    def answered(self, jid: int, ok: bool, fault: StoreUnavailable | None) -> None:
        """Job ``jid`` was answered (``ok``: it committed); ``fault`` if it
        failed for a store fault."""
        if fault is not None:
            self._failing(fault)
        if jid in self._waiting:
            self._waiting.discard(jid)
            self._round_ok = self._round_ok and ok
            if not self._waiting:
                self._end_round(self._round_ok)

    def closed(self) -> None:
        """The writer is gone or closing: no more rounds."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
        self._end_round(False)

    # -- the state and the way back --------------------------------------------------------

    def _failing(self, fault: StoreUnavailable) -> None:
        if self.fault is not None:
            return
        self.fault, self.since = fault, time.monotonic()
        log.error("the store cannot write; refusing writes until it can",
                  extra={"error": fault.message, **({"cause": fault.cause} if fault.cause else {})})
        self._tell(fault)
        if not self._closed:
            import asyncio
            self._task = asyncio.get_running_loop().create_task(self._recover())

    async def _recover(self) -> None:
        """Retry rounds with a doubling delay (up to RETRY_AFTER_S) until one
        commits whole; then the store is writable again."""
        import asyncio
        delay = FIRST_ROUND_S
        while True:
            await asyncio.sleep(delay)
            if await self._retry_round():
                break
            if self._closed:
                return
            delay = min(delay * 2, RETRY_AFTER_S)
        log.warning("the store can write again",
                    extra={"failing_s": round(time.monotonic() - self.since, 3)})
        self.fault, self._task = None, None
        self._tell(None)

    async def _retry_round(self) -> bool:
        import asyncio
        self._round, self._round_ok = set(), True
        self._round_done = asyncio.get_running_loop().create_future()
        try:
            for retrier in list(self._retriers):
                try:
                    retrier()
                except StoreUnavailable:
                    raise
                except Exception:
                    log.exception("a store retrier failed")
            self._send_probe().add_done_callback(_consume)
        except StoreUnavailable:  # closed meanwhile
            self._round = None
            return False
        self._waiting, self._round = self._round, None
        return await self._round_done

    def _end_round(self, ok: bool) -> None:
        self._waiting = set()
        if self._round_done is not None and not self._round_done.done():
            self._round_done.set_result(ok)

    def _tell(self, fault: StoreUnavailable | None) -> None:
        for listener in list(self._listeners):
            try:
                listener(fault)
            except Exception:
                log.exception("a store fault listener failed")


def _consume(fut: asyncio.Future) -> None:
    """The probe's answer counts through ``answered``; its exception is read
    here only so asyncio does not report it as never retrieved."""
    if not fut.cancelled():
        fut.exception()

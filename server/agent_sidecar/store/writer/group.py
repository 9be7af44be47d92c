"""One group of jobs in one transaction: how the writer process
(process.py) runs the jobs it took from its pipe and what it answers.

Each job runs in its own savepoint, so one failing job rolls back alone; the
answers (``(job id, ok, result or exception)``) exist only after COMMIT went
through durably. A store fault (the backend's ``is_fault``) travels as
StoreUnavailable, so the parent never needs to know a driver's exception
types. A COMMIT that failed did not commit, and its jobs are answered as
failed. A backend that can lose its connection with COMMIT in flight
(PostgreSQL) raises CommitOutcomeUnknown instead: that group's answers wait
until the backend can tell what happened (``Unknown``), and the groups
behind it are refused meanwhile.

Jobs marked ``@batched(many)`` (store/unit_of_work.py) run as one ``many`` call
per run of consecutive calls in a group: one executemany where there would be
one statement per caller. A job that keeps state in this process across
transactions hears how its transaction ended (``at_end``).
"""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Callable
from typing import Any, Protocol

from ...logs import FaultEpisode
from ..faults import CommitOutcomeUnknown, StoreUnavailable
from .answers import encode_results

log = logging.getLogger("agent_sidecar.store")


class WriterBackend(Protocol):
    """What a backend gives the writer process (one connection)."""

    def begin(self) -> None: ...
    def commit(self) -> None: ...
    def rollback(self) -> None: ...
    def savepoint(self) -> None: ...
    def release(self) -> None: ...
    def rollback_to(self) -> None: ...
    def unit_of_work(self) -> Any: ...
    def is_fault(self, e: BaseException) -> bool: ...
    def unavailable(self, e: BaseException) -> StoreUnavailable:
        """A fault (``is_fault``) as callers are told it (faults.unavailable,
        in the backend's words where the driver's would confuse a user)."""
    def transient(self, e: BaseException) -> bool:
        """A conflict with another writer of the database (a deadlock, a
        serialization failure): the whole group runs again."""
    def close(self) -> None: ...


# What jobs asked to hear about the end of the open transaction: (on_commit, on_rollback).
_at_end: list[tuple[Callable[[], None], Callable[[], None]]] = []


def at_end(on_commit: Callable[[], None], on_rollback: Callable[[], None]) -> None:
    """For a job that keeps state in this process across transactions (the
    frame bus's flush order, turns/flush.py): ``on_commit()`` once its
    transaction committed, ``on_rollback()`` if its work was undone (its own
    savepoint, or the whole transaction)."""
    _at_end.append((on_commit, on_rollback))


# The writer process's backend, from its first group on (``transient``).
_running: list[WriterBackend] = []


def transient(e: BaseException) -> bool:
    """Whether ``e``, met by a job of the group running now, is a conflict
    with another writer of the database (the backend's ``transient``): the
    whole group runs again, so a job that catches errors must let it through."""
    return bool(_running) and _running[0].transient(e)


def _ended(hooks: list, committed: bool) -> None:
    for on_commit, on_rollback in hooks:
        try:
            (on_commit if committed else on_rollback)()
        except Exception:
            log.exception("a job's end-of-transaction hook failed")


def runs_of(jobs: list[tuple[int, bytes]]) -> list[tuple[list[int], Callable, list[tuple]]]:
    """Unpickle and group: consecutive calls of one ``@batched`` job become one
    run; every other job is a run of one. A job that does not unpickle is a
    run whose function raises its error."""
    runs: list[tuple[list[int], Callable, list[tuple]]] = []
    for jid, blob in jobs:
        if type(jid) is tuple:  # a run the parent packed itself (client._packed)
            if not jid:
                continue
            try:
                fn, calls = pickle.loads(blob)
            except Exception as e:
                fn, calls = _raiser(e), [()] * len(jid)
            runs.append((list(jid), fn, calls))
            continue
        try:
            fn, args = pickle.loads(blob)
        except Exception as e:
            fn, args = _raiser(e), ()
        if runs and getattr(fn, "many", None) is not None and runs[-1][1] is fn:
            runs[-1][0].append(jid)
            runs[-1][2].append(args)
        else:
            runs.append(([jid], fn, [args]))
    return runs


def _raiser(e: Exception) -> Callable:
    def raise_it(uow, *args):
        raise e
    return raise_it


def _many_of(fn: Callable[..., Any]) -> Callable[[Any, list[tuple]], list]:
    """The ``many`` a job was marked with by @batched (store/unit_of_work.py)."""
    many: Callable[[Any, list[tuple]], list] = fn.many  # type: ignore[attr-defined]  # set by @batched
    return many


def _run(db: WriterBackend, uow, fn: Callable, args: list[tuple]) -> list[tuple[bool, Any]]:
    """One run in its own savepoint: ``(ok, result or exception)`` per call.
    A batched run that raises is undone and replayed call by call, so one bad
    call fails alone."""
    mark = len(_at_end)
    db.savepoint()
    try:
        if len(args) > 1:
            results = _many_of(fn)(uow, args)
            out = [(not isinstance(r, BaseException), r) for r in results]
        else:
            out = [(True, fn(uow, *args[0]))]
        db.release()
        return out
    except Exception as e:
        if db.transient(e):
            raise  # the whole group runs again (commit)
        _ended(_at_end[mark:], False)
        del _at_end[mark:]
        # After a full disk SQLite may have rolled the whole transaction
        # back: then this raises, and nobody's write counts.
        db.rollback_to()
        db.release()
        if len(args) == 1 or db.is_fault(e):
            return [(False, e)] * len(args)
    return [r for a in args for r in _run(db, uow, fn, [a])]


TRANSIENT_RETRIES = 3


_fault_episode = FaultEpisode(log, "store commit failed")  # ended by the next commit that succeeds


def commit(db: WriterBackend, uow, runs: list[tuple[list[int], Callable, list[tuple]]]
           ) -> list[tuple[int, bool, Any]] | Unknown:
    """Run every job (``runs_of``) inside one transaction; return ``(job id, ok,
    result or exception)`` for each, after COMMIT, or ``Unknown`` when the
    backend cannot tell whether COMMIT went through. A store fault travels as
    StoreUnavailable. A transient conflict with another writer of the database
    runs the group again (a few times, then its error is every job's)."""
    for attempt in range(TRANSIENT_RETRIES):
        out = _commit_once(db, uow, runs, last=attempt == TRANSIENT_RETRIES - 1)
        if out is not None:
            return out
        time.sleep(0.002 * (attempt + 1))
    raise AssertionError("unreachable")


def _commit_once(db: WriterBackend, uow, runs, last: bool) -> list[tuple[int, bool, Any]] | Unknown | None:
    out: list[tuple[int, bool, Any]] = []
    fault: BaseException | None = None  # the first store fault a job met
    _at_end.clear()
    _running[:] = [db]
    try:
        db.begin()
        for jids, fn, args in runs:
            for jid, (ok, value) in zip(jids, _run(db, uow, fn, args)):
                if not ok and fault is None and db.is_fault(value):
                    fault = value
                out.append((jid, ok, value))
        db.commit()
        _ended(_at_end, True)
    except CommitOutcomeUnknown as e:  # COMMIT was sent; its answer was lost
        unknown = Unknown(e, out, list(_at_end))
        _at_end.clear()
        return unknown
    except Exception as e:  # the commit itself failed: nobody's write is durable
        _ended(_at_end, False)
        try:
            db.rollback()
        except Exception:
            pass
        if db.transient(e) and not last:
            _at_end.clear()
            return None
        error: BaseException = fault or e  # "no such savepoint" after a full disk is the full disk
        _failed(db, error)
        out = [(jid, False, error) for jids, _, _ in runs for jid in jids]
    else:
        _fault_episode.ended()
    _at_end.clear()
    return _answers(db, out)


def _failed(db: WriterBackend, error: BaseException) -> None:
    if db.is_fault(error):  # the parent logs the state change; no traceback per commit
        _fault_episode.failed(error=f"{type(error).__name__}: {error}")
    else:
        log.exception("store commit failed", exc_info=error)


def _answers(db: WriterBackend, out: list[tuple[int, bool, Any]]) -> list[tuple[int, bool, Any]]:
    return [(jid, ok, db.unavailable(v) if not ok and db.is_fault(v) else v) for jid, ok, v in out]


RESOLVE_EVERY_S = 0.5  # while idle with a group's outcome unknown: ask the backend this often


class Unknown:
    """A group whose COMMIT was sent and whose answer was lost (a PostgreSQL
    connection dropped): it may have committed. Its jobs are answered, and
    their end-of-transaction hooks run, only once the backend can tell
    (``settle``), so a caller never takes a write that committed for failed
    and sends it again (a frame flush stored twice), nor one that did not for
    done. Until then the groups behind it are refused at once as
    StoreUnavailable (``refuse``): the store is failing, as in an outage, and
    no job can commit before one sent earlier whose fate is open (the frame
    bus's flush order)."""

    def __init__(self, e: CommitOutcomeUnknown, out: list[tuple[int, bool, Any]], hooks: list):
        self.error, self.out, self.hooks = e, out, hooks
        self.t0 = time.perf_counter()
        self.asked: float | None = None  # time.monotonic() when the backend was last asked

    def settle(self, pipe, db: WriterBackend, force: bool = False) -> Unknown | None:
        """Ask the backend (between groups at most every RESOLVE_EVERY_S: a server
        out of reach may take its connect timeout to say so); once it knows,
        answer the group and return None."""
        if not force and self.asked is not None and time.monotonic() - self.asked < RESOLVE_EVERY_S:
            return self
        committed = self.error.resolve()
        self.asked = time.monotonic()
        if committed is None:
            return self
        self._answer(pipe, db, committed)
        return None

    def refuse(self, runs: list[tuple[list[int], Callable, list[tuple]]]) -> list[tuple[int, bool, Any]]:
        error = StoreUnavailable("the store is unavailable: its connection was lost during a commit whose"
                                 " outcome is not known yet; retry later", cause=str(self.error))
        return [(jid, False, error) for jids, _, _ in runs for jid in jids]

    def give_up(self, pipe, db: WriterBackend) -> None:
        """The writer stops with the outcome still unknown: the group is
        answered as failed, which may be wrong (logged)."""
        if self.settle(pipe, db, force=True) is None:
            return
        log.error("the writer stops not knowing whether its last commit went through; answered as failed",
                  extra={"jobs": len(self.out)})
        self._answer(pipe, db, False)

    def _answer(self, pipe, db: WriterBackend, committed: bool) -> None:
        _ended(self.hooks, committed)
        if committed:
            _fault_episode.ended()
            results = _answers(db, self.out)
        else:
            _failed(db, self.error.cause)
            error = db.unavailable(self.error.cause)
            results = [(jid, False, error) for jid, _, _ in self.out]
        pipe.send_bytes(encode_results(results, time.perf_counter() - self.t0))

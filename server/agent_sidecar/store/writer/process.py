"""The store's writer process: one connection, committing in groups.

Every write in the sidecar is a *job*: a module-level function
``job(uow, *args) -> result`` (a domain rule in sessions/, turns/,
recovery/), sent here by reference (pickle names it by module and qualified
name; the arguments are plain data). This process takes every job waiting on
its pipe, runs them all inside one transaction of its backend — each job in
its own savepoint, so one failing job rolls back alone — and answers only after
that transaction committed durably. Many sessions' writes therefore share one
transaction and one fsync.

The process knows no SQL: a *backend* (store/sqlite/, store/postgres/) opens
the connection and gives it the calls it needs (``WriterBackend``): begin,
commit, savepoints, the unit of work a job runs against, and which exceptions
mean "the store cannot write" (``is_fault``). Those become
``StoreUnavailable`` here, before they travel, so the parent never needs to
know a driver's exception types.

Why a process and not a thread: a database driver gives up the GIL around
every statement, so a writer *thread* and the gRPC event loop handed the GIL
back and forth many times per turn and the parent could never use more than
one core. Here SQL runs on its own core; the parent only pickles references.

A COMMIT that failed did not commit, and its jobs are answered as failed.
A backend that can lose its connection with COMMIT in flight (PostgreSQL)
raises CommitOutcomeUnknown instead: that group's answers wait until the
backend can tell what happened (``_Unknown``).

Jobs marked ``@batched(many)`` (store/unit_of_work.py) run as one ``many`` call
per run of consecutive calls in a group: one executemany where there would be
one statement per caller.

Like the turn workers it is spawned, ignores SIGINT/SIGTERM (the parent
decides when it stops) and never imports grpc. On Linux it is killed with its
parent, so a writer can never outlive a ``kill -9``'d sidecar and commit behind
the back of the next one's startup recovery.
"""

from __future__ import annotations

import importlib
import logging
import os
import pickle
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

from ...logs import FaultEpisode
from ..faults import CommitOutcomeUnknown, StoreUnavailable

log = logging.getLogger("agent_sidecar.store")

# Upper bound on jobs per transaction: keeps one commit's latency bounded when a
# flood arrives, while still amortising the fsync over hundreds of writes.
MAX_BATCH = 2000
MAX_MESSAGES = 256
CLOSE = "close"  # the parent's last message, and our answer to it
# Under concurrent load (the last commit carried at least GATHER_MIN_JOBS runs —
# a run of one @batched job counts once: its callers were gathered already — and
# ended less than BUSY_GAP_S ago) the writer sleeps GATHER_S before taking what
# waits on its pipe: fewer, larger commits. Each commit has a fixed cost beyond
# its rows (hot pages rewritten, the log write, the fsync). An idle store, or one
# caller writing in sequence, commits at once: nothing would join its group.
GATHER_S = 0.001
BUSY_GAP_S = 0.002
GATHER_MIN_JOBS = 3


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


def writer_main(pipe, backend: tuple, parent_pid: int, log: tuple[str, str, str],
                preload: tuple[str, ...] = ()) -> None:
    """The spawn target (children.spawn). ``pipe`` is our end of the pipe (child.Pipe);
    ``backend`` is ``("module:function", args)``, the function opening the
    WriterBackend; ``preload`` names the modules jobs live in, imported now
    (while the parent still starts its workers) rather than when the first
    job arrives and health waits for it."""
    from ...child import become_child, tune_gc
    become_child("sidecar-writer", parent_pid)
    from ... import logs
    logs.setup(*log)  # format, level, the libraries' level
    for name in preload:
        importlib.import_module(name)
    opener, args = backend
    module, _, fn = opener.partition(":")
    try:
        db: WriterBackend = getattr(importlib.import_module(module), fn)(*args)
    except Exception as e:  # the database out of reach, its connections exhausted: the parent says why
        pipe.send_bytes(pickle.dumps({"pid": os.getpid(), "error": f"{type(e).__name__}: {e}"}))
        return
    pipe.send_bytes(pickle.dumps({"pid": os.getpid(), "grpc_loaded": "grpc" in sys.modules}))
    tune_gc()
    try:
        _serve(pipe, db)
    finally:
        db.close()
    pipe.send_bytes(pickle.dumps(CLOSE))


def _serve(pipe, db: WriterBackend) -> None:
    """Each message is one parent loop iteration's jobs, or CLOSE. Everything
    already waiting on the pipe joins one group (``commit`` is fed at most
    MAX_BATCH jobs at a time). While a group's outcome is unknown
    (``_Unknown``) the backend is asked again before each group and every
    RESOLVE_EVERY_S while idle; the groups behind it are refused meanwhile."""
    pace = _Pace()
    uow = db.unit_of_work()
    unknown: _Unknown | None = None
    while True:
        if unknown is not None and not pipe.poll(RESOLVE_EVERY_S):
            unknown = unknown.settle(pipe, db, force=True)
            continue
        messages = _receive(pipe, pace)
        if messages is None:  # the parent is gone without closing us
            return
        stop = messages[-1] == CLOSE
        jobs = [job for msg in messages if msg != CLOSE for job in msg]
        pace.jobs = 0
        for i in range(0, len(jobs), MAX_BATCH):
            runs = _runs(jobs[i:i + MAX_BATCH])
            pace.jobs += len(runs)
            t0 = time.perf_counter()
            if unknown is not None:
                unknown = unknown.settle(pipe, db)
            results = commit(db, uow, runs) if unknown is None else unknown.refuse(runs)
            if isinstance(results, _Unknown):
                unknown = results.settle(pipe, db)
                continue
            pipe.send_bytes(_encode_results(results, time.perf_counter() - t0))
        pace.last = time.monotonic()
        if stop:
            if unknown is not None:
                unknown.give_up(pipe, db)
            return


class _Pace:
    """Under concurrent load the writer waits GATHER_S before taking a group."""
    last = 0.0  # monotonic: when the last group was answered
    jobs = 0  # runs in the last group

    def busy(self) -> bool:
        return self.jobs >= GATHER_MIN_JOBS and time.monotonic() - self.last < BUSY_GAP_S


def _receive(pipe, pace: _Pace) -> list | None:
    """The next group's messages: the first (waited for), then what already
    waits, up to MAX_MESSAGES or CLOSE; None when the parent is gone."""
    try:
        messages = [pickle.loads(pipe.recv_bytes())]
    except EOFError:
        return None
    if messages[-1] != CLOSE and pace.busy():
        time.sleep(GATHER_S)  # busy: let the group grow (one sleep, not a wakeup per message)
    while len(messages) < MAX_MESSAGES and messages[-1] != CLOSE and pipe.poll(0):
        try:
            messages.append(pickle.loads(pipe.recv_bytes()))
        except EOFError:
            break
    return messages


# What jobs asked to hear about the end of the open transaction: (on_commit, on_rollback).
_at_end: list[tuple[Callable[[], None], Callable[[], None]]] = []


def at_end(on_commit: Callable[[], None], on_rollback: Callable[[], None]) -> None:
    """For a job that keeps state in this process across transactions (the
    frame bus's flush order, turns/flush.py): ``on_commit()`` once its
    transaction committed, ``on_rollback()`` if its work was undone (its own
    savepoint, or the whole transaction)."""
    _at_end.append((on_commit, on_rollback))


def _ended(hooks: list, committed: bool) -> None:
    for on_commit, on_rollback in hooks:
        try:
            (on_commit if committed else on_rollback)()
        except Exception:
            log.exception("a job's end-of-transaction hook failed")


def _runs(jobs: list[tuple[int, bytes]]) -> list[tuple[list[int], Callable, list[tuple]]]:
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
           ) -> list[tuple[int, bool, Any]] | _Unknown:
    """Run every job (``_runs``) inside one transaction; return ``(job id, ok,
    result or exception)`` for each, after COMMIT, or ``_Unknown`` when the
    backend cannot tell whether COMMIT went through. A store fault travels as
    StoreUnavailable. A transient conflict with another writer of the database
    runs the group again (a few times, then its error is every job's)."""
    for attempt in range(TRANSIENT_RETRIES):
        out = _commit_once(db, uow, runs, last=attempt == TRANSIENT_RETRIES - 1)
        if out is not None:
            return out
        time.sleep(0.002 * (attempt + 1))
    raise AssertionError("unreachable")


def _commit_once(db: WriterBackend, uow, runs, last: bool) -> list[tuple[int, bool, Any]] | _Unknown | None:
    out: list[tuple[int, bool, Any]] = []
    fault: BaseException | None = None  # the first store fault a job met
    _at_end.clear()
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
        unknown = _Unknown(e, out, list(_at_end))
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


class _Unknown:
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

    def settle(self, pipe, db: WriterBackend, force: bool = False) -> _Unknown | None:
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
        error = StoreUnavailable(f"the store lost its connection during a commit ({self.error}); retry later")
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
        pipe.send_bytes(_encode_results(results, time.perf_counter() - self.t0))


def _encode_results(results: list[tuple[int, bool, Any]], seconds: float) -> bytes:
    """One group's answer: ``(seconds the group took to run and commit, results)``;
    the parent's metrics take the time (store/writer/client.py)."""
    try:
        return pickle.dumps((seconds, results), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # some result will not pickle: send that one as an error
        safe = []
        for jid, ok, value in results:
            try:
                pickle.dumps(value)
            except Exception as e:
                ok, value = False, RuntimeError(f"store job result could not be sent: {e!r} ({value!r:.200})")
            safe.append((jid, ok, value))
        return pickle.dumps((seconds, safe), protocol=pickle.HIGHEST_PROTOCOL)


__all__ = ["CLOSE", "StoreUnavailable", "WriterBackend", "at_end", "commit", "writer_main"]

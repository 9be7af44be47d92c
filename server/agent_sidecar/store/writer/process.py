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
``StoreUnavailable`` in this process, before they travel, so the parent never
needs to know a driver's exception types.

Why a process and not a thread: a database driver gives up the GIL around
every statement, so a writer *thread* and the gRPC event loop handed the GIL
back and forth many times per turn and the parent could never use more than
one core. Here SQL runs on its own core; the parent only pickles references.

This module is the process: its start, taking groups off the pipe (and
when to wait for a larger one), its stop. How one group is run, committed
and answered is group.py's.

Like the turn workers it is spawned, ignores SIGINT/SIGTERM (the parent
decides when it stops) and never imports grpc. On Linux it is killed with its
parent, so a writer can never outlive a ``kill -9``'d sidecar and commit behind
the back of the next one's startup recovery.
"""

from __future__ import annotations

import importlib
import os
import pickle
import sys
import time

from .answers import encode_results
from .group import RESOLVE_EVERY_S, Unknown, WriterBackend, commit, runs_of

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
    (``Unknown``) the backend is asked again before each group and every
    RESOLVE_EVERY_S while idle; the groups behind it are refused meanwhile."""
    pace = _Pace()
    uow = db.unit_of_work()
    unknown: Unknown | None = None
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
            runs = runs_of(jobs[i:i + MAX_BATCH])
            pace.jobs += len(runs)
            t0 = time.perf_counter()
            if unknown is not None:
                unknown = unknown.settle(pipe, db)
            results = commit(db, uow, runs) if unknown is None else unknown.refuse(runs)
            if isinstance(results, Unknown):
                unknown = results.settle(pipe, db)
                continue
            pipe.send_bytes(encode_results(results, time.perf_counter() - t0))
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


__all__ = ["CLOSE", "writer_main"]

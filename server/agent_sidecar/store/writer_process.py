"""The store's writer process: one connection, committing in groups.

Every write in the sidecar is a *job*: a module-level function
``fn(conn, *args) -> result``, sent here by reference (pickle names it by module
and qualified name; the arguments are plain data). This process takes every
job waiting on its pipe, runs them all inside one ``BEGIN IMMEDIATE … COMMIT``
(each job in its own savepoint, so one failing job rolls back alone), and
answers only after that commit is durable. Many sessions' writes therefore
share one transaction and one fsync — on this machine the difference between
~3,400 rows/s and ~60,000 rows/s.

Why a process and not a thread: apsw gives up the GIL around every statement,
so a writer *thread* and the gRPC event loop handed the GIL back and forth
~50 times per turn, and the parent could never use more than one core. Here
SQL runs on its own core, and the parent only pickles job references.

Because jobs run one after another on one connection, a job is also a critical
section: read-then-write logic inside a job (get-or-create, queue positions) is
race-free without any lock.

Like the turn workers it is spawned, ignores SIGINT/SIGTERM (the parent decides
when it stops) and never imports grpc. On Linux it is killed with its parent,
so a writer can never outlive a ``kill -9``'d sidecar and commit behind the back
of the next one's startup recovery.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import time
from typing import Any, Callable

import apsw

from .faults import is_store_fault

log = logging.getLogger("agent_sidecar.store")

# Upper bound on jobs per transaction: keeps one commit's latency bounded when a
# flood arrives, while still amortising the fsync over hundreds of writes.
MAX_BATCH = 2000
MAX_MESSAGES = 256
CLOSE = "close"  # the parent's last message, and our answer to it
# Under concurrent load (the last commit carried at least GATHER_MIN_JOBS jobs and
# ended less than BUSY_GAP_S ago) the writer sleeps GATHER_S before taking what
# waits on its pipe: fewer, larger commits. Each commit costs ~150 µs of CPU beyond
# its rows (hot pages rewritten, the WAL write, the fsync), and at a few turns per
# commit that was a fifth of the writer's time. An idle store, or one caller
# writing in sequence, commits at once: nothing would join its group.
GATHER_S = 0.001
BUSY_GAP_S = 0.002
GATHER_MIN_JOBS = 3


def writer_main(pipe, path: str, synchronous: str, parent_pid: int, log_format: str,
                log_level: str) -> None:
    """The spawn target. ``pipe`` is our end of a multiprocessing Pipe."""
    from ..children import become_child, tune_gc
    become_child("sidecar-writer", parent_pid)
    from .. import logs
    from .db import open_writer
    logs.setup(log_format, log_level)
    _import_job_modules()
    conn = open_writer(path, synchronous)
    pipe.send_bytes(pickle.dumps({"pid": os.getpid(), "grpc_loaded": "grpc" in sys.modules}))
    tune_gc()
    try:
        _serve(pipe, conn)
    finally:
        try:
            conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_TRUNCATE)
        except apsw.Error:
            log.warning("final WAL checkpoint incomplete (a reader was open)")
        conn.close()
    pipe.send_bytes(pickle.dumps(CLOSE))


def _import_job_modules() -> None:
    """Import where the sidecar's jobs live now, while the parent is still
    starting its workers, rather than when the first job (the startup restore)
    arrives and health waits for it. None of them imports grpc."""
    import importlib
    for name in ("recovery.housekeeping", "recovery.startup", "sessions.lifecycle",
                 "sessions.transcripts", "turns.jobs"):
        importlib.import_module(f"agent_sidecar.{name}")


def _serve(pipe, conn: apsw.Connection) -> None:
    """Each message is one parent loop iteration's jobs, or CLOSE. Everything
    already waiting on the pipe joins one group (``commit`` is fed at most
    MAX_BATCH jobs at a time)."""
    last_commit, last_jobs = 0.0, 0
    while True:
        try:
            messages = [pickle.loads(pipe.recv_bytes())]
        except EOFError:  # the parent is gone without closing us
            return
        if (messages[-1] != CLOSE and last_jobs >= GATHER_MIN_JOBS
                and time.monotonic() - last_commit < BUSY_GAP_S):
            time.sleep(GATHER_S)  # busy: let the group grow (one sleep, not a wakeup per message)
        while len(messages) < MAX_MESSAGES and messages[-1] != CLOSE and pipe.poll(0):
            try:
                messages.append(pickle.loads(pipe.recv_bytes()))
            except EOFError:
                break
        stop = messages[-1] == CLOSE
        jobs = [job for msg in messages if msg != CLOSE for job in msg]
        for i in range(0, len(jobs), MAX_BATCH):
            pipe.send_bytes(_encode_results(commit(conn, jobs[i:i + MAX_BATCH])))
        last_commit, last_jobs = time.monotonic(), len(jobs)
        if stop:
            return


# What jobs asked to hear about the end of the open transaction: (on_commit, on_rollback).
_at_end: list[tuple[Callable[[], None], Callable[[], None]]] = []


def at_end(on_commit: Callable[[], None], on_rollback: Callable[[], None]) -> None:
    """For a job that keeps state in this process across transactions (the
    frame bus's flush order, turns/jobs.py): ``on_commit()`` once its
    transaction committed, ``on_rollback()`` if its work was undone (its own
    savepoint, or the whole transaction)."""
    _at_end.append((on_commit, on_rollback))


def _ended(hooks: list, committed: bool) -> None:
    for on_commit, on_rollback in hooks:
        try:
            (on_commit if committed else on_rollback)()
        except Exception:
            log.exception("a job's end-of-transaction hook failed")


def commit(conn: apsw.Connection, jobs: list[tuple[int, bytes]]) -> list[tuple[int, bool, Any]]:
    """Run each job in its own savepoint inside one transaction; return
    ``(job id, ok, result or exception)`` for each, after COMMIT."""
    out: list[tuple[int, bool, Any]] = []
    fault: BaseException | None = None  # the first store fault a job met
    _at_end.clear()
    try:
        conn.execute("BEGIN IMMEDIATE")
        for jid, blob in jobs:
            conn.execute("SAVEPOINT job")
            mark = len(_at_end)
            try:
                fn, args = pickle.loads(blob)
                out.append((jid, True, fn(conn, *args)))
                conn.execute("RELEASE job")
            except Exception as e:  # the job's own failure: undo it alone
                out.append((jid, False, e))
                if fault is None and is_store_fault(e):
                    fault = e
                _ended(_at_end[mark:], False)
                del _at_end[mark:]
                # After a full disk SQLite may have rolled the whole transaction
                # back: then this raises, and nobody's write counts.
                conn.execute("ROLLBACK TO job")
                conn.execute("RELEASE job")
        conn.execute("COMMIT")
        _ended(_at_end, True)
    except Exception as e:  # the commit itself failed: nobody's write is durable
        _ended(_at_end, False)
        e = fault or e  # "no such savepoint" after a full disk is the full disk
        if is_store_fault(e):  # the parent logs the state change; no traceback per commit
            log.warning("store commit failed: %s", e)
        else:
            log.exception("store commit failed")
        try:
            conn.execute("ROLLBACK")
        except apsw.Error:
            pass
        out = [(jid, False, e) for jid, _ in jobs]
    _at_end.clear()
    return out


def _encode_results(results: list[tuple[int, bool, Any]]) -> bytes:
    try:
        return pickle.dumps(results, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # some result will not pickle: send that one as an error
        safe = []
        for jid, ok, value in results:
            try:
                pickle.dumps(value)
            except Exception as e:
                ok, value = False, RuntimeError(f"store job result could not be sent: {e!r} ({value!r:.200})")
            safe.append((jid, ok, value))
        return pickle.dumps(safe, protocol=pickle.HIGHEST_PROTOCOL)

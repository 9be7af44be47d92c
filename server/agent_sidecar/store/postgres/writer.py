"""The writer process's side of the PostgreSQL backend (``PostgresWriter``):
one connection, each group commit one transaction in pipeline mode.

A COMMIT whose connection is lost before its answer arrives may have
committed or not: the server may have made it durable and only the answer
was lost (a crash right after the commit record was flushed, a session
ended, a network cut). Taking it for failed would have the frame bus send
the flush again and store its frames and transcript rows twice; taking it
for done would lose them. So every transaction asks for its id at BEGIN
(``pg_current_xact_id``, answered with the first job's sync, no round trip
of its own), and when COMMIT's connection is lost the writer raises
``CommitOutcomeUnknown``, whose ``resolve`` connects again and asks the
server (``pg_xact_status``): committed, aborted, or not known yet (the
server cannot be reached; the process asks again later, see
writer/group.py). A transaction still open on the server, its client gone
unnoticed, is ended first (``pg_terminate_backend``: a backend inside its
commit finishes it before it acts on the signal), so the answer is final.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import select
import time
from typing import TYPE_CHECKING

import psycopg
from psycopg import errors as pgerr

from ...logs import FaultEpisode
from ..faults import CommitOutcomeUnknown, StoreUnavailable
from .connection import (
    CHANNEL,
    WRITER_APPLICATION,
    aborted,
    connect,
    forget_prepared,
    is_fault,
    settle,
    unavailable,
    unbounded,
)
from .rows import sender

if TYPE_CHECKING:
    from .uow import PostgresUnitOfWork

log = logging.getLogger("agent_sidecar.store")

# Transient conflicts between sidecars: the writer runs its group again. A
# statement cancelled on a live connection is one too: the writer's session
# has no statement_timeout (``unbounded``), so only an operator's
# pg_cancel_backend cancels it (of a statement waiting for a lock, as a rule):
# taken for a store fault, it put the store in its failing state, and the
# sidecar ended every turn it was running, for one cancelled statement.
TRANSIENT = (pgerr.DeadlockDetected, pgerr.SerializationFailure, pgerr.LockNotAvailable, pgerr.QueryCanceled)
PREPARED_MAX = 500
# How often, and how far apart, one ``resolve`` asks about a transaction the
# server still shows in progress before it gives up for now.
STATUS_POLLS, STATUS_POLL_S = 10, 0.05
_XID_MASK = (1 << 32) - 1  # pg_stat_activity.backend_xid is the 32-bit xid of an xid8


class PostgresWriter:
    """The writer process's backend: one connection; each group commit one
    transaction with a savepoint per job (process.WriterBackend). A commit that
    wrote frames notifies ``CHANNEL`` with its highest cursor, so every sidecar
    of the cluster wakes its watchers (LISTEN/NOTIFY is delivered at COMMIT).

    A group runs in pipeline mode: a statement whose result nobody reads (most
    writes, BEGIN, the savepoints, COMMIT) is sent without waiting for its
    answer; a read waits for its own (and everything before it). Each job ends
    with a sync (``release``), so its errors are raised while it is the job
    that runs: one failing job still rolls back alone, to its savepoint. The
    transaction commits on the sync that ends the pipeline, before ``commit``
    returns, so durability on return is unchanged."""

    def __init__(self, dsn: str, node_id: str):
        self.dsn, self.node_id = dsn, node_id
        self._loss = FaultEpisode(log, "store connection lost; connecting again")
        self._open()
        self._uow: PostgresUnitOfWork | None = None
        self._frames_mark = (0, False)  # the frames' state at the open job's savepoint
        self._pipeline: contextlib.ExitStack | None = None
        self._xact: psycopg.Cursor | None = None  # the open transaction's id, asked for at BEGIN

    def _open(self) -> None:
        self.conn = connect(self.dsn, autocommit=True, application_name=WRITER_APPLICATION)
        self.conn.execute("SET synchronous_commit = on")
        # A writer stopped inside a transaction (SIGSTOP, a stall) must not hold
        # lease rows locked for ever: the server ends its session instead, and
        # a takeover waits at most this long (cluster/leases.py).
        self.conn.execute("SET idle_in_transaction_session_timeout = '5s'")
        # The writer waits for other sidecars' locks by design (the frames
        # lock, a lease row), each held no longer than the holder's idle
        # timeout above allows. A wait cut short by the role's timeouts failed
        # the whole group as a store fault, and the sidecar ended every turn it ran.
        unbounded(self.conn)
        # Every statement of the write path prepared once (after psycopg's
        # prepare_threshold uses), none evicted: they are fewer than this.
        self.conn.prepared_max = PREPARED_MAX
        self.send = sender(self.conn)

    def _reconnect(self) -> None:
        """The connection was lost (the server restarted, failed over, or ended
        this session): a new one. While the server cannot be reached this
        raises, and the group fails as a store fault (StoreUnavailable), which
        the store's retry rounds try again: the writer comes back when the
        database does. A transaction the lost connection had open was rolled
        back with it, unless its COMMIT had been sent (see the module
        docstring)."""
        self._loss.failed()  # while the server stays out of reach, each retry round lands here again
        try:
            self.conn.close()
        except psycopg.Error:
            pass
        self._open()  # raises while the server cannot be reached; the next group tries again
        self._loss.ended()
        if self._uow is not None:
            self._uow.bind(self.conn)

    def _connected(self) -> None:
        """Connect again if the connection was lost (or closed after a lost
        COMMIT), or the server ended it while it was idle (``_ended_idle``)."""
        if self.conn.broken or self.conn.closed or self._ended_idle():
            self._reconnect()

    def _ended_idle(self) -> bool:
        """Whether the server spoke on the idle connection since its last use:
        it only does so to end the session (pg_terminate_backend, a restart,
        an idle timeout: an error, then the socket closes); nothing else is
        expected while no statement is in flight. Found before a group
        begins, the writer connects again and nothing fails; otherwise the
        group's first statement failed as a store fault and the sidecar ended
        every turn it was running, while the database answered all along."""
        try:
            poll = select.poll()  # not select(): no limit on the descriptor's number
            poll.register(self.conn.pgconn.socket, select.POLLIN)
            return bool(poll.poll(0))
        except (OSError, psycopg.Error):
            return True

    def begin(self) -> None:
        self._connected()
        stack = contextlib.ExitStack()
        pipeline = stack.enter_context(self.conn.pipeline())
        self._pipeline = stack
        # READ COMMITTED whatever the role or the database defaults to: the
        # writer's isolation from the other sidecars is its row locks, whose
        # waits read the row as its holder committed it (lanes.py). Under
        # REPEATABLE READ or SERIALIZABLE such a wait failed "could not
        # serialize access", and three in a row were a store fault.
        self.send("BEGIN ISOLATION LEVEL READ COMMITTED")
        self._xact = self.conn.execute("SELECT pg_current_xact_id()::text")
        if self._uow is not None:
            self._uow.begin(pipeline)

    def commit(self) -> None:
        top = self._uow.frames.written if self._uow is not None else 0
        if top:
            self.send("SELECT pg_notify(%s, %s)", (CHANNEL, str(top)))
        assert self._xact is not None  # asked for by begin()
        row = self._xact.fetchone()  # arrived with the first job's sync
        xact, pid = str(row[0]) if row else "", self.conn.info.backend_pid
        self.send("COMMIT")
        try:
            self._end_pipeline(check=True)  # the sync: COMMIT's answer (or its error) arrives here
        except psycopg.Error as e:
            # The server's own refusal of the COMMIT on a live connection (a
            # deferred constraint; a serialization failure, which the writer
            # runs again) rolled it back; anything else (the connection lost or
            # ended, the pipeline left in disorder by it, whether or not
            # psycopg has marked the connection broken yet) may have followed
            # a commit.
            refused = not self.conn.broken and (isinstance(e, TRANSIENT) or not is_fault(e))
            if not xact or refused:
                raise
            log.warning("store connection lost during COMMIT; asking the server whether it committed",
                        extra={"transaction": xact, "error": str(e)})
            with contextlib.suppress(psycopg.Error):
                self.conn.close()  # in whatever state it was left: the next use connects again
            raise CommitOutcomeUnknown(e, functools.partial(self._committed, xact, pid)) from e

    def _committed(self, xact: str, pid: int) -> bool | None:
        """Whether transaction ``xact`` (run by backend ``pid``) committed, as
        the server says on a new connection; None while it cannot be reached."""
        try:
            self._connected()
            for _ in range(STATUS_POLLS):
                status = self.conn.execute("SELECT pg_xact_status(%s::xid8)", (xact,)).fetchone()
                if status is None or status[0] != "in progress":
                    break
                self._end_session(pid, xact)
                time.sleep(STATUS_POLL_S)
            else:
                return None
        except psycopg.Error as e:
            if is_fault(e):
                return None
            log.error("cannot learn whether a commit went through; taking it for failed",
                      extra={"transaction": xact, "error": str(e)})
            return False
        fields = {"transaction": xact, "status": status[0] if status else None}
        if status is not None and status[0] == "committed":
            log.warning("the commit whose answer was lost went through", extra=fields)
            return True
        log.warning("the commit whose answer was lost did not go through", extra=fields)
        return False

    def _end_session(self, pid: int, xact: str) -> None:
        """End the session still holding ``xact`` open (its client gone unnoticed)."""
        try:
            self.conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                              " WHERE pid = %s AND backend_xid::text = %s",
                              (pid, str(int(xact) & _XID_MASK)))
        except psycopg.Error as e:  # not allowed to: idle_in_transaction_session_timeout ends it
            if is_fault(e):
                raise

    def rollback(self) -> None:
        self._end_pipeline(check=False)
        failed = aborted(self.conn)
        self.conn.execute("ROLLBACK")
        if failed:
            forget_prepared(self.conn)

    def _end_pipeline(self, check: bool) -> None:
        stack, self._pipeline = self._pipeline, None
        self._xact = None
        if self._uow is not None:
            self._uow.end()
        if stack is None:
            return
        if check:
            stack.close()
            return
        try:
            stack.close()
        except psycopg.Error:
            pass  # the rollback that follows undoes whatever failed

    def savepoint(self) -> None:
        if self._uow is not None:
            self._frames_mark = self._uow.frames.mark()
        self.send("SAVEPOINT job")

    def release(self) -> None:
        self.send("RELEASE SAVEPOINT job")
        self._sync()

    def rollback_to(self) -> None:
        if self._uow is not None and self._uow.pipeline is not None:
            settle(self._uow.pipeline)
        failed = aborted(self.conn)
        self.send("ROLLBACK TO SAVEPOINT job")
        if self._uow is not None:
            self._uow.frames.undone(self._frames_mark)
        if failed:
            forget_prepared(self.conn)

    def _sync(self) -> None:
        if self._uow is not None and self._uow.pipeline is not None:
            self._uow.pipeline.sync()

    def unit_of_work(self):
        from .uow import PostgresUnitOfWork
        self._uow = PostgresUnitOfWork(self.conn, self.node_id)
        return self._uow

    def is_fault(self, e: BaseException) -> bool:
        return is_fault(e)

    def unavailable(self, e: BaseException) -> StoreUnavailable:
        return unavailable(e)

    def transient(self, e: BaseException) -> bool:
        return isinstance(e, TRANSIENT)

    def close(self) -> None:
        self.conn.close()


def open_backend(dsn: str, node_id: str) -> PostgresWriter:
    """The writer process's entry (process.writer_main's ``backend``)."""
    return PostgresWriter(dsn, node_id)

"""Opening PostgreSQL connections (psycopg 3), and the writer process's side
of the backend (``PostgresWriter``).

Why psycopg 3: one driver for both sides of the store — the writer process
runs its group commits on a plain synchronous connection (the jobs are
synchronous functions, as on SQLite), the parent reads and listens for frame
notifications on asyncio connections from ``psycopg_pool`` — with its C
speedups (``psycopg[binary]``). asyncpg is asyncio-only, and the writer
process would need an event loop of its own to use it.

The writer runs each group in pipeline mode (``PostgresWriter``): only a
statement whose answer a job reads waits for the server.

Every connection is configured by codec.configure: JSON through orjson both
ways, and text escaped so that a NUL character survives. Durability: a COMMIT returns once
PostgreSQL has flushed it (``synchronous_commit`` on, its default; the writer
sets it explicitly for its session).
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import TYPE_CHECKING

import orjson
import psycopg
from psycopg import errors as pgerr
from psycopg.conninfo import conninfo_to_dict

from ...logs import FaultEpisode
from ..faults import is_store_fault
from ..records import ClusterOp
from .codec import configure
from .rows import sender

log = logging.getLogger("agent_sidecar.store")

if TYPE_CHECKING:
    from .uow import PostgresUnitOfWork

# The driver's exceptions that mean "the store cannot write now" (faults.py):
# the server gone or refusing, a full disk, resources exhausted.
DRIVER_FAULTS = (psycopg.OperationalError, pgerr.DiskFull, pgerr.InsufficientResources,
                 pgerr.OutOfMemory, pgerr.AdminShutdown, pgerr.CannotConnectNow,
                 pgerr.ReadOnlySqlTransaction)
# Transient conflicts between sidecars: the writer runs its group again.
TRANSIENT = (pgerr.DeadlockDetected, pgerr.SerializationFailure, pgerr.LockNotAvailable)
FRAMES_LOCK = 0x5AD3_F4A3  # pg_advisory_xact_lock key: frame inserts in commit order
CHANNEL = "agent_sidecar_frames"  # NOTIFY channel: a commit's highest frame cursor
CONTROL_CHANNEL = "agent_sidecar_control"  # NOTIFY channel: ClusterOp JSON (UnitOfWork.announce)
WRITER_APPLICATION = "agent-sidecar-writer"  # the writer's application_name (pg_stat_activity)
PREPARED_MAX = 500


# How long a connection attempt may take when neither the DSN nor
# PGCONNECT_TIMEOUT says: a server that accepts the connection and never
# answers (a hung host, a half-open route) otherwise holds it for psycopg's
# default of over two minutes, while a starting sidecar prints nothing and a
# worker's loop waits on its transcript reader's connect.
CONNECT_TIMEOUT_S = 10


def connect_kwargs(dsn: str, **kw) -> dict:
    """``kw`` with ``connect_timeout`` added unless the DSN (or
    PGCONNECT_TIMEOUT) sets its own."""
    if "connect_timeout" not in kw and not os.environ.get("PGCONNECT_TIMEOUT") \
            and "connect_timeout" not in conninfo_to_dict(dsn):
        kw["connect_timeout"] = CONNECT_TIMEOUT_S
    return kw


def connect(dsn: str, **kw) -> psycopg.Connection:
    conn = psycopg.connect(dsn, **connect_kwargs(dsn, **kw))
    configure(conn)
    return conn


async def connect_async(dsn: str, **kw) -> psycopg.AsyncConnection:
    conn = await psycopg.AsyncConnection.connect(dsn, **connect_kwargs(dsn, **kw))
    configure(conn)
    return conn


def is_fault(e: BaseException) -> bool:
    return is_store_fault(e, DRIVER_FAULTS)


def announce_payload(op: str, keys: list[str], origin: str) -> str:
    """A ClusterOp as the control channel carries it (JSON)."""
    return orjson.dumps({"op": op, "keys": keys, "origin": origin}).decode()


def read_announce(payload: str) -> ClusterOp | None:
    """A control channel payload back as a ClusterOp; None (logged) for anything else."""
    try:
        d = orjson.loads(payload)
        return ClusterOp(str(d["op"]), tuple(str(k) for k in d["keys"]), str(d["origin"]))
    except (ValueError, KeyError, TypeError):
        log.warning("unreadable cluster notification", extra={"payload": payload[:200]})
        return None


def settle(pipeline: psycopg.Pipeline) -> None:
    """Wait for every statement sent so far, ignoring their errors: what the
    caller is undoing already failed (a statement sent after an error is
    discarded until this sync, so a ROLLBACK TO must come after it)."""
    try:
        pipeline.sync()
    except psycopg.Error:
        pass


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
        self._pipeline: contextlib.ExitStack | None = None

    def _open(self) -> None:
        self.conn = connect(self.dsn, autocommit=True, application_name=WRITER_APPLICATION)
        self.conn.execute("SET synchronous_commit = on")
        # A writer stopped inside a transaction (SIGSTOP, a stall) must not hold
        # lease rows locked for ever: the server ends its session instead, and
        # a takeover waits at most this long (cluster/leases.py).
        self.conn.execute("SET idle_in_transaction_session_timeout = '5s'")
        # Every statement of the write path prepared once (after psycopg's
        # prepare_threshold uses), none evicted: they are fewer than this.
        self.conn.prepared_max = PREPARED_MAX
        self.send = sender(self.conn)

    def _reconnect(self) -> None:
        """The connection was lost (the server restarted, failed over, or ended
        this session): a new one, for the group about to begin. While the
        server cannot be reached this raises, and the group fails as a store
        fault (StoreUnavailable), which the store's retry rounds try again:
        the writer comes back when the database does. Nothing is lost: a
        transaction the lost connection had open was rolled back with it and
        its jobs were answered as failed."""
        self._loss.failed()  # while the server stays out of reach, each retry round lands here again
        try:
            self.conn.close()
        except psycopg.Error:
            pass
        self._open()  # raises while the server cannot be reached; the next group tries again
        self._loss.ended()
        if self._uow is not None:
            self._uow.bind(self.conn)

    def begin(self) -> None:
        if self.conn.broken or self.conn.closed:
            self._reconnect()
        stack = contextlib.ExitStack()
        pipeline = stack.enter_context(self.conn.pipeline())
        self._pipeline = stack
        self.send("BEGIN")
        if self._uow is not None:
            self._uow.begin(pipeline)

    def commit(self) -> None:
        top = self._uow.frames.written if self._uow is not None else 0
        if top:
            self.send("SELECT pg_notify(%s, %s)", (CHANNEL, str(top)))
        self.send("COMMIT")
        self._end_pipeline(check=True)  # the sync: COMMIT's answer (or its error) arrives here

    def rollback(self) -> None:
        self._end_pipeline(check=False)
        self.conn.execute("ROLLBACK")

    def _end_pipeline(self, check: bool) -> None:
        stack, self._pipeline = self._pipeline, None
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
        self.send("SAVEPOINT job")

    def release(self) -> None:
        self.send("RELEASE SAVEPOINT job")
        self._sync()

    def rollback_to(self) -> None:
        if self._uow is not None and self._uow.pipeline is not None:
            settle(self._uow.pipeline)
        self.send("ROLLBACK TO SAVEPOINT job")

    def _sync(self) -> None:
        if self._uow is not None and self._uow.pipeline is not None:
            self._uow.pipeline.sync()

    def unit_of_work(self):
        from .uow import PostgresUnitOfWork
        self._uow = PostgresUnitOfWork(self.conn, self.node_id)
        return self._uow

    def is_fault(self, e: BaseException) -> bool:
        return is_fault(e)

    def transient(self, e: BaseException) -> bool:
        return isinstance(e, TRANSIENT)

    def close(self) -> None:
        self.conn.close()


def open_backend(dsn: str, node_id: str) -> PostgresWriter:
    """The writer process's entry (process.writer_main's ``backend``)."""
    return PostgresWriter(dsn, node_id)

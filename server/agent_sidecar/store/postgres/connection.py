"""Opening PostgreSQL connections (psycopg 3): the driver, its settings,
which of its errors are store faults, and the names every sidecar of a
cluster shares (notification channels, lock keys).

Why psycopg 3: one driver for both sides of the store — the writer process
runs its group commits on a plain synchronous connection (the jobs are
synchronous functions, as on SQLite), the parent reads and listens for frame
notifications on asyncio connections from ``psycopg_pool`` — with its C
speedups (``psycopg[binary]``). asyncpg is asyncio-only, and the writer
process would need an event loop of its own to use it.

The writer process's side of the backend is writer.py.

Every connection is configured by codec.configure: JSON through orjson both
ways, and text escaped so that a NUL character survives. Durability: a COMMIT returns once
PostgreSQL has flushed it (``synchronous_commit`` on, its default; the writer
sets it explicitly for its session).
"""

from __future__ import annotations

import logging
import os
import re

import orjson
import psycopg
from psycopg import errors as pgerr
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus

from ..faults import StoreUnavailable, is_store_fault
from ..records import ClusterOp
from .codec import configure

log = logging.getLogger("agent_sidecar.store")

# The schema changed by hand (a table or a column dropped or renamed, the
# role's rights revoked): like a damaged SQLite file, a store fault, so a call
# that meets it is refused STORE_UNAVAILABLE naming what is missing, and health
# says NOT_SERVING until the operator puts it back (the retry rounds' probe
# touches every table), instead of INTERNAL while health says SERVING.
DAMAGE = (pgerr.UndefinedTable, pgerr.UndefinedColumn, pgerr.UndefinedFunction, pgerr.InvalidSchemaName,
          pgerr.InsufficientPrivilege)
# The driver's exceptions that mean "the store cannot write now" (faults.py):
# the server gone or refusing, a full disk, resources exhausted, the schema damaged.
DRIVER_FAULTS = (psycopg.OperationalError, pgerr.DiskFull, pgerr.InsufficientResources,
                 pgerr.OutOfMemory, pgerr.AdminShutdown, pgerr.CannotConnectNow,
                 pgerr.ReadOnlySqlTransaction, *DAMAGE)
FRAMES_LOCK = 0x5AD3_F4A3  # pg_advisory_xact_lock key: frame inserts in commit order
CHANNEL = "agent_sidecar_frames"  # NOTIFY channel: a commit's highest frame cursor
CONTROL_CHANNEL = "agent_sidecar_control"  # NOTIFY channel: ClusterOp JSON (UnitOfWork.announce)
WRITER_APPLICATION = "agent-sidecar-writer"  # the writer's application_name (pg_stat_activity)
# pg_current_xact_id / pg_xact_status, which the writer needs to learn the
# outcome of a commit whose answer was lost (writer.py), came with 13.
MIN_SERVER_VERSION = 130000


# How long a connection attempt may take when neither the DSN nor
# PGCONNECT_TIMEOUT says: a server that accepts the connection and never
# answers (a hung host, a half-open route) otherwise holds it for psycopg's
# default of over two minutes, while a starting sidecar prints nothing and a
# worker's loop waits on its transcript reader's connect.
CONNECT_TIMEOUT_S = 10


class InvalidDsn(psycopg.ProgrammingError):
    """A DSN libpq cannot read; its message never quotes the DSN (parse_dsn)."""


_QUOTED = re.compile(r'"([^"]*)"')


def parse_dsn(dsn: str) -> dict:
    """The DSN's parameters, or InvalidDsn saying why libpq cannot read it.

    libpq's complaint quotes the piece of the string it could not read, and
    that piece may be the password or a part of it (``invalid percent-encoded
    token: "50%off"`` for a URI whose password has a bare ``%``, ``missing "="
    after "word"`` for one with a space): every quoted piece but ``"="`` is
    left out, since the message goes to the log, ``doctor``'s output and
    the exit message, which must never hold a secret."""
    try:
        return conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as e:
        reason = _QUOTED.sub(lambda m: m[0] if m[1] == "=" else '"…"', str(e).strip())
        raise InvalidDsn(f"store.dsn is not a connection string libpq can read: {reason}") from None


def connect_kwargs(dsn: str, **kw) -> dict:
    """``kw`` with ``connect_timeout`` added unless the DSN (or
    PGCONNECT_TIMEOUT) sets its own; InvalidDsn (no secret in it) for a DSN
    libpq cannot read, before the driver sees it and says why in its words."""
    params = parse_dsn(dsn)
    if "connect_timeout" not in kw and not os.environ.get("PGCONNECT_TIMEOUT") \
            and "connect_timeout" not in params:
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


def version_refused(server_version: int) -> str | None:
    """Why a server of ``server_version`` (libpq's number, 150004 for 15.4)
    cannot hold the store, or None when it can."""
    if server_version >= MIN_SERVER_VERSION:
        return None
    major = f"{server_version // 10000}" if server_version >= 100000 else \
        f"{server_version // 10000}.{server_version // 100 % 100}"
    return f"PostgreSQL {MIN_SERVER_VERSION // 10000} or later is needed; this server is {major} ({server_version})"


_WRITABLE = "SELECT current_setting('transaction_read_only') = 'on', pg_is_in_recovery()"
_TO_PRIMARY = ("point store.dsn at the primary (with several hosts, add target_session_attrs=read-write:"
               " libpq then picks the one that takes writes)")


def server_refused(conn: psycopg.Connection) -> str | None:
    """Why the server ``conn`` reached cannot hold the store, or None when it
    can: too old (``version_refused``), or taking no writes. A standby, or a
    primary that came back as one after a failover, or a role or database
    with ``default_transaction_read_only``: the migrations' first statement
    failed there with "cannot execute CREATE TABLE in a read-only
    transaction", which names neither the cause nor the DSN's remedy."""
    refused = version_refused(conn.info.server_version)
    if refused is not None:
        return refused
    read_only, standby = conn.execute(_WRITABLE).fetchone() or (False, False)
    if standby:
        return f"this server is a standby (in recovery) and takes no writes: {_TO_PRIMARY}"
    if read_only:
        return ("this server takes no writes (default_transaction_read_only is on for this role or database):"
                f" {_TO_PRIMARY}")
    return None


# No lock or statement timeout, and no idle_session_timeout (PostgreSQL 14 and
# later: on 13 the last statement finds no row and sets nothing).
_UNBOUNDED = ("SET lock_timeout = 0", "SET statement_timeout = 0",
              "SELECT set_config(name, '0', false) FROM pg_settings WHERE name = 'idle_session_timeout'")


def unbounded(conn: psycopg.Connection) -> None:
    """No ``lock_timeout``, ``statement_timeout`` or ``idle_session_timeout``
    on ``conn``'s session, whatever the role or the database sets (``ALTER
    ROLE … SET``, common for application roles). The sessions that call this
    wait by design (the writer for other sidecars' locks; the migrations for
    the sidecar migrating before them, and a migration's DDL for its table
    locks; ``doctor`` for its counts and a full-text index rebuild as long as
    the table is big), and a wait cut short would fail the write group, the
    start, or the repair. And they idle by design while nothing happens (the
    writer, the cluster tail's ``unbounded_async``): ended by the idle
    timeout, the tail connected again and logged two lines each time (every
    second with a one-second timeout), and a lone sidecar's writer said
    "store connection lost" after every quiet spell."""
    for statement in _UNBOUNDED:
        conn.execute(statement)


async def unbounded_async(conn: psycopg.AsyncConnection) -> None:
    """``unbounded`` for an asyncio connection (the cluster tail's)."""
    for statement in _UNBOUNDED:
        await conn.execute(statement)


def is_fault(e: BaseException) -> bool:
    return is_store_fault(e, DRIVER_FAULTS)


# What a caller is told of a fault, by the server's SQLSTATE: the product's words, never the
# driver's (which can name the server's host, socket, role or database); the log keeps those.
_SAID = {
    "53100": "PostgreSQL's disk is full",
    "53200": "PostgreSQL is out of memory",
    "53000": "PostgreSQL is out of resources",
    "53300": "PostgreSQL takes no more connections (too many connections)",
    "57014": "a PostgreSQL statement was cancelled (statement_timeout, or an operator's cancel)",
    "55P03": "a PostgreSQL lock was not granted in time (lock_timeout)",
    "57P01": "PostgreSQL ended the connection (the server shuts down, or an operator ended the session)",
    "57P02": "PostgreSQL ended the connection (the server crashed)",
    "57P03": "PostgreSQL takes no connections now (it is starting or shutting down)",
    "25006": "PostgreSQL takes no writes (a read-only server: a standby?)",
    "42501": "PostgreSQL refuses the sidecar's role a right on the store's schema",
}
_MISSING = {"42P01": "table", "42703": "column", "42883": "function", "3F000": "schema"}  # DAMAGE's kinds
UNREACHABLE = "PostgreSQL cannot be reached (the connection was lost or refused)"
_REFUSED = (("too many connections", _SAID["53300"]),
            ("the database system is", _SAID["57P03"]),
            ("authentication failed", "PostgreSQL refuses the sidecar's login"))


def said(e: BaseException) -> str:
    """What went wrong, in the product's words (``unavailable``)."""
    state = getattr(e, "sqlstate", None)
    if state in _SAID:
        return _SAID[state]
    if state in _MISSING:  # the schema changed by hand: name what is missing, no more of the server's text
        names = _QUOTED.findall(getattr(getattr(e, "diag", None), "message_primary", None) or "")
        missing = f'{_MISSING[state]} "{names[0]}"' if names else f"a {_MISSING[state]}"
        return f"the store's PostgreSQL schema is damaged: {missing} is missing"
    if isinstance(e, TimeoutError):
        return "PostgreSQL did not answer in time"
    text = str(e)  # a connection refused has no SQLSTATE: libpq's words (English servers') say why
    for words, what in _REFUSED:
        if words in text:
            return what
    return UNREACHABLE


def unavailable(e: BaseException, what: str | None = None) -> StoreUnavailable:
    """A store fault of this backend as callers get it: what went wrong in
    the product's words (``what``, else ``said``), and the driver's text as
    the error's ``cause``, for the log lines."""
    if isinstance(e, StoreUnavailable):
        return e
    return StoreUnavailable(f"the store is unavailable: {what or said(e)}; retry later",
                            cause=f"{type(e).__name__}: {e}")


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


def aborted(conn: psycopg.Connection) -> bool:
    """Whether the server aborted ``conn``'s transaction (a statement failed;
    ``settle`` first in pipeline mode): it then skipped every later statement
    up to the sync, and ``forget_prepared`` is due once it is rolled back."""
    return conn.info.transaction_status == TransactionStatus.INERROR


def forget_prepared(conn: psycopg.Connection) -> None:
    """After a rollback (to a savepoint, or of the whole transaction) of a
    transaction the server had ``aborted`` in pipeline mode: drop what
    psycopg believes is prepared on ``conn``, and the server's prepared
    statements with it (``DEALLOCATE ALL``, sent before the next statement).
    A statement that reached the prepare threshold after the failing one in
    the same pipeline segment was skipped by the server, Parse and all, yet
    psycopg counts it as prepared: its next use would fail ``prepared
    statement "_pg3_N" does not exist``, not a store fault, and every job of
    that group with it (a read-only standby, a lock or statement timeout, a
    deadlock's retry). Statements are prepared again after their next few
    uses. ``_prepared`` is psycopg's own (3.2, 3.3): without it there is
    nothing to forget, and the old failure mode returns."""
    prepared = getattr(conn, "_prepared", None)
    if prepared is not None:
        prepared.clear()

"""The storage interface: what the domain (sessions/, turns/, recovery/, api/)
may ask of a store, and what a backend must guarantee.

Two sides:

* **Writes** go through one call, ``Store.write(job, *args)``. A *job* is a
  module-level function ``job(uow, *args) -> result`` holding a domain rule
  (get-or-create, accept a prompt, finish a turn, the restore plan...). The
  backend runs it inside a unit of work, against the typed repository
  operations of ``UnitOfWork`` (unit_of_work.py); it supplies those operations
  and the unit of work, never a rule. ``write`` returns an ``asyncio.Future``:
  its result is the job's return value, its exception whatever the job raised
  (a ``SidecarError`` for a refusal, ``StoreUnavailable`` when the store could
  not commit).
* **Reads** are the typed async methods of ``Store``. Each is one snapshot.

What every backend guarantees:

1. *Atomicity of a job.* A job's writes commit together or not at all; a job
   that raises leaves no trace (its own savepoint, or a replay), and never
   undoes another job of the same commit group.
2. *Order.* Jobs commit in the order ``write`` was called, and their futures
   resolve in that order, synchronously as the commit's answer arrives — so a
   callback attached to an earlier future runs before one attached to a later
   one. Activity-frame cursors grow with commit order.
3. *Durability on return.* A future resolves only after the commit is
   durable (SQLite: WAL fsynced per ``synchronous``; PostgreSQL: COMMIT with
   ``synchronous_commit`` on). Nothing acknowledged is ever lost by a crash of
   the sidecar.
4. *Isolation of a job.* A job's reads see every write committed before it and
   its own; read-then-write inside one job is safe against every other writer
   (SQLite: one writer process; PostgreSQL: row locks — ``routing.get`` locks
   the row it reads for the rest of the transaction).
5. *Group commit.* Jobs written in one event-loop iteration share one
   transaction where the backend can; that is where the throughput comes from,
   so callers need not batch by hand. A job marked ``@batched(many)`` lets a
   run of consecutive jobs of its kind execute as one ``many`` call.

Reads never block the event loop for long: a backend answers indexed lookups
inline (SQLite) or through its own async driver, and long scans off the loop.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .faults import StoreUnavailable  # noqa: F401  (the interface's error)
from .records import (
    ClusterOp,
    FrameRecord,
    LeaseHolder,
    LedgerEntry,
    Message,
    SearchHit,
    SessionEntry,
    StoreStats,
)
from .unit_of_work import Job

if TYPE_CHECKING:  # only in annotations: the store writer process runs no event loop
    import asyncio

    from .writer.client import CommitStats

R = TypeVar("R")


class StoreOpenError(RuntimeError):
    """The store cannot be opened at all (a file that is no store, a schema
    from a newer version): the sidecar does not start."""


def refuse_newer_schema(applied: set[int], known: list[int]) -> None:
    """A store that records migrations this release does not have was migrated
    by a newer release (an upgrade rolled back): its tables may have changed
    under this code, so it is refused before anything reads or writes it,
    rather than served half-understood."""
    newer = sorted(applied - set(known))
    if newer:
        raise StoreOpenError(
            f"the store's schema has migration(s) {', '.join(map(str, newer))} from a newer agent-sidecar"
            f" (this one knows up to {max(known)}): run that release or a later one, or restore a backup"
            " taken before the upgrade")


class Store(Protocol):
    """``await start()`` before the first call, ``await close()`` after the last."""

    async def start(self) -> None: ...

    async def close(self, timeout: float = 30.0) -> None:
        """Commit what is queued, close, stop the writer: it has ``timeout``
        seconds to confirm, then it is killed (what it had not answered is
        not known to be saved)."""

    def write(self, job: Job[R], *args: Any, retry: bool = False) -> asyncio.Future[R]:
        """``job(uow, *args)``; ``retry``: taken even while the store is failing
        (only the frame bus's re-sends, faults.py). Cancelling the future does
        not take the write back (it may already be committing): a caller whose
        callback must see the outcome awaits it through ``asyncio.shield``."""

    def flush(self) -> None:
        """Send what was written in this loop iteration now rather than at its end."""

    async def barrier(self) -> None:
        """Returns once every write made before it has committed."""

    @property
    def writable(self) -> bool:
        """False while commits fail (health reports NOT_SERVING)."""

    @property
    def fault(self) -> StoreUnavailable | None: ...

    def check_writable(self) -> None:
        """Raise StoreUnavailable while the store cannot write."""

    def watch_faults(self, listener: Callable[[StoreUnavailable | None], None]) -> None:
        """``listener(fault)`` when the store starts failing, ``listener(None)``
        when it can write again."""

    def add_retrier(self, retrier: Callable[[], None]) -> None:
        """``retrier()`` at each retry round while the store is failing."""

    # sessions and routing
    async def entry(self, key: str) -> SessionEntry | None: ...

    async def session_key_of(self, session_id: str) -> str | None: ...

    async def list_entries(self, *, platform: str = "", active_since: float | None = None,
                           after: tuple[float, str] | None = None, limit: int = 100
                           ) -> list[SessionEntry]:
        """By updated_at descending then key; ``after`` is the last (updated_at,
        key) of the previous page (keyset paging)."""

    # transcripts
    async def transcript(self, session_id: str, *, include_rewound: bool = False,
                         after_seq: int = 0, limit: int | None = None) -> list[Message]: ...

    async def search(self, query: str, *, session_key: str = "", limit: int = 20) -> list[SearchHit]:
        """Full-text search over live messages; every message written before
        the call is searchable. Any query text is either searched or refused
        with INVALID_ARGUMENT."""

    # the ledger and frames
    async def ledger(self, request_id: str) -> LedgerEntry | None: ...

    async def recent_requests(self, since: float, limit: int) -> list[tuple[str, float, str]]: ...

    async def lease_holder(self, key: str) -> LeaseHolder | None:
        """The live lease on a lane, if any node holds one (a cluster; None on
        a backend without leases)."""

    async def request_frames(self, request_id: str, after_seq: int = 0, *, after_cursor: int = 0,
                             limit: int = 0) -> list[FrameRecord]:
        """One request's frames with seq past ``after_seq`` and cursor past
        ``after_cursor``, in seq order, at most ``limit`` (0: all). A request's
        frames are written in seq order, so seq order is cursor order, and a
        replay pages on by the last cursor it got."""

    async def last_frame_cursor(self) -> int:
        """The highest frame cursor committed so far (0: none)."""

    async def frames_after(self, cursor: int, *, session_key: str = "", platform: str = "",
                           limit: int = 1000) -> list[FrameRecord]: ...

    # the worker side (a picklable recipe for TranscriptReader)
    def reader_spec(self) -> tuple: ...

    # for operators (the metrics endpoint, GetStatus)
    async def stats(self) -> StoreStats:
        """How large the store is and how far the full-text index is behind."""

    @property
    def commit_stats(self) -> CommitStats:
        """The writer's commit times, group sizes and backlog (store/writer/client.py)."""


class TranscriptReader(Protocol):
    """What a worker process reads: an incarnation's live transcript in the
    model's chat shape, on a cache miss. Opened from ``Store.reader_spec()``."""

    def load_for_model(self, session_id: str) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


class SharedStore(Store, Protocol):
    """A store several sidecars write at once (PostgreSQL): what a sidecar's
    cluster tail (cluster/tail.py) and leases (cluster/leases.py) ask of it
    besides the reads of ``Store``."""

    def follow_cluster(self, idle_s: float) -> AsyncGenerator[int | ClusterOp, None]:
        """What every sidecar commits, as it commits: an int > 0 is the highest
        frame cursor of one commit with frames; 0 means "catch up by cursor
        now" (yielded once listening, so nothing committed before is missed,
        and again after every ``idle_s`` of silence, a safety net); a
        ``ClusterOp`` is an announce. Raises ``StoreUnavailable`` when the
        connection is lost; the caller follows again and catches up."""

    async def known_requests(self, request_ids: list[str]) -> set[str]:
        """Of these request ids, those the ledger holds (a delete removed the others)."""

    async def reset_requests(self, request_ids: list[str]) -> set[str]:
        """Of these request ids, those whose incarnation a ResetSession ended."""

    async def stopped_requests(self, request_ids: list[str], stuck_after: int) -> set[str]:
        """Of these request ids, those whose incarnation a SuspendSession
        suspended (not the stuck-loop guard: it leaves the lane's restart
        count at ``stuck_after``, recovery/startup.py)."""

    async def revoked_leases(self, keys: list[str]) -> set[str]:
        """Of these lanes, those whose lease a delete revoked (DeleteSession,
        ClearAllSessions) and nobody took since."""

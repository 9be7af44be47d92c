"""The storage interface: what the domain (sessions/, turns/, recovery/, api/)
may ask of a store, and what a backend must guarantee.

Two sides:

* **Writes** go through one call, ``Store.write(job, *args)``. A *job* is a
  module-level function ``job(uow, *args) -> result`` holding a domain rule
  (get-or-create, accept a prompt, finish a turn, the restore plan...). The
  backend runs it inside a unit of work, against the typed repository
  operations of ``UnitOfWork``; it supplies those operations and the unit of
  work, never a rule. ``write`` returns an ``asyncio.Future``: its result is
  the job's return value, its exception whatever the job raised (a
  ``SidecarError`` for a refusal, ``StoreUnavailable`` when the store could
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

from collections.abc import AsyncGenerator, Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..errors import SidecarError
from .faults import StoreUnavailable  # noqa: F401  (the interface's error)
from .records import (
    Append,
    ClusterOp,
    FrameRecord,
    Incarnation,
    LaneHead,
    LeaseGrant,
    LeaseHolder,
    LedgerEntry,
    Message,
    NewFrame,
    OpenPrompt,
    QueueSlot,
    RoutingPatch,
    SearchHit,
    SessionEntry,
    StoreStats,
    UsageDelta,
)

if TYPE_CHECKING:  # only in annotations: the store writer process runs no event loop
    import asyncio

    from .writer.client import CommitStats

R = TypeVar("R")


def unknown_session(session_id: str) -> SidecarError:
    """What an append to an incarnation that does not exist answers (every backend)."""
    return SidecarError("SESSION_NOT_FOUND", f"no such session id: {session_id}")


class StoreOpenError(RuntimeError):
    """The store cannot be opened at all (a file that is no store, a schema
    from a newer version): the sidecar does not start."""


# -- the writer side: a unit of work and its repositories --------------------------------------


class RoutingRepo(Protocol):
    """Routing rows, one per conversation lane (seed 001's sessions.json)."""

    def get(self, key: str) -> SessionEntry | None:
        """The row with its incarnation's turn count; locks it for the job."""

    def head(self, key: str) -> LaneHead | None:
        """The few columns accepting a prompt needs (the hot path)."""

    def insert(self, entry: SessionEntry) -> bool:
        """A new row; False when the key exists (another writer won the race)."""

    def patch(self, key: str, patch: RoutingPatch, *, session_id: str | None = None,
              if_current: RoutingPatch | None = None) -> None:
        """Apply ``patch`` (to no row when the key does not exist); ``if_current``
        is applied too, but only while the row still points at ``session_id`` (a
        compare-and-set: a turn ending after a reset must not touch the new
        incarnation's flags). One statement, whose answer nobody waits for (no
        result: on PostgreSQL it is pipelined, no round trip of its own)."""

    def add_usage(self, key: str, delta: UsageDelta, updated_at: float | None) -> None:
        """Add the counters (and set ``last_prompt_tokens``/``cost_status``
        when given); ``updated_at`` moves the lane too when not None. No
        result, as ``patch``."""

    def keys_active_since(self, since: float, keys: Sequence[str] | None = None) -> list[str]:
        """Lanes updated at or after ``since`` that are neither suspended nor
        already resume_pending (seed 001 §7's suspend_recently_active); of
        ``keys`` only, when given (a lane taken over in a cluster)."""

    def resume_candidates(self, since: float, keys: Sequence[str] | None = None) -> list[SessionEntry]:
        """Lanes resume_pending, not suspended, updated at or after ``since``
        (of ``keys`` only, when given)."""

    def idle_before(self, cutoff: float) -> list[str]:
        """Lanes updated before ``cutoff``, not suspended, not running."""

    def clear_running(self, keys: Sequence[str] | None = None) -> None:
        """No lane (of ``keys``, when given) is running: the restore rebuilds them."""

    def delete(self, key: str) -> bool: ...

    def count(self) -> int: ...


class IncarnationRepo(Protocol):
    def insert(self, session_id: str, key: str, created_at: float) -> None: ...

    def get(self, session_id: str) -> Incarnation | None: ...

    def end(self, session_id: str, reason: str, at: float) -> Incarnation | None:
        """Close it (if open); returns it as it is now."""

    def reopen(self, session_id: str) -> None: ...

    def add_turn(self, session_id: str) -> None:
        """One more completed turn."""

    def bump_rev(self, session_id: str) -> None:
        """Live rows were hidden: a cached copy of the transcript is stale."""

    def of_key(self, key: str) -> list[str]: ...


class MessageRepo(Protocol):
    def append(self, items: Sequence[Append]) -> list[tuple[int, int, int] | Exception]:
        """Per item ``(first_seq, last_seq, rev)`` with seqs handed out per
        incarnation in item order, or the SidecarError for an unknown
        session id (nothing written for that item). The lanes of items with
        ``touch_lane`` count as active now."""

    def hide_live(self, session_id: str, reason: str) -> int: ...

    def hide_from(self, session_id: str, seq: int, reason: str) -> int:
        """Hide every live row at or after ``seq``; returns how many."""

    def hide_request(self, session_id: str, request_id: str, reason: str) -> int:
        """Hide the live rows one turn wrote."""

    def last_user(self, session_id: str, n: int) -> list[tuple[int, str]]:
        """(seq, content) of the last ``n`` live user rows, newest first."""

    def of_request(self, request_id: str) -> list[Message]:
        """The rows one turn wrote, in seq order."""

    def index_pending(self, limit: int | None = None) -> int:
        """Bring the full-text index up to date (at most ``limit`` rows); 0
        for a backend that indexes on insert."""


class LedgerRepo(Protocol):
    def get(self, request_id: str) -> LedgerEntry | None: ...

    def insert(self, entry: LedgerEntry) -> bool:
        """False when the request id is in the ledger already."""

    def forget(self, request_id: str) -> None:
        """Delete a row that aged out of the dedup window, with its frames."""

    def mark_started(self, request_id: str, session_id: str, at: float, first_seq: int,
                     from_queue: bool) -> None: ...

    def set_first_frame(self, request_id: str, cursor: int, first_seq: int | None) -> None:
        """Where the request's frames (its accepted frame's cursor) and
        transcript rows (``first_seq``) start."""

    def close(self, request_id: str, status: str, reason: str, last_seq: int, at: float) -> None:
        """The request ended (``last_seq``: its terminal frame's seq)."""

    def open_prompts(self, keys: Sequence[str] | None = None) -> list[OpenPrompt]:
        """Every queued or running row (of ``keys``, when given) with its
        slot, by key then creation."""

    def ids_with_prefix(self, prefix: str) -> list[str]: ...

    def recent(self, since: float, limit: int) -> list[tuple[str, float, str]]:
        """(request_id, created_at, session_key) newest first."""

    def delete_closed_before(self, cutoff: float, limit: int) -> int: ...

    def delete_key(self, key: str) -> None:
        """Every ledger and queue row of a lane."""


class QueueRepo(Protocol):
    def insert(self, slot: QueueSlot) -> None: ...

    def remove(self, request_id: str) -> None: ...


class FrameRepo(Protocol):
    def insert(self, rows: Sequence[NewFrame]) -> int:
        """Insert in order; returns the first row's cursor (the rest follow it
        by one each)."""

    def last_seq(self, request_id: str) -> int: ...

    def delete_before(self, at: float, limit: int) -> int:
        """Retention: at most ``limit`` of the oldest frames older than ``at``."""

    def delete_key(self, key: str) -> None: ...


class RestartRepo(Protocol):
    """Stuck-loop counters: consecutive restarts with a lane in flight."""

    def keep_only(self, keys: Iterable[str]) -> None: ...

    def increment(self, key: str, at: float) -> int: ...

    def reset(self, key: str) -> None: ...


class TurnStateRepo(Protocol):
    def put(self, session_id: str, request_id: str, at: float, state: dict[str, Any]) -> None: ...


class LeaseRepo(Protocol):
    """Per-lane leases of a cluster (DECISIONS.md "Scale beyond one machine"):
    at most one node runs a lane's turns. Times are the database's."""

    def take(self, key: str, node_id: str, address: str, ttl_s: float) -> LeaseGrant | LeaseHolder:
        """The lease for ``node_id`` when free, run out, let go or its own
        (a new epoch each time), else who holds it."""

    def fenced(self, node_id: str, epochs: dict[str, int]) -> set[str]:
        """Of these lanes, those whose lease no longer names ``node_id`` at that
        epoch; the others cannot change hands before this transaction ends."""

    def renew(self, node_id: str, keys: Iterable[str], ttl_s: float) -> dict[str, int]:
        """Extend these leases of ``node_id``; returns those still its own."""

    def release(self, key: str, node_id: str, epoch: int) -> None:
        """Let the lane go (another node may take it at once)."""

    def expire(self, key: str, node_id: str, epoch: int) -> None:
        """Let the lease run out now without letting the lane go: the next
        holder restores it as a lane whose node went away (``orphaned``)."""

    def revoke(self, keys: Sequence[str] | None = None) -> None:
        """The lanes (None: every lane) were deleted: each lease moves to a new
        epoch, names no node and is let go, so writes under an older epoch
        are refused."""

    def revoked(self, keys: Iterable[str]) -> set[str]:
        """Of these lanes, those whose lease was revoked and not taken since."""

    def of_node(self, node_id: str) -> list[str]:
        """Lanes whose last lease named ``node_id`` and that it did not let go."""

    def orphaned(self, limit: int = 100) -> list[str]:
        """Lanes whose lease ran out with queued or running work in the ledger,
        or ran out without being let go on a lane marked resume_pending."""


class NodeRepo(Protocol):
    def arrive(self, node_id: str, address: str) -> bool:
        """This node starts; returns whether its last run stopped cleanly."""

    def leave(self, node_id: str) -> None:
        """This node stops cleanly (the per-node clean-shutdown marker)."""


class UnitOfWork(Protocol):
    """One job's view of the store, inside the backend's transaction.
    ``leases`` and ``nodes`` are None on a backend without a cluster (SQLite:
    one sidecar per file); ``node_id`` names the sidecar whose writer runs it."""

    routing: RoutingRepo
    incarnations: IncarnationRepo
    messages: MessageRepo
    ledger: LedgerRepo
    queue: QueueRepo
    frames: FrameRepo
    restarts: RestartRepo
    turn_state: TurnStateRepo
    leases: LeaseRepo | None
    nodes: NodeRepo | None
    node_id: str

    def delete_lane(self, key: str) -> None:
        """Everything a lane owns: its incarnations, messages, turn state,
        frames, ledger and queue rows, restart counter and routing row."""

    def clear_all(self) -> int:
        """seed 000's $sessionClearAll: every table emptied; returns lanes dropped."""

    def index_messages(self, limit: int | None = None) -> int:
        """Bring the full-text index up to date (at most ``limit`` rows);
        returns how many were indexed (0 for backends that index on insert)."""

    def savepoint(self) -> AbstractContextManager[None]:
        """A nested atomic step inside the job: undone alone if it raises."""

    def is_fault(self, e: BaseException) -> bool:
        """Whether ``e`` means the store cannot write (faults.py)."""

    def probe(self) -> None:
        """Write one row to prove the store can write again (a retry round)."""

    def announce(self, op: str, keys: Sequence[str]) -> None:
        """Tell the other sidecars sharing this store, once (and only if) this
        transaction commits, that lanes went (a ClusterOp: ``clear_all``,
        ``delete``, ``prune``), so they drop what they hold of them. A no-op
        on a store only one sidecar uses (SQLite)."""


Job = Callable[..., R]


def batched(many: Callable[[UnitOfWork, list[tuple]], list]):
    """Mark a job as batchable: a run of consecutive calls of it in one commit
    group runs as ``many(uow, [args, ...])``, which returns one result (or
    exception instance) per call, in order, and must raise only when nothing
    it wrote should stand."""

    def mark(job):
        job.many = many
        return job
    return mark


# -- the parent side ----------------------------------------------------------------------------


class Store(Protocol):
    """``await start()`` before the first call, ``await close()`` after the last."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

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

    async def request_frames(self, request_id: str, after_seq: int = 0) -> list[FrameRecord]: ...

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
    cluster tail (cluster/tail.py) asks of it besides the reads of ``Store``."""

    async def last_frame_cursor(self) -> int:
        """The highest frame cursor committed so far (0: none)."""

    def follow_cluster(self, idle_s: float) -> AsyncGenerator[int | ClusterOp, None]:
        """What every sidecar commits, as it commits: an int > 0 is the highest
        frame cursor of one commit with frames; 0 means "catch up by cursor
        now" (yielded once listening, so nothing committed before is missed,
        and again after every ``idle_s`` of silence, a safety net); a
        ``ClusterOp`` is an announce. Raises ``StoreUnavailable`` when the
        connection is lost; the caller follows again and catches up."""

"""The writer side of the storage interface (interface.py): the unit of work a
job runs against and its typed repositories.

A job (``job(uow, *args)``, a domain rule in sessions/, turns/, recovery/,
cluster/) sees the store only through ``UnitOfWork``: one repository per
concern, each operation typed with the records of records.py. A backend
implements these operations and the transaction around a job, never a rule;
what it must guarantee (atomicity, order, durability, isolation) is
interface.py's docstring. Runs in the store's writer process, so nothing here
needs an event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

from ..errors import SidecarError
from .records import (
    Append,
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
    SessionEntry,
    UsageDelta,
)

R = TypeVar("R")


def unknown_session(session_id: str) -> SidecarError:
    """What an append to an incarnation that does not exist answers (every backend)."""
    return SidecarError("SESSION_NOT_FOUND", f"no such session id: {session_id}")


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

    def add_usage(self, key: str, delta: UsageDelta, updated_at: float | None,
                  session_id: str | None = None) -> None:
        """Add the counters, each stopping at ``TOKEN_TOTAL_CAP`` (and set
        ``last_prompt_tokens``/``cost_status`` when given); ``updated_at``
        moves the lane too when not None. With ``session_id``, only while
        the lane is on that incarnation. No result, as ``patch``."""

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
        """(seq, content) of the last ``n`` live user rows a user wrote (not
        ``synthetic``: an auto-resume's note is no user turn), newest first."""

    def of_request(self, request_id: str) -> list[Message]:
        """The rows one turn wrote, in seq order."""

    def lock(self, session_ids: Sequence[str]) -> None:
        """Hold these incarnations' transcripts against every other writer's
        appends and hides until the transaction ends, so what a job reads of
        them after this (``tail``) is still so when it commits. PostgreSQL:
        their rows ``FOR UPDATE``, in session-id order (as ``append`` takes
        them), in a statement of its own: a read after it sees what the
        writer before it committed. SQLite: nothing, its one writer is alone."""

    def tail(self, session_id: str) -> list[Message]:
        """The live rows from the last live row that is not a "tool" one on,
        in seq order: the message whose tool calls the tool rows after it
        answer (sessions/transcripts.py ``open_calls``). Read after ``lock``
        where an append is checked against it."""

    def tail_request(self, session_id: str) -> str | None:
        """The request id of the turn that wrote the live transcript's last
        row that is not a "tool" one (None: no turn wrote it, or no row)."""

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

    def heartbeat(self, node_id: str) -> None:
        """This node is alive (renewed with its leases)."""

    def presence(self, node_id: str) -> tuple[bool, float, float, str] | None:
        """``(clean_stop, heartbeat_at, seconds since it, address)`` of the
        node's row, None when there is none."""

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

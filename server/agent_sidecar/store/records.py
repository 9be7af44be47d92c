"""The values that cross the storage seam, in both directions.

Everything here is plain data — frozen dataclasses of strings, numbers and
JSON-able dicts — because it travels: pickled to the store's writer process
and back, and read by backends that know nothing of the domain above them.
Times are seconds since the epoch (UTC) as floats, on every backend.

A ``RoutingPatch`` names the columns it changes (``None`` is a value:
``last_resume_marked_at=None`` clears it).

Every class here is a ``@record`` (``record_type.py``): frozen, slotted,
pickled as its class and a tuple of its fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Final, TypedDict, Unpack

from .record_type import pickled_as_fields, record

# -- lanes ---------------------------------------------------------------------------------

@record
class SessionEntry:
    """One routing row (seed 001 §2's SessionEntry) plus its incarnation's
    ``turn_count`` (seed 000's session row). ``origin`` is the SessionSource
    that last reached the lane, as its dict (``SessionSource.to_dict``)."""

    session_key: str
    session_id: str
    profile: str
    platform: str
    chat_type: str
    created_at: float
    updated_at: float
    origin: dict[str, Any] | None = None
    display_name: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    total_tokens: int = 0
    estimated_cost_usd: float = 0.0
    cost_status: str = "unknown"
    last_prompt_tokens: int = 0
    was_auto_reset: bool = False
    auto_reset_reason: str = ""
    reset_had_activity: bool = False
    is_fresh_reset: bool = False
    expiry_finalized: bool = False
    suspended: bool = False
    resume_pending: bool = False
    resume_reason: str = ""
    last_resume_marked_at: float | None = None
    running: bool = False
    turn_count: int = 0


ROUTING_FIELDS: Final = tuple(f.name for f in fields(SessionEntry) if f.name != "turn_count")


class RoutingColumns(TypedDict, total=False):
    """The columns of a routing row a ``RoutingPatch`` may set: SessionEntry's
    fields but the lane's identity and ``turn_count`` (the incarnation's)."""

    session_id: str
    created_at: float
    updated_at: float
    origin: dict[str, Any] | None
    display_name: str
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    total_tokens: int
    estimated_cost_usd: float
    cost_status: str
    last_prompt_tokens: int
    was_auto_reset: bool
    auto_reset_reason: str
    reset_had_activity: bool
    is_fresh_reset: bool
    expiry_finalized: bool
    suspended: bool
    resume_pending: bool
    resume_reason: str
    last_resume_marked_at: float | None
    running: bool


PATCH_FIELDS: Final = frozenset(RoutingColumns.__annotations__)
# The lane's identity (its key, profile, platform, chat type) is never patched.
assert PATCH_FIELDS == frozenset(ROUTING_FIELDS) - {"session_key", "profile", "platform", "chat_type"}


class RoutingPatch:
    """The columns of a routing row to change, by name (``RoutingPatch(
    running=True)``); a column not named stays.
    Immutable, and cheap to make: lane updates make one or two a turn, so it
    holds just the columns given rather than a field per column."""

    __slots__ = ("_changes",)

    def __init__(self, base: RoutingColumns | None = None, /, **columns: Unpack[RoutingColumns]) -> None:
        """The columns of ``base`` (a set of columns several patches share),
        then those named."""
        changes: dict[str, Any] = {**base, **columns} if base else dict(columns)
        unknown = changes.keys() - PATCH_FIELDS
        if unknown:
            raise TypeError(f"RoutingPatch: not a routing column: {', '.join(sorted(unknown))}")
        self._changes: Mapping[str, Any] = MappingProxyType(changes)

    def changes(self) -> Mapping[str, Any]:
        """The columns this patch sets, in the order they were given."""
        return self._changes

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RoutingPatch) and dict(self._changes) == dict(other._changes)

    def __repr__(self) -> str:
        return "RoutingPatch(" + ", ".join(f"{k}={v!r}" for k, v in self._changes.items()) + ")"

    def __reduce__(self):
        return (_routing_patch, (dict(self._changes),))


def _routing_patch(changes: dict[str, Any]) -> RoutingPatch:
    return RoutingPatch(**changes)


@record
class LaneHead:
    """What accepting a prompt needs of its lane, without decoding the rest."""

    session_id: str
    suspended: bool
    resume_pending: bool
    created_at: float
    origin: dict[str, Any] | None


# Accounting bounds. One delta stays far above any real turn; a lane's running
# totals stop at the cap instead of overflowing int64 (SQLite would turn the
# column into a REAL and every read of the lane would fail, PostgreSQL would
# refuse the write).
MAX_TOKEN_DELTA = 2 ** 40
MAX_COST_DELTA = 1e9
TOKEN_TOTAL_CAP = 2 ** 62


@record
class UsageDelta:
    """Token and cost counters to add (seed 001 §2); ``last_prompt_tokens``
    replaces the lane's when positive. Each field within its bound
    (``MAX_TOKEN_DELTA``, ``MAX_COST_DELTA``): the API refuses larger ones,
    a model's report is clamped (``from_report``)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float = 0.0
    last_prompt_tokens: int = 0
    cost_status: str = ""

    @classmethod
    def from_report(cls, u: dict[str, Any]) -> UsageDelta:
        """A model's usage frame, each counter clamped into its bound (an
        API's report is not ours to trust); the prompt's whole size, cached
        parts included, is what it reported as its prompt."""
        def tokens(name: str) -> int:
            return min(max(int(u.get(name, 0) or 0), 0), MAX_TOKEN_DELTA)
        cost = float(u.get("cost_usd", 0.0) or 0.0)
        cost = min(cost, MAX_COST_DELTA) if cost > 0 else 0.0  # NaN is not > 0
        i, cr, cw = tokens("input_tokens"), tokens("cache_read_tokens"), tokens("cache_write_tokens")
        return cls(i, tokens("output_tokens"), cr, cw, cost, min(i + cr + cw, MAX_TOKEN_DELTA))


@record
class Incarnation:
    """One session id a key has had."""

    session_id: str
    session_key: str
    created_at: float
    ended_at: float | None = None
    end_reason: str | None = None
    turn_count: int = 0
    next_seq: int = 1
    rev: int = 0

    @property
    def had_activity(self) -> bool:
        return self.turn_count > 0 or self.next_seq > 1


# -- transcripts ---------------------------------------------------------------------------

@dataclass(slots=True)
class Message:
    """A transcript row. ``seq`` and ``active`` are the store's (as read
    back); ``synthetic`` marks text the sidecar wrote, not a user."""

    role: str
    content: str = ""
    tool_call_id: str = ""
    tool_name: str = ""
    tool_calls_json: str = ""
    created_at: float = 0.0
    seq: int = 0
    active: bool = True
    synthetic: bool = False


pickled_as_fields(Message, fields(Message))  # a turn's messages cross the writer pipe


@record
class Append:
    """Messages to append to one incarnation; ``request_id`` names the turn
    that wrote them (None for AppendMessages/SeedSession)."""

    session_id: str
    messages: tuple[Message, ...]
    request_id: str | None = None
    touch_lane: bool = True  # move the lane's updated_at (a turn's end moves it anyway)


@record
class SearchHit:
    session_key: str
    session_id: str
    seq: int
    role: str
    snippet: str
    created_at: float


# -- the prompt ledger and queue -------------------------------------------------------------

@record
class LedgerEntry:
    """One request id's row: what was asked, where, and how it ended.
    ``first_frame`` is the cursor of its ``accepted`` frame and ``first_seq``
    the seq of its first transcript row (where a backend may start looking)."""

    request_id: str
    session_key: str
    session_id: str
    platform: str
    status: str  # queued | running | completed | failed | superseded
    delivery: int
    text: str
    payload: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    reason: str | None = None
    last_seq: int = 0
    first_frame: int | None = None
    first_seq: int | None = None

    @property
    def open(self) -> bool:
        return self.status in ("queued", "running")


@record
class QueueSlot:
    """A prompt waiting for its lane: the single follow-up slot (``pending``)
    or the FIFO (``fifo``); ``position`` orders a lane's prompts."""

    request_id: str
    session_key: str
    slot: str
    position: int
    enqueued_at: float


@record
class OpenPrompt:
    """A ledger row still queued or running, with its queue slot if any."""

    entry: LedgerEntry
    slot: str | None
    position: int | None


# -- activity frames ---------------------------------------------------------------------------

@record
class FrameRecord:
    """A persisted activity frame; ``cursor`` is its global position (grows
    with commit order, never reused), ``seq`` its place in its request."""

    cursor: int
    request_id: str
    seq: int
    session_key: str
    session_id: str
    platform: str
    at: float
    kind: str
    body: dict[str, Any]


@record
class ClusterOp:
    """A change to the shared store that every other sidecar of a cluster must
    mirror in its own memory (its lanes, cached agents, dedup index), announced
    in the transaction that made it (UnitOfWork.announce). ``op`` is
    ``clear_all`` (``keys`` empty), ``delete`` or ``prune``; ``origin`` is the
    node whose job made it (it has done its own part already)."""

    op: str
    keys: tuple[str, ...]
    origin: str


# A frame to insert: (request_id, seq, session_key, session_id, platform, at,
# kind, body as orjson bytes or None). A tuple, not a dataclass: a busy sidecar
# inserts tens of thousands a second and pickles each one to the writer.
NewFrame = tuple


# -- what the store holds, for operators ------------------------------------------------------

@record
class StoreStats:
    """``size_bytes``: what the store takes (SQLite: the database file and its
    WAL; PostgreSQL: the database); ``fts_backlog``: messages not in the
    full-text index yet (0 for a backend that indexes on insert)."""

    backend: str
    size_bytes: int
    fts_backlog: int


# -- the cluster (several sidecars on one database) ---------------------------------------------

@record
class LeaseGrant:
    """This node holds the lane at ``epoch``. ``previous_node`` held it before
    (empty: nobody); ``previous_clean``: that node let the lane go (a drain, an
    idle lane) rather than its lease running out under it (its node died or
    stalled, so the lane's work may have been cut off)."""

    session_key: str
    epoch: int
    previous_node: str = ""
    previous_clean: bool = True


@record
class LeaseHolder:
    """Another node holds the lane; calls for it go to ``address``."""

    session_key: str
    node_id: str
    address: str
    epoch: int
    seconds_left: float = 0.0  # until the lease runs out unless renewed

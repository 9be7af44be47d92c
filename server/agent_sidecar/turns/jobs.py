"""The prompt ledger's rules as store jobs: accepting a prompt, a turn's start
and end, usage accounting.

They run as store jobs (store/unit_of_work.py), so they take plain data — never
a ``Turn`` — and return plain data (the frozen records below); the manager
applies the results to its turns. Only rules live here; rows are the store's.
"""

from __future__ import annotations

import time
from dataclasses import field
from typing import Any

import orjson

from ..errors import INVALID_ARGUMENT, SidecarError, not_found
from ..sessions import lifecycle as life
from ..sessions import transcripts as tx
from ..sessions.source import SessionSource
from ..store import UnitOfWork, batched
from ..store.record_type import record
from ..store.records import Append, LedgerEntry, Message, NewFrame, QueueSlot, RoutingPatch, UsageDelta
from .leasing import check_fence


class DuplicateRequest(Exception):
    """The request id is already in the ledger (within the dedup window), for the same session key."""


def request_id_reused(rid: str) -> SidecarError:
    """A request id known for another session key (turns/dedup.py): refused,
    naming neither that session nor anything of its turn."""
    return SidecarError(INVALID_ARGUMENT, f"request_id: {rid!r} is already used by another session"
                        " within the dedup window; use a new request id", field="request_id")


@record
class PromptRecord:
    """What the ledger keeps of a prompt (``Turn.record()``)."""

    request_id: str
    session_key: str
    platform: str
    profile: str
    delivery: int
    text: str
    payload: dict[str, Any]
    created_at: float


@record
class AcceptRequest:
    prompt: PromptRecord
    source: SessionSource | None  # None: the prompt named its lane by key
    dedup_window_s: float
    slot: str | None  # its queue slot when it waits (pending, fifo), None when it runs now
    position: int
    start_now: bool  # the lane is idle: its start commits with its accept
    fence: dict[str, int] | None = None  # a cluster: the lane's lease epoch it is accepted under


@record
class LaneState:
    """What a turn's system prompt needs of its lane, as the job saw it."""

    session_id: str
    created_at: float
    origin: dict[str, Any] | None


@record
class Started:
    """A turn's start: where its user messages went (``base_seq`` on, in
    incarnation revision ``rev``: what the worker's cache must match)."""

    session_id: str
    base_seq: int
    rev: int
    at: float
    lane: LaneState
    cursor: int = 0  # of its ``started`` frame when the accept job wrote it


@record
class ClosedFrame:
    request_id: str
    seq: int
    session_id: str
    at: float
    cursor: int


@record
class Absorbed:
    """An absorbing follow-up's accept (burst.py): the prompt it links to, and
    that prompt's ``superseded`` frame, written by the same job."""

    link: str | None
    closed: ClosedFrame | None


@record
class Accepted:
    session_id: str
    cursor: int  # of the ``accepted`` frame
    lane: LaneState
    started: Started | None = None
    absorbed: Absorbed | None = None


@record
class StartRequest:
    request_id: str
    session_key: str
    texts: tuple[str, ...]  # its user messages: one, or a burst's, oldest first
    queued: bool  # it waited in the lane (has a queue row)
    synthetic: bool = False  # an auto-resume note (nobody wrote it)


@record
class TurnEnd:
    request_id: str
    session_key: str
    session_id: str
    status: str
    reason: str
    last_seq: int  # the seq of its terminal frame
    rollback: bool
    lane_idle: bool
    state: dict[str, Any] = field(default_factory=dict)


def _check_duplicate(uow: UnitOfWork, rid: str, key: str, window_s: float, now: float) -> None:
    """Refuse a request id seen within the window (a twin for the same key,
    INVALID_ARGUMENT for another); forget an older one, unless its turn is
    still open (queued or running, on another node of a cluster, say):
    forgetting it would drop the row and frames of a turn that goes on."""
    old = uow.ledger.get(rid)
    if old is None:
        return
    if now - old.created_at < window_s or old.open:
        raise DuplicateRequest(rid) if old.session_key == key else request_id_reused(rid)
    uow.ledger.forget(rid)


ABSORB = "absorb"  # payload key: the request ids an absorbing follow-up may close (burst.candidates)


def _absorb_link(uow: UnitOfWork, key: str, candidates: list[str]) -> tuple | None:
    """(request id, session id, platform) of the prompt an absorbing follow-up
    takes over: the first of ``candidates`` (see burst.candidates) still open.
    One with no ledger row was refused (its caller got the error; its text is
    not carried); one that ended some other way ends the chain."""
    for rid in candidates:
        e = uow.ledger.get(rid)
        if e is None or e.session_key != key:
            continue
        return (rid, e.session_id, e.platform) if e.status == "queued" else None
    return None


def _lane_for(uow: UnitOfWork, req: AcceptRequest, now: float) -> LaneState:
    """The lane a prompt lands in: as it is (the common case, nothing written
    yet), or the session comes into being, or a suspended lane starts over
    (seed 001 §2), after the dedup check."""
    p = req.prompt
    head = uow.routing.head(p.session_key)
    if head is not None and not head.suspended:
        origin = head.origin
        if req.source is not None:
            origin = req.source.to_dict()
            if not head.resume_pending:  # get_or_create's "keep and bump"
                uow.routing.patch(p.session_key, life.kept(req.source, now))
        return LaneState(head.session_id, head.created_at, origin)
    _check_duplicate(uow, p.request_id, p.session_key, req.dedup_window_s, now)
    if req.source is not None:
        entry = life.get_or_create(uow, p.session_key, req.source, p.profile)[0]
    else:
        entry = life.starting_over(uow, p.session_key)
    return LaneState(entry.session_id, entry.created_at, entry.origin)


def _accept_many(uow: UnitOfWork, calls: list[tuple]) -> list:
    """Many prompts' accepts as one call: ``accept`` raises its refusals
    (unknown session, duplicate) before writing anything, so a refusal needs
    no savepoint of its own."""
    out: list = []
    for (req,) in calls:
        try:
            out.append(accept(uow, req))
        except (SidecarError, DuplicateRequest) as e:
            out.append(e)
    return out


@batched(_accept_many)
def accept(uow: UnitOfWork, req: AcceptRequest) -> Accepted:
    """Resolve the session, write the ledger row (+ queue row) and the
    ``accepted`` frame. With ``start_now`` the turn's start commits in the same
    transaction: one commit instead of two before the worker gets the turn.
    On a usable lane the ledger row is the first write: a duplicate request id
    is refused before anything is written.

    A follow-up that absorbed the pending prompt (burst.py) links to it in its
    ledger payload and closes that prompt's ledger row with its ``superseded``
    frame here too: one transaction moves the texts from the prompt that
    carried them to the one that carries them now."""
    check_fence(uow, req.fence)
    p, now = req.prompt, time.time()
    payload, link = p.payload, None
    if ABSORB in payload:  # reads only: a refusal below still comes before any write
        link = _absorb_link(uow, p.session_key, payload[ABSORB])
        payload = {k: v for k, v in payload.items() if k != ABSORB}
        if link is not None:
            payload["absorbed_from"] = link[0]
    lane = _lane_for(uow, req, now)
    sid = lane.session_id
    entry = LedgerEntry(p.request_id, p.session_key, sid, p.platform,
                        "queued" if req.slot else "running", p.delivery, p.text, payload,
                        p.created_at, started_at=now if req.start_now else None)
    if not uow.ledger.insert(entry):
        _check_duplicate(uow, p.request_id, p.session_key, req.dedup_window_s, now)
        uow.ledger.insert(entry)
    if req.slot:
        uow.queue.insert(QueueSlot(p.request_id, p.session_key, req.slot, req.position, now))
    body = orjson.dumps({"queue_position": payload.get("queue_position", 0)})
    frames: list[NewFrame] = [(p.request_id, 1, p.session_key, sid, p.platform, p.created_at, "accepted", body)]
    begun = None
    if req.start_now:
        begun = _begin(uow, p.request_id, p.session_key, sid, (p.text,), now, "resume" in payload)
        frames.append((p.request_id, 2, p.session_key, sid, p.platform, now, "started", None))
    closed = None
    if link is not None:
        seq = uow.frames.last_seq(link[0]) + 1
        close_unstarted(uow, link[0], "superseded", "", seq)
        frames.append((link[0], seq, p.session_key, link[1], link[2], now, "superseded",
                       orjson.dumps({"by_request_id": p.request_id})))
        closed = (link[0], seq, link[1], now)
    cursor = uow.frames.insert(frames)
    uow.ledger.set_first_frame(p.request_id, cursor, begun[0] if begun else None)
    started = Started(sid, begun[0], begun[1], now, lane, cursor + 1) if begun else None
    absorbed = None
    if ABSORB in p.payload:
        absorbed = Absorbed(link[0] if link else None,
                            ClosedFrame(*closed, cursor + len(frames) - 1) if closed else None)
    return Accepted(sid, cursor, lane, started, absorbed)




def _begin(uow: UnitOfWork, rid: str, key: str, sid: str, texts: tuple[str, ...], now: float,
           synthetic: bool) -> tuple[int, int]:
    """The turn's user messages into the transcript (all tagged with this
    request, so a rollback hides them with the turn), the lane marked running.
    Returns (base_seq, rev)."""
    msgs = tuple(Message("user", t, created_at=now, synthetic=synthetic) for t in texts)
    result = uow.messages.append([Append(sid, msgs, rid, touch_lane=False)])[0]
    if isinstance(result, BaseException):
        raise result
    # updated_at moved at accept and moves again at the end; leaving it alone
    # here spares two index updates per turn.
    uow.routing.patch(key, RoutingPatch(running=True))
    return result[0], result[2]


def start(uow: UnitOfWork, req: StartRequest) -> Started:
    """A turn that waited in its lane begins, in the lane's incarnation as it
    is now (a switch may have moved it while the turn waited): ledger running,
    lane running, its user messages appended."""
    now = time.time()
    head = uow.routing.head(req.session_key)
    if head is None:
        raise not_found(req.session_key)
    base, rev = _begin(uow, req.request_id, req.session_key, head.session_id, req.texts, now,
                       req.synthetic)
    uow.ledger.mark_started(req.request_id, head.session_id, now, base, req.queued)
    return Started(head.session_id, base, rev, now, LaneState(head.session_id, head.created_at,
                                                              head.origin))


def finish(uow: UnitOfWork, end: TurnEnd) -> None:
    """The turn ended: ledger closed; on success the turn counts, the flags
    it consumes clear (of its own incarnation only: a reset or switch may have
    moved the lane on while it finished), the stuck-loop counter resets; an
    idle lane stops being "running"."""
    now = time.time()
    uow.ledger.close(end.request_id, end.status, end.reason, end.last_seq, now)
    if end.rollback:
        tx.hide_request(uow, end.session_id, end.request_id)
    done = end.status == "completed"
    if done:
        uow.incarnations.add_turn(end.session_id)
        uow.restarts.reset(end.session_key)
    uow.routing.patch(end.session_key,
                      RoutingPatch(updated_at=now, running=False) if end.lane_idle else RoutingPatch(updated_at=now),
                      session_id=end.session_id, if_current=life.CONSUMED_BY_A_TURN if done else None)
    uow.turn_state.put(end.session_id, end.request_id, now, end.state)


def close_unstarted(uow: UnitOfWork, rid: str, status: str, reason: str, last_seq: int) -> None:
    """The ledger closes a turn that has no ``finish`` of its own: a queued one
    that never ran (superseded, cancelled, dropped), or one the startup restore
    closes. Its queue row, if any, goes."""
    uow.ledger.close(rid, status, reason, last_seq, time.time())
    uow.queue.remove(rid)


def record_usage(uow: UnitOfWork, key: str, session_id: str, u: dict[str, Any]) -> None:
    """A usage frame's accounting (seed 001 §2's counters), on the lane only
    while it is still on the turn's incarnation: after a switch or a forced
    new session the counters are another conversation's."""
    uow.routing.add_usage(key, UsageDelta.from_report(u), None, session_id=session_id)


def fenced(uow: UnitOfWork, fence: dict[str, int] | None, job, *args):
    """``job(uow, *args)``, refused (LeaseLost) unless this node still holds
    each lane of ``fence`` at its epoch: a session operation's job
    (turns/lane_admin.py ``under_lease``) commits only on the lane's holder."""
    check_fence(uow, fence)
    return job(uow, *args)

"""Taking back what a user sent while their session is busy: RewindSession and
RewriteTranscript during a turn (README "RewindSession during a turn").

An adapter's ``/undo`` means "take back my last message(s)". Messages the
sidecar holds but has not run yet are the newest the user sent, so
``rewind(n)`` counts, newest first:

1. the lane's prompts that have not started (waiting in the interrupt slot, the
   follow-up slot or the FIFO, or acknowledged and about to start): each is
   dropped and ends ``superseded`` (a follow-up that absorbed a burst takes the
   burst with it: it is one turn);
2. then the running turn: cancelled as ROLLBACK does — it ends ``failed
   CANCELLED`` and nothing it wrote stays (its user messages, absorbed and
   steered ones included, and any reply);
3. then the rest of ``n`` from the transcript, as before.

An auto-resume turn (running or waiting) is no user turn: reached, it is taken
back as the others, but it counts nothing, so ``n = 1`` during one takes back
the user message of the turn it was finishing, not only the system's note.

``rewrite`` replaces the whole transcript, so it cancels the running turn the
same way (the reply it would write answers a transcript that is gone); prompts
that have not started are the user's newer messages and are kept: they run
after the rewrite, on the new transcript.

The invariant both keep: a transcript never holds a reply without its user
message. That needs the decision and the turn's writes to be ordered, so:
everything is decided synchronously on the event loop, where lanes live; from
that moment the turn's further frames, transcript messages and tool calls are
refused (``Turn.taken_back``, worker_events.py); what it had already sent is
flushed to the writer and the transcript job is queued right behind it in the
same step, so it sees (and hides) all of it; the turn's ``finish`` runs with
rollback and hides anything that still got through.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeGuard

from .. import errors as E
from ..sessions import transcripts as tx
from .lane_admin import claim, under_lease
from .lanes import Lane, Phase, Turn

if TYPE_CHECKING:
    from .manager import TurnManager

REWOUND = "the user took this turn back (RewindSession)"
REWRITTEN = "the transcript this turn answered was rewritten (RewriteTranscript)"


def _open(t: Turn | None) -> TypeGuard[Turn]:
    return t is not None and not t.closing and not t.taken_back and t.deferred_end is None


async def rewind(m: TurnManager, key: str, session_id: str, n: int) -> dict[str, Any]:
    """RewindSession(session_id, n) with the lane taken into account (see the
    module docstring). Returns the RewindSessionResponse fields: ``turns_undone``
    counts dropped prompts and the cancelled turn too; ``target_text`` is the
    first text of the oldest user turn undone. Refused before it drops or
    cancels anything while the store cannot write; in a cluster the lane's
    holder does it (lane_admin.claim, as for ``rewrite``)."""
    epoch = await claim(m, key)
    entry = await m.store.entry(key)  # before the lane is read: no await from here on
    lane = m.lanes.get(key)
    undone: list[Turn] = []  # newest first
    wrote: list[str] = []  # request ids whose rows must go with them
    advance = False
    if lane is not None:
        if entry is not None and entry.session_id == session_id:  # waiting prompts run in this incarnation
            waiting = [t for t in lane.waiting() if _open(t)]
            if _open(lane.running) and not lane.running.began:
                waiting.append(lane.running)
            waiting.sort(key=lambda t: t.created_at, reverse=True)
            for t in waiting:
                if len(undone) == n:
                    break
                advance |= _drop(m, lane, t)
                if not _resume(t):
                    undone.append(t)
                if t.start_in_flight:
                    wrote.append(t.rid)
        running = lane.running
        if len(undone) < n and _open(running) and running.began and _writes_in(running, entry) == session_id:
            _take_back(m, running, REWOUND)
            if not _resume(running):
                undone.append(running)
            wrote.append(running.rid)
    job = under_lease(m, key, epoch, tx.rewind, session_id, n - len(undone), wrote)
    if advance and lane is not None:  # after the job is queued: a turn that starts now writes after the rewind
        m.advance(lane)
    out = await job
    if not out["turns_undone"] and undone:
        out["target_text"] = undone[-1].user_texts()[0]
    out["turns_undone"] += len(undone)
    return out


async def rewrite(m: TurnManager, key: str, session_id: str, messages: list) -> None:
    """RewriteTranscript(session_id, messages) with the lane taken into account:
    the running turn of this incarnation is taken back (also one whose start is
    still in flight: its user message would land in the replaced transcript);
    prompts that have not started stay and run after."""
    epoch = await claim(m, key)
    entry = await m.store.entry(key)  # before the lane is read: no await from here on
    lane = m.lanes.get(key)
    if lane is not None:
        running = lane.running
        if _open(running) and _writes_in(running, entry) == session_id:
            if running.began:
                _take_back(m, running, REWRITTEN)
            elif running.start_in_flight:  # it ends once its accept commits, then the lane moves on
                running.want_rollback()
                m.close(running, "failed", E.CANCELLED, REWRITTEN)
    await under_lease(m, key, epoch, tx.rewrite, session_id, messages)


def _writes_in(t: Turn, entry) -> str:
    """The incarnation the lane's running turn writes in. Its own once it
    runs. While its start is on its way to the store, the lane's as it is
    now (``entry``), for the job that starts it, queued before the
    operation's, takes that: a start job (STARTING) begins the turn in the
    lane's incarnation as it then is (a switch may have moved the lane since
    the turn was accepted: its ``sid`` is that older one); an accept that
    starts it (``start_in_flight``, no ``sid`` yet) too, unless the lane is
    suspended, where it begins a new one."""
    if entry is None:
        return t.sid
    if t.phase is Phase.STARTING or (t.start_in_flight and not entry.suspended):
        return entry.session_id
    return t.sid


def _resume(t: Turn) -> bool:
    """An auto-resume turn: its note is the system's, no user turn. Taken
    back with the user turn it finishes (the one before it), it counts
    nothing itself, so the rewind goes on to that turn's user message."""
    return "resume" in t.payload


def _drop(m: TurnManager, lane: Lane, t: Turn) -> bool:
    """A prompt that has not started ends superseded and leaves its lane (one
    whose accept is in flight once that commits). Returns whether it was the
    lane's next turn (the lane must move on)."""
    t.want_rollback()  # an accept that started it wrote its user message: hide it with the end
    if lane.starting(t):
        m.supersede(t, "")  # it keeps its lane until its accept commits
        return False
    was_next = lane.detach(t)
    m.supersede(t, "")
    return was_next


def _take_back(m: TurnManager, turn: Turn, why: str) -> None:
    """The running turn is cancelled as ROLLBACK, and refuses its further writes."""
    turn.take_back(why)
    m.cancel_turn(turn, E.CANCELLED)

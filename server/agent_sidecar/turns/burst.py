"""Burst collapse (docs/semantics.md FOLLOW_UP, seed 001 §8): a newer follow-up absorbs
the pending one. The older ends ``superseded{by_request_id}``; its text runs in
the newer one's turn as its own user message before the newer text, so a burst
of three messages is one turn that sees all three, and nothing is dropped.

What a turn absorbed is a chain: each prompt points at the one it took the slot
from (``Turn.absorbed_from`` in memory, ``payload["absorbed_from"]`` in its
ledger row), and each of those keeps its own text in its own ledger row. A new
follow-up therefore writes O(1) whatever the length of the burst (a list copied
into every newer payload would grow the writes with the square of it), and the
chain is read back only by the startup restore (``recovery.startup.absorbed_texts``).

Durability: the absorbing prompt's accept job records the link and closes the
absorbed prompt's ledger row with its ``superseded`` frame in one transaction
(jobs.accept), so a crash takes back neither half alone: before that commit the
older prompt still waits in the store, after it the newer one carries its text.

Functions over a TurnManager (like placement.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .frames import build_frame
from .jobs import ABSORB, Absorbed
from .lanes import Phase, Turn

if TYPE_CHECKING:
    from .manager import TurnManager



def absorb(old: Turn, new: Turn) -> None:
    """``new`` takes the pending slot over from ``old`` and will carry its text
    (and everything ``old`` carried). ``old`` ends when ``new``'s accept commits;
    until then nothing else may end it (Phase.ABSORBED)."""
    old.absorb_into(new)
    new.payload[ABSORB] = candidates(old)


def candidates(old: Turn) -> list[str]:
    """The request ids whose ledger row the accept job may close, in order:
    ``old``, then — while a prompt's own accept has not committed yet, so it may
    still be refused — the one it absorbed, and so on back to one that committed."""
    out: list[str] = []
    t: Turn | None = old
    while t is not None:
        out.append(t.rid)
        if t.accepted:
            break
        t = t.absorbed_from
    return out


def committed(m: TurnManager, turn: Turn, result: Absorbed) -> None:
    """``turn``'s accept committed: ``result.link`` is the prompt it absorbed
    (its chain is cut past any prompt whose accept was refused: that caller
    got the error, its text is not ours), ``result.closed`` that prompt's
    ``superseded`` frame, written by the same job."""
    turn.payload.pop(ABSORB, None)
    link = result.link
    t = turn.absorbed_from
    while t is not None and t.rid != link:
        t = t.absorbed_from
    turn.absorbed_from = t
    if link is not None:
        turn.payload["absorbed_from"] = link
    if result.closed is None:
        return
    rid, seq, sid, at, frame_id = (result.closed.request_id, result.closed.seq,
                                   result.closed.session_id, result.closed.at, result.closed.cursor)
    old = m.live.get(rid)
    if old is not None:
        old.next_seq = seq + 1
        frame = build_frame(rid, turn.key, sid, seq, at, frame_id, "superseded",
                            {"by_request_id": turn.rid})
        m.bus.deliver_committed(old, frame, "superseded")
        m.live.pop(rid, None)


def reinstate(m: TurnManager, refused: Turn) -> None:
    """The accept of a follow-up that had absorbed the pending prompt was
    refused, so what it absorbed is still open in the store: the newest of those
    whose own accept committed takes the pending slot back (still carrying its
    own chain) — or, if the refused one had already been ended (its lane was
    reset or suspended meanwhile), ends the same way. Nothing to do when a newer
    follow-up absorbed the refused one: that one's accept closes the open prompt
    and carries the texts."""
    if refused.absorbed_by is not None:
        return
    prev = refused.absorbed_from
    while prev is not None and not (prev.accepted and m.live.get(prev.rid) is prev
                                    and not prev.finished):
        prev = prev.absorbed_from
    if prev is None:
        return
    if prev.phase is Phase.ABSORBED:
        prev.release()
    if refused.deferred_end is not None:
        m.supersede(prev, "")
        return
    lane = m.lane(prev.key)
    if lane.pending is None:
        lane.pending = prev
    else:
        lane.fifo.appendleft(prev)
    m.advance(lane)  # the lane may have gone idle meanwhile

"""A frame flush's items, and taking some of them out of it: a lane that
moved (the fence), turns dropped with their lane, turns a flush lost.

A flush is ``(frames, writes, thens, owners)``: each frame carries its turn,
each write its ``then`` and its owner (a turn, or a session operation's
stand-in, turns/lane_admin.py), all in publish order.

A flush the store refused for good must leave nobody waiting for it. That
is a refusal that is not the store's fault (a full disk), not the flush's
order and not a lane's fence: a row the store will not take (a constraint, a
trigger), a bug. The writer runs such a flush again lane by lane (flush.py),
so only the lanes whose items it refuses are lost (``split``; all of them,
when nothing committed). Sent again they would fail the same way, so the
bus settles them (FrameBus._lost):

* every lost write's ``then`` is called with the error, as for a write that failed
  alone (a session operation's caller gets it, a turn's start ends the turn,
  a transcript message's ack is sent);
* every turn with a lost item loses the rest of what it has queued, or in
  flight behind it, too (those thens are told as well): nothing of it may land
  after the gap, such as a reply whose user message was lost;
* its next seq goes back to its first lost frame's, so its streams stay
  gapless, and the bus's ``on_lost`` (the turn manager) ends it: its terminal
  frame, published anew, ends every stream of it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from .. import errors as E

log = logging.getLogger("agent_sidecar.frames")

TERMINAL = frozenset(("completed", "failed", "superseded"))


def fence(frames: list[tuple], owners: list) -> dict[str, int]:
    """The lease epochs a flush is written under: per lane, the oldest epoch
    among its items (a lane's items of two epochs: the older is refused first)."""
    epochs: dict[str, int] = {}
    for turn in [f[1] for f in frames] + owners:
        key, epoch = turn.key, turn.epoch
        if epoch and (key not in epochs or epoch < epochs[key]):
            epochs[key] = epoch
    return epochs


def without(gone: Callable[[Any], bool], frames, writes, thens, owners) -> tuple:
    """A flush's items minus those whose turn is ``gone``, and how many were
    dropped. An owner that waits for its write's answer (a session
    operation's, turns/lane_admin.py) is told it was dropped."""
    kept_frames = [f for f in frames if not gone(f[1])]
    keep = [i for i, turn in enumerate(owners) if not gone(turn)]
    for i in set(range(len(owners))) - set(keep):
        told = getattr(owners[i], "on_dropped", None)
        if told is not None:
            told()
    dropped = len(frames) - len(kept_frames) + len(owners) - len(keep)
    return (kept_frames, [writes[i] for i in keep], [thens[i] for i in keep], [owners[i] for i in keep],
            dropped)


def split(lanes: frozenset[str], frames: list, writes: list, thens: list, owners: list,
          results: list) -> tuple[tuple, tuple]:
    """A flush's items apart (flush.LanesRefused): ``(frames, writes, thens,
    results)`` of the lanes not in ``lanes``, and ``(frames, writes, thens,
    owners)`` of those in it, each in publish order."""
    keep = [i for i, owner in enumerate(owners) if owner.key not in lanes]
    gone = [i for i, owner in enumerate(owners) if owner.key in lanes]
    return (([f for f in frames if f[1].key not in lanes], [writes[i] for i in keep], [thens[i] for i in keep],
             [results[i] for i in keep]),
            ([f for f in frames if f[1].key in lanes], [writes[i] for i in gone], [thens[i] for i in gone],
             [owners[i] for i in gone]))


def dropped(turn) -> bool:
    return turn.dropped


def flight_no(flight: tuple) -> int:
    """A flush's number, in the order it was sent."""
    return flight[0]


def fenced_by(epochs: dict[str, int]) -> Callable[[Any], bool]:
    """Items of a turn written under a refused epoch (or an older one)."""
    return lambda turn: turn.key in epochs and turn.epoch <= epochs[turn.key]


def refusal(error: BaseException) -> E.SidecarError:
    """What the waiters of a flush lost for good are told: INTERNAL, naming
    the error's type; its text (the database's own words) is the log's."""
    return E.SidecarError(E.INTERNAL, f"the store refused to write this turn's activity"
                                      f" ({type(error).__name__}; see the sidecar log)")


class LostTurns:
    """The turns of flushes lost for good whose items may still come by: in
    the queue, or refused behind the lost flush and sent again. ``take``
    takes them out wherever the bus finds them; ``clear`` once every flush in
    flight has been answered and what was refused is queued again."""

    def __init__(self) -> None:
        self.turns: dict[int, Any] = {}  # id(turn) -> turn
        self.error: BaseException | None = None

    def __bool__(self) -> bool:
        return bool(self.turns)

    def add(self, turns: list, error: BaseException) -> None:
        self.turns.update((id(t), t) for t in turns)
        self.error = error

    def clear(self) -> None:
        self.turns.clear()

    def take(self, frames: list, writes: list, thens: list, owners: list, told: list | None,
             first_seq: dict[int, int] | None = None, ended: set[int] | None = None) -> tuple:
        """``(frames, writes, thens, owners)`` without the lost turns' items;
        the taken writes' thens go to ``told`` (None: a look only, at a flush
        still in flight). ``first_seq`` collects the lowest seq taken per
        turn, ``ended`` the turns whose terminal frame was taken."""
        lost = self.turns
        kept_frames = []
        for f in frames:
            key = id(f[1])
            if key not in lost:
                kept_frames.append(f)
                continue
            if first_seq is not None:
                seq = f[0][1]
                first_seq[key] = min(seq, first_seq.get(key, seq))
            if ended is not None and f[2] in TERMINAL:
                ended.add(key)
        keep = [i for i, owner in enumerate(owners) if id(owner) not in lost]
        if told is not None and len(keep) < len(owners):
            kept = set(keep)
            told.extend(t for i, t in enumerate(thens) if i not in kept)
        return (kept_frames, [writes[i] for i in keep], [thens[i] for i in keep], [owners[i] for i in keep])


def turns_of(frames: list, owners: list) -> list:
    """Every turn (and session operation) with an item in a flush, once each."""
    seen: dict[int, Any] = {}
    for f in frames:
        seen.setdefault(id(f[1]), f[1])
    for owner in owners:
        seen.setdefault(id(owner), owner)
    return list(seen.values())


def tell(thens: list[Callable | None], error: BaseException | None) -> None:
    """Each write's post-commit callback, with the error its write met."""
    for then in thens:
        if then is not None:
            try:
                then(error)
            except Exception:
                log.exception("post-commit callback failed")

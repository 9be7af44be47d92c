"""Activity frames: persisted first, then fanned out.

``FrameBus.publish`` numbers a frame (seq per request, gapless), queues it with
any writes that must commit with it, and flushes everything queued in one loop
iteration as ONE writer job: many turns' frames share one transaction and one
fsync. Only after the commit are frames handed to subscribers (the Prompt
stream, WatchActivity by request, by session key, by platform), so a client
never sees a frame that a crash could take back.

When the store cannot write (store/faults.py), a flush that did not commit
keeps its frames, writes and callbacks, in order: they go back to the head of
the queue and the store's retry rounds send them again until they commit.
Flushes are numbered and each names its predecessor; the writer runs a flush
only right after its predecessor (jobs.run_flush), so the ones already in
flight behind a failed flush fail too (FlushOutOfOrder) and are re-sent
behind it. Seqs stay gapless, nothing acknowledged is lost or reordered, and
nothing is delivered before it is durable. A flush the store refuses for
good (a row it will not take, a bug: no retry would cure it) is run again
session by session (flush.py): the rest commits, and of the sessions
refused nobody waits: their writes' callbacks hear the error and their
turns end failed INTERNAL, their streams still gapless (flights.py).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from ..errors import SidecarError
from ..obs import turnlog
from ..sessions import transcripts as tx
from ..store import StoreUnavailable
from ..store.records import Append, FrameRecord
from ..v1 import prompt_service_pb2 as ppb
from . import flights
from .flights import TERMINAL, LostTurns
from .flush import FN, MSG, FlushOutOfOrder, LanesRefused, run_flush, started_in
from .leasing import LeaseLost
from .stats import TurnStats
from .subscriber import StreamedFrame
from .watchers import Watchers

log = logging.getLogger("agent_sidecar.frames")


def build_frame(rid: str, key: str, sid: str, seq: int, at: float, cursor: int, kind: str,
                body: dict[str, Any]) -> ppb.ActivityFrame:
    f = ppb.ActivityFrame(request_id=rid, session_key=key, session_id=sid, seq=seq, cursor=cursor)
    f.at.seconds, f.at.nanos = divmod(int(at * 1e9), 1_000_000_000)  # FromNanoseconds, without its Python
    sub = getattr(f, kind)
    sub.SetInParent()
    for k, v in body.items():
        setattr(sub, k, v)
    return f


def frame_from_record(r: FrameRecord) -> ppb.ActivityFrame:
    """A frame as the store read it back."""
    return build_frame(r.request_id, r.session_key, r.session_id, r.seq, r.at, r.cursor, r.kind, r.body)


class FrameBus(Watchers):
    """``on_fenced(epochs, count, revoked)`` (a cluster, turns/leasing.py): every
    frame and write carries its turn's lane and lease epoch, each flush is
    fenced on them in the store, and a flush refused because lanes moved is
    sent again without those lanes' items, which are reported here (with the
    lanes among them that were deleted).

    ``on_lost(turn, error, ended)``: a flush the store refused for good took
    ``turn``'s items with it (flights.py); the turn is to end with ``error``
    (``ended``: its terminal frame was among them, and is to be published
    again). Its next seq is already back at its first lost frame's."""

    def __init__(self, store, buffer_frames: int = 10_000, buffer_bytes: int = 8 << 20,
                 stats: TurnStats | None = None,
                 on_fenced: Callable[[dict[str, int], int, frozenset[str]], None] | None = None,
                 on_lost: Callable[[Any, SidecarError, bool], None] | None = None):
        self.store = store
        self.stats = stats or TurnStats()  # frames persisted, turns ended (turns/stats.py)
        Watchers.__init__(self, buffer_frames, buffer_bytes)
        self.on_fenced, self.on_lost = on_fenced, on_lost
        self._lost_turns = LostTurns()  # of flushes lost for good, until what was refused is re-sent
        self._frames: list[tuple] = []  # (row, turn, kind, body)
        self._writes: list[tuple] = []  # (FN, (fn, args) or None) or (MSG, append_many item)
        self._thens: list[Callable | None] = []  # one per write: run after commit
        self._owners: list = []  # one per write: its turn (its lane and lease epoch)
        self._lanes: set[str] = set()  # the lanes of what is queued (a superset: see unsettled)
        self._sent_lanes: dict[int, set[str]] = {}  # flush number -> its lanes, until it commits
        self._scheduled = False
        self._flights: deque = deque()  # sent, not answered yet: (no, frames, writes, thens)
        self._undone: list[tuple] = []  # answered without committing, to send again
        self._sent_no = 0  # the number of the last flush sent
        self._committed_no = 0  # the number of the last flush that committed
        self._resync = False  # a flush failed: wait for those in flight, then send again
        store.add_retrier(self._retry)
        store.watch_faults(self._store_changed)

    # -- producing ----------------------------------------------------------------

    def publish(self, turn, kind: str, body: dict[str, Any] | None = None,
                write: tuple | None = None, then: Callable | None = None) -> None:
        """Queue a frame for ``turn``, with an optional ``write = (fn, args)``
        (a writer job, see turns/jobs.py) committed in the same transaction
        before it, and a ``then(result)`` run after the commit."""
        body = body or {}
        seq = turn.next_seq
        turn.next_seq += 1
        at = time.time()
        if write is not None or then is not None:
            self._writes.append((FN, write))
            self._thens.append(then)
            self._owners.append(turn)
        self._frames.append(((turn.rid, seq, turn.key, turn.sid, turn.platform, at, kind,
                              orjson.dumps(body) if body else None), turn, kind, body))
        self._lanes.add(turn.key)
        self._schedule()

    def write(self, turn, fn: Callable, *args: Any, then: Callable | None = None) -> None:
        """Queue a store job of ``turn`` (no frame) into the next flush,
        keeping order with frames."""
        self._writes.append((FN, (fn, args)))
        self._thens.append(then)
        self._owners.append(turn)
        self._lanes.add(turn.key)
        self._schedule()

    def append_message(self, turn, msg: dict[str, Any], then: Callable | None = None) -> None:
        """Queue a transcript message of ``turn``; consecutive ones in a flush
        become one ``append_many`` (one executemany for all turns)."""
        self._writes.append((MSG, Append(turn.sid, (tx.from_model(msg),), turn.rid,
                                         touch_lane=False)))
        self._thens.append(then)
        self._owners.append(turn)
        self._lanes.add(turn.key)
        self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def flush_now(self) -> None:
        """Hand what is queued to the store's writer now, so that a job
        submitted right after it commits after it (turns/undo.py)."""
        self._flush()

    def unsettled(self, key: str) -> bool:
        """Whether anything of lane ``key`` published here may not have
        committed yet: queued, in flight, or refused and waiting to be sent
        again. A job written to the store now, beside the bus, commits after
        what is in flight only if that commits: a flush refused (another
        lane's epoch moved, a flush before it failed) is sent again behind
        it. O(flushes in flight); after ``forget`` it may say yes for nothing."""
        return key in self._lanes or any(key in lanes for lanes in self._sent_lanes.values())

    def _flush(self) -> None:
        self._scheduled = False
        self._send(retry=False)

    def _send(self, retry: bool) -> None:
        """Everything queued, as one numbered job. After a failed flush it
        waits until every flush in flight has been answered, then sends the
        undone ones first, numbered after the last that committed. Refused by
        a failing store, it all stays queued for the next retry round."""
        if self._resync:
            if self._flights:
                return
            self._resync = False
            # In flight order, not answer order: a writer that holds a group whose
            # commit outcome is unknown refuses the groups behind it first.
            told: list = []
            for _, frames, writes, thens, owners in sorted(self._undone, key=flights.flight_no, reverse=True):
                # Not again for turns dropped meanwhile (their lane's lease was lost),
                # nor for those a lost flush took (flights.py).
                f, w, t, o = flights.without(flights.dropped, frames, writes, thens, owners)[:4]
                self._requeue(*self._lost_turns.take(f, w, t, o, told) if self._lost_turns else (f, w, t, o))
            self._undone.clear()
            flights.tell(told, self._lost_turns.error)
            self._lost_turns.clear()
            self._sent_lanes.clear()  # every flush answered; what was undone is queued again
            self._sent_no = self._committed_no
        if not self._frames and not self._writes:
            return
        frames, writes, thens, owners = self._frames, self._writes, self._thens, self._owners
        self._frames, self._writes, self._thens, self._owners = [], [], [], []
        lanes, self._lanes = self._lanes, set()
        no = self._sent_no + 1
        flight = (no, frames, writes, thens, owners)
        fence = flights.fence(frames, owners) if self.on_fenced is not None else None
        try:
            fut = self.store.write(run_flush, (no, self._sent_no), [item[0] for item in frames],
                                   writes, fence, [owner.key for owner in owners], retry=retry)
        except StoreUnavailable:
            self._requeue(frames, writes, thens, owners)
            return
        self._sent_lanes[no] = lanes
        self.store.flush()  # this loop iteration's frames are gathered: no need to wait for the next
        # Run in a context of its own: a flush carries many turns' frames, so
        # its callbacks are none of them (logs.TURN, the current span).
        fut.add_done_callback(functools.partial(self._committed, flight), context=contextvars.Context())
        self._sent_no = no
        self._flights.append(flight)

    def _retry(self) -> None:
        """The store's retry round (it is failing): re-send what is queued."""
        self._send(retry=True)

    def _store_changed(self, fault) -> None:
        if fault is None:  # writable again: what waited goes now
            self._schedule()

    def _requeue(self, frames, writes, thens, owners) -> None:
        """Put a flush that did not commit back at the head of the queue."""
        self._frames, self._writes = frames + self._frames, writes + self._writes
        self._thens, self._owners = thens + self._thens, owners + self._owners
        self._lanes.update(f[1].key for f in frames)
        self._lanes.update(t.key for t in owners)

    def forget(self, key: str) -> None:
        """Drop what is queued (not sent) for lane ``key``: this node lost its
        lease (supervision.stop_lane); the store would refuse it anyway."""
        gone = lambda turn: turn.key == key  # noqa: E731
        self._frames, self._writes, self._thens, self._owners = flights.without(
            gone, self._frames, self._writes, self._thens, self._owners)[:4]
        self._undone = [(no, *flights.without(gone, *rest)[:4]) for no, *rest in self._undone]

    def end_operations(self, err: BaseException) -> None:
        """Nothing more will commit here (supervision.end_streams): every
        session operation riding the bus (lane_admin.py), its write queued,
        refused or in flight, hears ``err`` now, not the server's bare stop."""
        for owners in [self._owners, *(f[4] for f in self._undone), *(f[4] for f in self._flights)]:
            for owner in owners:
                answered = getattr(owner, "answered", None)
                if answered is not None:
                    answered(err)

    def idle(self) -> bool:
        """Nothing published is waiting for its commit (queued or in flight)."""
        return not self._flights and not self._undone and not self._frames and not self._writes

    def _committed(self, flight: tuple, fut: asyncio.Future) -> None:
        """A flush's answer: in the order sent, except that the groups behind
        one whose commit outcome the writer must first ask for are refused
        before it is answered (store/writer/group.py)."""
        ok = not fut.cancelled() and fut.exception() is None
        value = fut.result() if ok else (fut.exception() if not fut.cancelled() else StoreUnavailable("cancelled"))
        if self._flights and self._flights[0] is flight:
            self._flights.popleft()
        elif flight in self._flights:
            self._flights.remove(flight)
        if not ok:
            self._resync = True
            if isinstance(value, LeaseLost):  # sent again without the moved lanes' items
                no, *rest = flight
                *kept, dropped = flights.without(flights.fenced_by(value.epochs), *rest)
                self._undone.append((no, *kept))
                assert self.on_fenced is not None  # frames are fenced (so LeaseLost) only with one
                self.on_fenced(value.epochs, dropped, value.revoked)
            elif isinstance(value, (StoreUnavailable, FlushOutOfOrder)):  # kept, in order
                self._undone.append(flight)
            else:  # not the store's fault: a retry would fail the same way
                assert isinstance(value, BaseException)  # not ok: the future's exception
                log.error("frame flush failed", exc_info=value)
                self._lost(flight, value)
            self._send(retry=False)
            return
        results, first = fut.result()
        if isinstance(first, LanesRefused) and first.lanes:
            self._lanes_refused(flight, results, first)
            return
        self._committed_no = flight[0]
        self._sent_lanes.pop(flight[0], None)
        _, frames, writes, thens, _ = flight
        self._settle(frames, writes, thens, results, first.cursors if isinstance(first, LanesRefused) else first)

    def _settle(self, frames: list, writes: list, thens: list, results: list, cursors: int | list[int]) -> None:
        """Committed: deliver the frames, then run the writes' thens.
        ``cursors``: the first frame's (the rest follow it), or each frame's;
        delivered in cursor order, so a watcher resuming after the last
        cursor it saw misses none."""
        moved = started_in(writes, results)  # as run_flush stored them
        numbered: Iterable[tuple[int, tuple]] = zip(itertools.count(cursors), frames) if isinstance(cursors, int) \
            else sorted(zip(cursors, frames), key=lambda item: item[0])
        for cursor, (row, turn, kind, body) in numbered:
            sid = moved.get(row[0], row[3]) if moved and kind == "started" else row[3]
            self._deliver(turn, build_frame(row[0], row[2], sid, row[1], row[5], cursor, kind, body), kind)
        for then, result in zip(thens, results):
            if then is not None:
                try:
                    then(result)
                except Exception:
                    log.exception("post-commit callback failed")

    def _lanes_refused(self, flight: tuple, results: list, refused: LanesRefused) -> None:
        """A flush whose items of some lanes the store refused for good, and
        committed the rest (flush.py): the rest is delivered, the refused
        lanes' part is lost (``_lost``), and the flushes sent behind it, which
        the writer refuses, are sent again without the lost turns' items."""
        no, frames, writes, thens, owners = flight
        (frames, writes, thens, results), gone = flights.split(refused.lanes, frames, writes, thens, owners, results)
        self._resync = True
        self._settle(frames, writes, thens, results, refused.cursors)
        self._lost((no, *gone), refused.error)
        self._send(retry=False)

    def _lost(self, flight: tuple, error: BaseException) -> None:
        """A flush the store refused for good (flights.py): it, and whatever
        else its turns have queued or refused behind it, is taken out; each
        turn's next seq goes back to its first frame taken; ``on_lost`` ends
        the turns (first, so an end their thens cause comes with the
        rollback it sets), then every write taken hears the error."""
        _, frames, writes, thens, owners = flight
        err = flights.refusal(error)
        lost = self._lost_turns
        lost.add(flights.turns_of(frames, owners), err)
        told: list = []
        first_seq: dict[int, int] = {}
        ended: set[int] = set()
        lost.take(frames, writes, thens, owners, told, first_seq, ended)
        self._frames, self._writes, self._thens, self._owners = lost.take(
            self._frames, self._writes, self._thens, self._owners, told, first_seq, ended)
        self._undone = [(no, *lost.take(f, w, t, o, told, first_seq, ended)) for no, f, w, t, o in self._undone]
        for _, f, w, t, o in self._flights:  # refused behind this one, they are taken when they come back
            lost.take(f, w, t, o, None, first_seq, ended)
        for key, turn in lost.turns.items():
            if key in first_seq:
                turn.next_seq = min(turn.next_seq, first_seq[key])
        if self.on_lost is not None:
            for key, turn in list(lost.turns.items()):
                self.on_lost(turn, err, key in ended)
        flights.tell(told, err)

    def _deliver(self, turn, frame, kind: str) -> None:
        """Hand a committed frame to the turn's streams and to the watchers of
        its key and platform; a subscriber that falls behind its bound leaves
        its fan-out here and now (see Subscriber)."""
        item = StreamedFrame(frame)
        stats = self.stats
        stats.frames += 1
        stats.frame_bytes += item.size
        subs = turn.subscribers
        if subs:
            for sub in tuple(subs):
                if not sub.push(item):
                    subs.remove(sub)
        if self.feeds_watchers:
            self.to_watchers(item, turn.key, turn.platform)
        if kind in TERMINAL:
            turn.ended(frame)
            stats.turn_ended(turn, kind, frame.failed.reason if kind == "failed" else "")
            turnlog.finished(turn, frame)

    def deliver_committed(self, turn, frame, kind: str) -> None:
        """For frames written by a job of their own (``accepted``)."""
        self._deliver(turn, frame, kind)

"""PromptService over gRPC: Prompt, WatchActivity, Cancel, GetQueue.

A Prompt stream is the turn's frames as they commit; a turn that fails sends
its ``failed`` frame and then ends the RPC with the matching status and
ErrorInfo, so clients can both show the frame and raise a typed error.
Keepalive frames (not persisted, repeating the last seq) keep a long silent
turn's stream from looking dead.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable

from .. import errors as E
from ..config import Config
from ..logs import bind_turn
from ..sessions.keys import split_session_key
from ..store import Store
from ..store.records import LedgerEntry
from ..turns import jobs
from ..turns.frames import TERMINAL, frame_from_record
from ..turns.subscriber import FellBehind, StreamedFrame, Subscriber, TooSlow
from ..v1 import prompt_service_pb2 as pb
from ..v1 import prompt_service_pb2_grpc as pb_grpc
from . import convert as cv
from .prompt_request import checked_prompt, turn_text
from .rpc import streaming, unary

# Rows per read when persisted frames are replayed (a request's, or a key's or
# platform's after a cursor): what a replay holds while its client does not
# read (the live part is bounded by the Subscriber).
REPLAY_PAGE = 256
# A queued prompt's encoded size besides its text and request id, at most:
# the tags and lengths, the delivery, the timestamp, text_truncated, text_bytes.
QUEUED_FIELDS_BYTES = 64


def _ends_stream(frame) -> bool:
    """After a turn's terminal frame its stream ends: OK for completed and
    superseded, with the failure's status (and ErrorInfo) for failed."""
    kind = frame.WhichOneof("event")
    if kind == "failed":
        raise E.SidecarError(frame.failed.reason, frame.failed.message)
    return kind in TERMINAL


def _too_slow(**resume: str | int) -> E.SidecarError:
    """A stream whose client stopped reading, dropped by its Subscriber:
    nothing is lost (the frames are persisted), so the error says exactly
    where to pick up: the WatchActivity request to resume with, in its
    message and as its ErrorInfo's metadata (``request_id`` and
    ``after_seq``, or ``session_key``/``platform`` and ``after_cursor``)."""
    call = ", ".join(f"{k}={v!r}" for k, v in resume.items())
    return E.SidecarError(
        E.STREAM_TOO_SLOW,
        "the stream's client stopped reading while more than limits.stream_buffer_frames frames or"
        f" limits.stream_buffer_bytes bytes waited for it, and the stream was ended; resume with"
        f" WatchActivity({call})", retry_after_s=0.1, metadata={k: str(v) for k, v in resume.items()})


# A followed request's (session key, session id) while it goes on; None once it is over.
StillOpen = Callable[[], Awaitable[tuple[str, str] | None]]


def _live(turn) -> StillOpen:
    """A turn this node runs: open until its terminal frame ends the stream
    (the keepalive carries its session id as it is then: a switch may move it)."""
    async def ids() -> tuple[str, str] | None:
        return turn.key, turn.sid
    return ids


class PromptService(pb_grpc.PromptServiceServicer):
    def __init__(self, cfg: Config, store: Store, auth, turns, forward=None, tail=None):
        self.cfg, self.store, self.auth, self.turns = cfg, store, auth, turns
        self.forward = forward  # a cluster: calls for lanes run elsewhere (cluster/forward.py)
        self.tail = tail  # a cluster: every node's frames (cluster/tail.py FrameTail)

    # -- Prompt ------------------------------------------------------------------------

    @streaming
    async def Prompt(self, request, context, principal):
        rid, key, platform, profile, source = checked_prompt(request, principal, self.cfg)
        bind_turn(rid, key)  # this call's task: its log lines are the turn's
        prof = self.cfg.profile(profile)
        assert prof is not None  # checked_prompt refused an unknown profile
        timeout, call_deadline = prof.timeout_s or self.cfg.gateway_timeout, 0.0
        remaining = context.time_remaining()
        if remaining is not None and math.isfinite(remaining):
            timeout = min(timeout, max(remaining, 0.001))
            call_deadline = time.time() + max(remaining, 0.001)  # an instant: waiting spends it
        payload = {"profile": profile,
                   "source": source.to_dict() if source else None,
                   "attachments": [{"name": a.name, "mime_type": a.mime_type, "url": a.url,
                                    "size": len(a.data)} for a in request.attachments]}
        placed = await self.turns.submit(rid=rid, key=key, platform=platform, profile=profile,
                                         text=turn_text(request, source, self.cfg),
                                         delivery=request.delivery, source=source, timeout_s=timeout,
                                         payload=payload, call_deadline=call_deadline)
        if placed is None:  # a known request id: its original turn's frames
            await self._authorize_request(rid, principal)
            async for item in self._replay_request(rid, 0, principal):
                yield item.wire
            return
        (turn, sub), last, behind = placed, 0, False
        try:
            async for item in self._follow(sub, rid, 0, _live(turn)):
                last = item.frame.seq
                yield item.wire
        except FellBehind:  # a burst outran a reading client: on from the store
            behind = True
        finally:
            if sub in turn.subscribers:
                turn.subscribers.remove(sub)
        if behind:
            async for item in self._replay_request(rid, last, principal):
                yield item.wire

    async def _authorize_request(self, rid: str, principal) -> LedgerEntry | None:
        """A request's frames are readable only with a credential for its
        platform. Returns its ledger entry when it was read (the request does
        not run on this node)."""
        live = self.turns.live.get(rid)
        if live is not None:
            principal.require_platform(live.platform)
            return None
        entry = await self.store.ledger(rid)
        if entry is not None:
            principal.require_platform(entry.platform)
        return entry

    async def _follow(self, sub: Subscriber, rid: str, last_seq: int, still_open: StillOpen):
        """Live frames of one request, skipping what was already sent, ending
        after the terminal frame (raising its reason for a failed turn; a
        client that stopped reading gets STREAM_TOO_SLOW, saying where to
        resume; FellBehind passes to the caller, which goes on from the store).
        ``still_open()`` is asked before the first wait and at every
        ``keepalive_s`` without a frame: the request's (session key, session
        id), which the keepalive frame carries, while it goes on; None once it
        is over, and the stream ends with what the store has after ``last_seq``."""
        ids = await still_open()
        try:
            while ids is not None:
                try:
                    item = await sub.get(self.cfg.keepalive_s)
                except TooSlow:
                    raise _too_slow(request_id=rid, after_seq=last_seq) from None
                if item is None:
                    ids = await still_open()
                    if ids is not None:
                        yield StreamedFrame(self._keepalive(rid, *ids, last_seq))
                    continue
                if isinstance(item, BaseException):  # the turn was refused before its accept
                    raise item
                if item.frame.seq <= last_seq:
                    continue
                last_seq = item.frame.seq
                yield item
                if _ends_stream(item.frame):
                    return
        finally:
            sub.close()  # no more waits on it
        async for item in self._stored(rid, last_seq):
            yield item
            if _ends_stream(item.frame):
                return

    async def _stored(self, rid: str, after_seq: int):
        """A request's persisted frames after ``after_seq``, a page at a time."""
        records = await self.store.request_frames(rid, after_seq, limit=REPLAY_PAGE)
        while records:
            for record in records:
                yield StreamedFrame(frame_from_record(record))
            if len(records) < REPLAY_PAGE:
                return
            last = records[-1]
            records = await self.store.request_frames(rid, last.seq, after_cursor=last.cursor, limit=REPLAY_PAGE)

    def _in_ledger(self, rid: str) -> StillOpen:
        """[cluster] A request this node does not run, followed through the
        cluster tail: open while the ledger has it open (another node runs or
        queues it). Once the ledger has it closed (read after the frames: its
        terminal frame has committed with that) or deleted, the store has the
        rest. Read again at each keepalive, so a row deleted meanwhile ends
        the stream too."""
        async def ids() -> tuple[str, str] | None:
            entry = await self.store.ledger(rid)
            return (entry.session_key, entry.session_id) if entry is not None and entry.open else None
        return ids

    @staticmethod
    def _keepalive(rid, key, sid, seq, cursor=0):
        f = pb.ActivityFrame(request_id=rid, session_key=key, session_id=sid, seq=seq, cursor=cursor)
        f.at.GetCurrentTime()
        f.keepalive.SetInParent()
        return f

    async def _replay_request(self, rid: str, after_seq: int, principal):
        """Persisted frames after ``after_seq``, then live ones while the turn
        goes on; when the live ones outrun a reading client (FellBehind), or
        the live turn was a twin of an earlier run's request, the next pass
        reads on from the store. Each frame is checked against ``principal``:
        a request unknown when it was authorized may be another platform's by
        the time its frames are read (PERMISSION_DENIED then)."""
        last, first = after_seq, True
        while True:
            turn = self.turns.live.get(rid)
            sub: Subscriber | None = None
            if turn is not None:
                sub = self.turns.bus.subscriber()
                turn.subscribers.append(sub)  # before reading the store: no gap
            elif self.tail is not None:  # [cluster] maybe running on another node: the tail has it
                sub = self.tail.follow_request(rid)  # before reading the store: no gap
            try:
                async for item in self._stored(rid, last):
                    last = item.frame.seq
                    principal.require_platform(split_session_key(item.frame.session_key)[1])
                    yield item
                    if _ends_stream(item.frame):
                        return
                if first and last == after_seq and turn is None and await self.store.ledger(rid) is None:
                    raise E.SidecarError(E.REQUEST_NOT_FOUND, f"no such request: {E.excerpt(rid)}")
                first = False
                if sub is None:
                    return
                still_open = _live(turn) if turn is not None else self._in_ledger(rid)
                async for item in self._follow(sub, rid, last, still_open):
                    last = item.frame.seq
                    principal.require_platform(split_session_key(item.frame.session_key)[1])
                    yield item
                return
            except (FellBehind, jobs.DuplicateRequest):
                continue
            finally:
                if turn is not None and sub in turn.subscribers:
                    turn.subscribers.remove(sub)
                elif turn is None and sub is not None:
                    self.tail.unfollow_request(rid, sub)

    # -- WatchActivity -------------------------------------------------------------------

    @streaming
    async def WatchActivity(self, request, context, principal):
        given = [f for f in ("request_id", "session_key", "platform") if getattr(request, f)]
        if len(given) != 1:
            raise E.invalid("request_id", "give exactly one of request_id, session_key and platform")
        _check_resume_point(request)
        if request.request_id:
            await self._authorize_request(request.request_id, principal)
            # While the startup restore runs, a request cut off by the crash is
            # neither live nor ended in the store yet: the restore ends it (or
            # queues it again) first, else the stream would end with no terminal frame.
            await self.turns.ready.wait()
            async for item in self._replay_request(request.request_id, request.after_seq, principal):
                yield item.wire
            return
        if request.session_key:
            key = cv.scoped_key(request.session_key, principal, self.cfg)
            index, name, column = self.turns.bus.by_key, key, "session_key"
            where = {"session_key": key}
        else:
            platform = cv.platform_filter(request.platform)
            principal.require_platform(platform)
            index, name, column = self.turns.bus.by_platform, platform, "platform"
            where = {"platform": platform}
        async for data in self._watch(index, name, column, where, request.after_cursor):
            yield data

    async def _watch(self, index, name: str, column: str, where: dict[str, str], after_cursor: int):
        """A key's or platform's frames (encoded) after ``after_cursor`` (0:
        from now on): the persisted ones a page at a time, then live ones. A
        pass per subscriber: when a burst outruns a reading client
        (FellBehind), the next pass reads on from the store. Keepalives carry
        the cursor the stream has reached; a live one's first, sent at once,
        the head it starts after, so a client dropped before any frame
        resumes from there instead of "live" again, missing nothing."""
        last, from_store = after_cursor, after_cursor > 0
        while True:
            sub = self.turns.bus.watch(index, name)  # before reading the store: no gap
            try:
                if not last:  # live: from the newest frame handed to watchers, nothing in between
                    last = self.turns.bus.watch_head
                    yield StreamedFrame(self._keepalive("", "", "", 0, last)).wire
                while from_store:  # the persisted frames after the cursor, a page at a time
                    records = await self.store.frames_after(last, limit=REPLAY_PAGE, **where)
                    for record in records:
                        last = record.cursor
                        yield StreamedFrame(frame_from_record(record)).wire
                    from_store = len(records) == REPLAY_PAGE
                while True:
                    try:
                        item = await sub.get(self.cfg.keepalive_s)
                    except (TooSlow, FellBehind) as e:  # after the last frame sent, or before the first due
                        last = last or max(sub.first_cursor - 1, 0)
                        if isinstance(e, TooSlow):
                            raise _too_slow(**{column: name, "after_cursor": last}) from None
                        from_store = True
                        break
                    if item is None:
                        yield StreamedFrame(self._keepalive("", "", "", 0, last)).wire
                        continue
                    if isinstance(item, BaseException):  # only a turn's own stream is sent one
                        raise item
                    if item.frame.cursor <= last:
                        continue
                    last = item.frame.cursor
                    yield item.wire
            finally:
                self.turns.bus.unwatch(index, name, sub)
                sub.close()

    # -- Cancel, GetQueue ------------------------------------------------------------------

    async def _route(self, key: str) -> None:
        """A cluster: LaneElsewhere (the call is forwarded) when another node runs the lane."""
        if self.turns.leases is not None:
            await self.turns.leases.route(key)

    @unary
    async def Cancel(self, request, context, principal):
        if bool(request.session_key) == bool(request.request_id):
            raise E.invalid("session_key", "give exactly one of session_key and request_id")
        await self.turns.ready.wait()  # the lanes the startup restore brings back
        if request.request_id:
            # Checked whether or not it runs: the answer must not tell another
            # platform's credential that a request of this one is in flight.
            entry = await self._authorize_request(request.request_id, principal)
            turn = self.turns.live.get(request.request_id)
            if turn is None and entry is not None and entry.open:
                await self._route(entry.session_key)
        else:
            key = cv.scoped_key(request.session_key, principal, self.cfg)
            lane = self.turns.lanes.get(key)
            if lane is None:
                await self._route(key)
            turn = lane.running if lane else None
        if turn is None:
            return pb.CancelResponse(cancelled=False)
        principal.require_platform(turn.platform)
        if turn.host is not None:  # a steer is part of the turn that took its text: that one stops
            turn = turn.host
        return pb.CancelResponse(cancelled=self.turns.cancel_turn(turn, E.CANCELLED))

    @unary
    async def GetQueue(self, request, context, principal):
        key = cv.scoped_key(request.session_key, principal, self.cfg)
        await self.turns.ready.wait()  # the queues the startup restore brings back
        lane = self.turns.lanes.get(key)
        if lane is None:
            await self._route(key)
            return pb.GetQueueResponse()

        waiting = [lane.pending] if lane.pending else []
        waiting += [*lane.interrupt, *lane.fifo]
        texts = [t.text.encode() for t in waiting]
        rest = sum(len(t.rid.encode()) + QUEUED_FIELDS_BYTES for t in waiting)
        share = cv.equal_share([len(b) for b in texts], cv.ANSWER_BYTES - rest)
        out = [_queued(t, data, share) for t, data in zip(waiting, texts)]
        pending = out.pop(0) if lane.pending else None
        return pb.GetQueueResponse(pending=pending, queued=out)


def _check_resume_point(request) -> None:
    """A WatchActivity's resume point is ``after_seq`` for a request, else
    ``after_cursor``; the other one, or a negative one, is refused naming it
    rather than ignored: a replay silently reduced to live frames loses them."""
    by_request = bool(request.request_id)
    for name, applies, where in (("after_seq", by_request, "request_id"),
                                 ("after_cursor", not by_request, "session_key or platform")):
        value = getattr(request, name)
        if value < 0:
            raise E.invalid(name, "must not be negative")
        if value and not applies:
            raise E.invalid(name, f"applies only with {where}")


def _queued(t, data: bytes, share: int | None) -> pb.QueuedPrompt:
    """``t``'s entry of GetQueue, its text (``data``, UTF-8) cut to ``share``
    bytes if longer, at a character boundary."""
    cut = share is not None and len(data) > share
    return pb.QueuedPrompt(request_id=t.rid, text=data[:share].decode(errors="ignore") if cut else t.text,
                           delivery=t.delivery, enqueued_at=cv.ts(t.created_at), text_truncated=cut,
                           text_bytes=len(data))

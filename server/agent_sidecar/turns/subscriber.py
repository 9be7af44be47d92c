"""The stream's side of the frame bus (turns/frames.py): what a committed
frame is on its way out (``StreamedFrame``, encoded once for every stream
that sends it) and the bounded queue of one stream (``Subscriber``: a
Prompt call, a WatchActivity), which lets go of a reader that falls behind.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

from ..v1 import prompt_service_pb2 as ppb

# A stream whose previous write to its client took longer than this when its
# queue overflowed has a client that stopped reading (gRPC's write waits for
# HTTP/2 flow control); a quicker one met a burst. Well above what a reading
# client's write takes on a loaded sidecar, well below a hung adapter's wait.
STALL_S = 1.0
# The event loop's timers ring to the millisecond: an alarm that rings this
# close to a wait's end ends it rather than ringing again for the rest.
ALARM_SLACK_S = 0.002


class TooSlow(Exception):
    """Raised by ``Subscriber.get`` once the subscriber was dropped while its
    client had stopped reading: the stream ends, saying where to resume."""


class FellBehind(Exception):
    """Raised by ``Subscriber.get`` once the subscriber was dropped while its
    client kept reading (one commit brought more frames than the bound): the
    stream goes on from the store, then with a new subscriber."""


# PromptResponse and WatchActivityResponse are both ``{ActivityFrame frame = 1}``:
# field 1, length-delimited.
_FRAME_FIELD = b"\x0a"


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class StreamedFrame:
    """A frame as every stream that carries it sends it: ``frame`` (what
    the streams' handlers read: its seq, cursor, kind), ``wire`` (the
    encoded PromptResponse or WatchActivityResponse holding it; the two are
    the same bytes) and ``size`` (the frame's encoded size, what it counts
    against a subscriber's byte bound and in the persisted-bytes metric).

    Encoded once, here: a committed frame goes to its turn's stream and to
    every watcher of its key and platform, and each of them sends ``wire``
    as it is (api/boundary.py passes bytes through gRPC's serializer), so
    no stream sizes, copies or encodes the frame again."""

    __slots__ = ("frame", "wire", "size")

    def __init__(self, frame: ppb.ActivityFrame):
        data = frame.SerializeToString()
        self.frame, self.size = frame, len(data)
        self.wire = _FRAME_FIELD + _varint(len(data)) + data


class Subscriber:
    """A bounded frame queue for one stream (a Prompt call, a WatchActivity);
    ``get`` returns None on keepalive timeout.

    Bounded because the stream's reader sets its pace: gRPC's write to a client
    that stopped reading waits for HTTP/2 flow control (it blocks only that
    stream's handler, never the loop), and every frame published meanwhile
    would wait here, without end, for every such stream. With more than
    ``max_frames`` frames or ``max_bytes`` bytes waiting (a frame that finds the
    queue empty is always taken, however large), the subscriber is dropped:
    its queue is freed at once, and ``push`` answers False from then on so the
    bus takes it out of its fan-out (a dropped stream costs the bus nothing).
    The stream's next ``get`` says why it fell behind, from how long the
    write it was busy with when dropped took (the time between its last two
    ``get``s): longer than ``STALL_S``, its client stopped reading, and
    ``TooSlow`` ends the stream telling the client where to resume; shorter
    (a fast reader that one large commit outran), or dropped while it waited
    in ``get`` (a reader idle before a burst: a wait is not a write),
    ``FellBehind``, and the stream reads on from the store. Nothing is lost
    either way: every frame is persisted before it is pushed.

    The keepalive wait (``get``'s ``timeout``) costs no timer per frame: a
    stream that streams waits a few milliseconds at a time, and a timer made
    and cancelled for each of those waits was a good part of what the loop
    spent per frame. One alarm per subscriber is armed when a wait finds none,
    and it is looked at only when it rings: a wait that began after it was set
    sets it again for that wait's own end. So a wait still ends ``timeout``
    after it began, and a subscriber makes at most one timer per ``timeout``.
    A stream done with its subscriber ``close``s it, which cancels the alarm."""

    __slots__ = ("buf", "waiter", "held", "max_frames", "max_bytes", "dropped", "dropped_writing",
                 "first_cursor", "got_at", "wait_since", "alarm")

    def __init__(self, max_frames: int = 10_000, max_bytes: int = 8 << 20):
        self.buf: deque = deque()
        self.waiter: asyncio.Future | None = None
        self.held = 0  # bytes of the frames in ``buf``
        self.max_frames, self.max_bytes = max_frames, max_bytes
        self.dropped = False
        self.dropped_writing = False  # dropped while the stream was writing (not waiting in ``get``)
        self.first_cursor = 0  # cursor of the first frame pushed (0: none yet)
        self.got_at = 0.0  # monotonic time the last ``get`` returned (0: none yet)
        self.wait_since = 0.0  # loop time the current wait began
        self.alarm: asyncio.TimerHandle | None = None  # rings at the earliest end of a wait

    def push(self, item: StreamedFrame | BaseException) -> bool:
        """Queue a frame (or the error that ends the stream: a turn refused
        before its accept); False once dropped."""
        if self.dropped:
            return False
        size = item.size if type(item) is StreamedFrame else 0
        buf = self.buf
        if buf:
            if len(buf) >= self.max_frames or self.held + size > self.max_bytes:
                self.dropped = True
                self.dropped_writing = self.waiter is None
                buf.clear()
                self.held = 0
                _wake(self.waiter)
                return False
        elif not self.first_cursor and type(item) is StreamedFrame:
            self.first_cursor = item.frame.cursor
        buf.append(item)
        self.held += size
        w = self.waiter  # None while the stream's handler is busy writing
        if w is not None and not w.done():
            w.set_result(None)
        return True

    async def get(self, timeout: float) -> StreamedFrame | BaseException | None:
        if not self.buf and not self.dropped:
            loop = asyncio.get_running_loop()
            self.waiter = waiter = loop.create_future()
            self.wait_since = now = loop.time()
            if self.alarm is None:
                self.alarm = loop.call_at(now + timeout, self._ring, timeout)
            try:
                await waiter
            finally:
                self.waiter = None
        if self.dropped:
            slow = self.dropped_writing and self.got_at and time.monotonic() - self.got_at > STALL_S
            raise TooSlow() if slow else FellBehind()
        self.got_at = time.monotonic()  # the stream now writes what it got (or a keepalive)
        if not self.buf:
            return None
        item = self.buf.popleft()
        if type(item) is StreamedFrame:
            self.held -= item.size
        return item

    def close(self) -> None:
        """The stream waits on this subscriber no more: its alarm goes now
        rather than when it rings (until then the loop's timers would hold
        the subscriber, up to ``timeout`` after its last wait began)."""
        if self.alarm is not None:
            self.alarm.cancel()
            self.alarm = None

    def _ring(self, timeout: float) -> None:
        """The alarm: ends the wait under way if it began ``timeout`` ago
        (``get`` returns None, a keepalive), else rings again at its end. With
        no wait under way (the stream is writing) the next wait arms it."""
        self.alarm = None
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        loop = asyncio.get_running_loop()
        end = self.wait_since + timeout
        if loop.time() >= end - ALARM_SLACK_S:
            waiter.set_result(None)
        else:
            self.alarm = loop.call_at(end, self._ring, timeout)


def _wake(fut: asyncio.Future | None) -> None:
    if fut is not None and not fut.done():
        fut.set_result(None)

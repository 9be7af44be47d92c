"""FrameStream: an async iterator of ActivityFrames that survives dropped connections.

Why a class and not a bare async generator: callers need a handle on the
stream while it runs (its ``request_id``, how many times it resumed, a way to
close it deterministically with ``async with``), and the conformance suite
needs ``drop()`` to cut the transport mid-turn exactly as a network failure
would.

The loop: read frames from the current call, pass each through the filter
(see _frames), yield what it admits. When the call breaks without a terminal
frame -- a transport error (UNAVAILABLE, INTERNAL, UNKNOWN, or CANCELLED
without a sidecar ErrorInfo), no frame at all (keepalives included) for
``idle_timeout`` seconds (a half-open connection), a seq gap, ``drop()``, or
a sidecar error whose reason says the same call may be made again
(RETRY_SAME_REQUEST_REASONS: after its RetryInfo delay; a session or platform
feed, which the sidecar also ends STREAM_TOO_SLOW when its reader stalls,
reopens from its cursor the same way) -- wait for the
channel to be ready again and reopen with ``open_resume`` (the Prompt again
while no frame was seen, else ``WatchActivity(request_id, after_seq=last
seen)``), for up to ``resume_timeout`` without progress. A turn's deadline
(``prompt(timeout=)``) bounds those waits too: once it has passed the stream
raises DeadlineExceeded, whatever is left of ``resume_timeout``. Any other
error that carries the sidecar's ErrorInfo is a real answer and is raised as
the typed error. After a ``failed`` frame is yielded, the next step raises
the typed error, taken from the RPC status when it arrives, else from the
frame.

A request's stream that ends OK is final: the sidecar ends one so only once
the turn is over. Without its terminal frame that means either a watch the
caller opened past the turn's last frame (it ends cleanly, no frame) or a
turn whose remaining frames are gone (TurnFramesGone). A session or platform
feed that ends is reopened.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from agent_sidecar_client import errors
from agent_sidecar_client._frames import CursorFilter, SeqFilter, SequenceGap, frame_kind

# Codes that, without a sidecar ErrorInfo, mean "the transport broke".
RESUMABLE_CODES = frozenset({
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.CANCELLED,
})

OpenCall = Callable[[], Any]  # returns a grpc.aio.UnaryStreamCall


class FrameStream:
    """Async iterator over one request's (or one watch's) frames.

    Use as ``async for frame in stream`` or ``async with stream: ...``.
    ``raise_on_failed`` is True for a single request (Prompt, watch by
    request_id); a session/platform watch just yields other turns' failures.
    """

    def __init__(
        self,
        channel: grpc.aio.Channel,
        open_first: OpenCall,
        open_resume: OpenCall,
        frame_filter: SeqFilter | CursorFilter,
        *,
        request_id: str = "",
        raise_on_failed: bool = True,
        resume_timeout: float = 30.0,
        deadline: Any = None,
        idle_timeout: float | None = None,
        own_watch: bool = False,
        on_idle: Callable[[Any], Any] | None = None,
        retry_reasons: frozenset[str] = errors.RETRY_SAME_REQUEST_REASONS,
        closed: Callable[[], bool] = lambda: False,
    ) -> None:
        self.request_id = request_id
        self.resumes = 0
        self._channel = channel
        self._open_first = open_first
        self._open_resume = open_resume
        self._filter = frame_filter
        self._raise_on_failed = raise_on_failed
        self._resume_timeout = resume_timeout
        self._deadline = deadline  # the turn's Deadline (_args.py), or None
        self._idle_timeout = idle_timeout  # seconds without any frame before a resume, or None
        self._own_watch = own_watch  # a watch by request id the caller opened (not a Prompt)
        # Called with the channel of a call the idle watchdog cut; returns the channel
        # to go on with (the client replaces one whose connection stopped answering).
        self._on_idle = on_idle
        self._retry_reasons = retry_reasons  # the refusals carried on from (a feed: from its cursor)
        # Whether the client was closed: its close() cancels the call, which is then no
        # drop to resume but the end, errors.client_closed() (nor a cancellation of the task).
        self._client_closed = closed
        self._call: Any = None
        self._drop_requested = False
        self._reading = False  # a __anext__ is in progress (the generator cannot be closed then)
        self._gen = self._run()
        self._closed = False

    @property
    def closed(self) -> bool:
        """True once ``aclose()`` was called (or the ``async with`` block left)."""
        return self._closed

    @property
    def last_seq(self) -> int:
        """The resume point: last seq (request streams) or cursor (watches)."""
        return self._filter.resume_point

    def __aiter__(self) -> FrameStream:
        return self

    async def __anext__(self) -> Any:
        self._reading = True
        try:
            return await self._gen.__anext__()
        finally:
            self._reading = False

    async def __aenter__(self) -> FrameStream:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop reading and cancel the underlying RPC. From another task while
        the stream is being read (a generator being run cannot be closed): the
        RPC is cancelled, and the reader's loop ends with no error and no resume."""
        if not self._closed:
            self._closed = True
            if self._call is not None:
                self._call.cancel()
            if not self._reading:
                await self._gen.aclose()

    def drop(self) -> None:
        """Cut the current RPC as a network failure would; iteration resumes.

        For tests and the conformance suite (``cut_after_frames``).
        """
        if self._call is not None and not self._call.done():
            self._drop_requested = True
            self._call.cancel()

    async def collect(self) -> list[Any]:
        """Read to the end and return every frame (raises like iteration)."""
        frames = []
        async with self:
            async for frame in self:
                frames.append(frame)
        return frames

    async def _run(self) -> AsyncGenerator[Any, None]:
        """The frames of the first call, then of each resume (the module's
        docstring says when a call is resumed and when the stream ends)."""
        if self._client_closed():
            raise errors.client_closed()
        call = self._open_first()
        outage = _Outage()
        idle = _IdleWatchdog(self._idle_timeout)
        while True:
            idle.fired = False
            self._call = call
            end = _CallEnd()
            try:
                while True:
                    # The idle watchdog cancels the call itself: a call on a stalled
                    # connection does not always give up an await that is cancelled.
                    idle.arm(call)
                    response = await call.read()
                    idle.disarm()  # the time the caller takes over a frame is not the connection's
                    if response is grpc.aio.EOF:
                        end.clean = True
                        break
                    frame = response.frame
                    try:
                        admitted = self._filter.admit(frame)
                    except SequenceGap as exc:
                        end.cut, end.problem = True, str(exc)
                        break
                    if not admitted:
                        continue
                    outage.progress()
                    yield frame
                    if self._filter.done:
                        await self._after_terminal(call, frame)
                        return
            except asyncio.CancelledError as exc:
                if self._cancel_ends_stream(exc, idle):
                    return
                end.problem = idle.problem if idle.fired else "stream dropped"
            except grpc.RpcError as exc:
                if self._closed:
                    return
                self._take_broken_call(exc, idle, end)
            finally:
                idle.disarm()
                if self._closed or end.cut:
                    call.cancel()
            if self._closed:
                return
            if idle.fired and self._on_idle is not None:
                self._channel = self._on_idle(self._channel)
            if end.clean and not self._drop_requested and not idle.fired and self._over_without_end(outage):
                return
            self._drop_requested = False
            await self._wait_to_resume(outage, end)
            if self._client_closed():
                raise errors.client_closed()
            if self.closed:  # aclose() while it waited to resume
                return
            self.resumes += 1
            call = self._open_resume()

    def _cancel_ends_stream(self, exc: asyncio.CancelledError, idle: _IdleWatchdog) -> bool:
        """Whether the call's cancellation ends the stream quietly: True when
        aclose() from another task cancelled it. It is resumed (False) when
        drop() or the idle watchdog cut it; else it is raised, as
        errors.client_closed() when the client's close() cancelled it, as
        itself when the task is cancelled."""
        if self._closed and not task_cancelling():
            return True
        if self._client_closed() and not task_cancelling():
            raise errors.client_closed() from None
        if not (self._drop_requested or idle.fired) or task_cancelling():
            raise exc
        return False

    def _take_broken_call(self, exc: grpc.RpcError, idle: _IdleWatchdog, end: _CallEnd) -> None:
        """Note in ``end`` why the call broke when it is to be resumed (the
        idle watchdog cut it; a transport code without the sidecar's
        ErrorInfo; a refusal whose reason says the same call may be made
        again, after its RetryInfo delay); else raise: the client was
        closed, or the sidecar's typed error."""
        code = exc.code() if hasattr(exc, "code") else None
        if self._client_closed():
            raise errors.client_closed() from exc
        if idle.fired:
            end.problem = idle.problem
        elif errors.has_error_info(exc):
            error = errors.from_rpc_error(exc)
            if error.reason not in self._retry_reasons:
                raise error from exc
            # Nothing was lost: carry on with the same request id, or a feed
            # from its cursor, after the sidecar's delay (STREAM_TOO_SLOW: from
            # the last frame seen, never past the after_seq or after_cursor its
            # message names).
            end.last_error, end.retry_after, end.problem = error, error.retry_delay or 0.0, str(error)
        elif code not in RESUMABLE_CODES:
            raise errors.from_rpc_error(exc) from exc
        else:
            end.problem = f"{code.name}: {exc.details() if hasattr(exc, 'details') else exc}"

    def _over_without_end(self, outage: _Outage) -> bool:
        """A call that ended OK, not cut by this side: a feed's is reopened
        (False). A request's stream the sidecar ends OK only once the turn is
        over: True for the caller's own watch that saw nothing (nothing after
        its after_seq), else TurnFramesGone (the rest was deleted)."""
        if not isinstance(self._filter, SeqFilter):
            return False
        if self._own_watch and not outage.seen_any:
            return True
        raise errors.TurnFramesGone(
            None, None,
            f"the turn of request {self.request_id or '-'} is over but its frames after seq "
            f"{self.last_seq} are gone (deleted or past retention): the rest of the turn cannot be read")

    async def _wait_to_resume(self, outage: _Outage, end: _CallEnd) -> None:
        """Pause (the sidecar's RetryInfo delay; a backoff once reopening
        itself keeps failing), then wait for the channel to be ready, within
        what is left of resume_timeout since the outage began and of the
        turn's deadline; raise when either runs out first (DeadlineExceeded
        for the turn's, else the last refusal or UNAVAILABLE naming the
        problem)."""
        loop = asyncio.get_running_loop()
        stalled_since = outage.failed(loop.time())
        pause = end.retry_after
        if outage.failures > 1:  # back off only when reopening itself keeps failing
            pause = max(pause, min(0.05 * 2 ** (outage.failures - 2), 1.0))
        if pause > 0:
            left = stalled_since + self._resume_timeout - loop.time()
            turn_left = self._turn_left()
            await asyncio.sleep(max(0.0, min(pause, left, turn_left if turn_left is not None else pause)))
        remaining = stalled_since + self._resume_timeout - loop.time()
        turn_left = self._turn_left()
        wait = remaining if turn_left is None else min(remaining, turn_left)
        if wait > 0 and await self._wait_ready(wait):
            return
        if turn_left is not None and turn_left <= remaining:
            raise errors.DeadlineExceeded(
                None, None,
                f"turn deadline of {self._deadline.timeout:g}s passed while resuming the stream "
                f"(request {self.request_id or '-'}, resume point {self.last_seq}): {end.problem}")
        if end.last_error is not None:
            raise end.last_error
        raise errors.SidecarError(
            grpc.StatusCode.UNAVAILABLE, "",
            f"stream lost and not resumed within {self._resume_timeout:g}s "
            f"(request {self.request_id or '-'}, resume point {self.last_seq}): {end.problem}")

    def _turn_left(self) -> float | None:
        """Seconds left before the turn's deadline (<= 0 once passed); None without one."""
        return None if self._deadline is None else self._deadline.remaining()

    async def _wait_ready(self, timeout: float) -> bool:
        """Wait until the channel has (re)connected; False on timeout (a
        cancellation propagates: see SidecarClient.wait_ready)."""
        try:
            async with asyncio.timeout(timeout):
                await self._channel.channel_ready()
            return True
        except TimeoutError:
            return False

    async def _after_terminal(self, call: Any, frame: Any) -> None:
        """After the terminal frame: let the RPC finish; raise the typed error for ``failed``."""
        status = None
        code = grpc.StatusCode.OK
        wants_error = frame_kind(frame) == "failed" and self._raise_on_failed
        try:
            # The status should follow the terminal frame at once; waiting for it
            # (rather than cancelling) keeps the server's logs free of cancellations.
            async with asyncio.timeout(5.0 if wants_error else 0.5):
                code = await call.code()
            if code != grpc.StatusCode.OK:
                status = errors.status_from_trailers(await call.trailing_metadata())
        except (TimeoutError, grpc.RpcError, asyncio.CancelledError):
            if task_cancelling():
                raise
        finally:
            call.cancel()
        if not wants_error:
            return
        error = errors.from_status(status, code) if status is not None else None
        if error is None or error.reason != frame.failed.reason:
            error = errors.from_failed_frame(frame.failed.reason, frame.failed.message)
        raise error


@dataclass
class _CallEnd:
    """How one call of a stream ended: ``clean`` (OK, no terminal frame),
    ``cut`` by this side (a seq gap), the sidecar's ``retry_after`` delay and
    refusal (``last_error``) when it may be made again, and the ``problem``
    an error names when the stream is not resumed."""

    clean: bool = False
    cut: bool = False
    retry_after: float = 0.0
    last_error: errors.SidecarError | None = None
    problem: str = "stream ended before its terminal frame"


@dataclass
class _Outage:
    """A stream's run of failed calls: when it began (resume_timeout counts
    from there), how many calls failed in it, and whether any frame was
    admitted since the stream began. A frame admitted ends the outage."""

    since: float | None = None
    failures: int = 0
    seen_any: bool = False

    def progress(self) -> None:
        self.since, self.failures, self.seen_any = None, 0, True

    def failed(self, now: float) -> float:
        """Count one more failed call; the outage's start."""
        self.since = now if self.since is None else self.since
        self.failures += 1
        return self.since


class _IdleWatchdog:
    """Cancels a call that has received nothing for ``timeout`` seconds."""

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self.fired = False
        self._timer: asyncio.TimerHandle | None = None
        self.problem = f"no frame (keepalives included) for {timeout:g}s" if timeout else ""

    def arm(self, call: Any) -> None:
        self.disarm()
        if self.timeout is not None:
            self._timer = asyncio.get_running_loop().call_later(self.timeout, self._fire, call)

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self, call: Any) -> None:
        self.fired = True
        call.cancel()


def task_cancelling() -> bool:
    """True when the current task itself is being cancelled (not just the call)."""
    task = asyncio.current_task()
    return bool(task is not None and task.cancelling())

"""SidecarClient: the asyncio client for one sidecar (grpc.aio).

Why thin wrappers: the proto is the contract, so every method maps to one RPC
and returns the response's main content (the ``session`` field where there is
one). What the wrappers add is what every adapter would otherwise rewrite:
dicts accepted where a message is expected, the bearer token on every call,
typed errors instead of grpc.RpcError, and a ``prompt`` that hides reconnects.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Iterable
from importlib import resources
from typing import Any

import grpc

from agent_sidecar_client import _args, errors
from agent_sidecar_client._args import (
    MAX_CALL_TIMEOUT_S,
    Deadline,
    SourceLike,
    as_delivery,
    as_source,
    check_ints,
    check_resume_point,
    check_text,
)
from agent_sidecar_client._connect import connect_failure, telling_failure
from agent_sidecar_client._frames import CursorFilter, SeqFilter
from agent_sidecar_client._proto import prompt_service_pb2 as prompt_pb
from agent_sidecar_client._proto import prompt_service_pb2_grpc as prompt_grpc
from agent_sidecar_client._proto import session_service_pb2_grpc as session_grpc
from agent_sidecar_client._proto import tool_service_pb2_grpc as tool_grpc
from agent_sidecar_client._session_calls import SessionCalls
from agent_sidecar_client._stream import FrameStream, task_cancelling
from agent_sidecar_client._tls import PemSource, check_cleartext, tls_credentials

DEFAULT_TARGET = "unix:./data/sidecar.sock"
# The deadline of a unary call unless the client is given another (None: none).
DEFAULT_CALL_TIMEOUT = 30.0
# The gRPC service config every client of this repository ships
# (clients/service_config.json): the idempotent reads are retried on
# UNAVAILABLE, writes and streams never.
SERVICE_CONFIG = resources.files("agent_sidecar_client").joinpath("service_config.json").read_text()

# Quick reconnects: a resumed stream should not sit in gRPC's default backoff
# (which grows to two minutes) after a sidecar restart. Keepalive pings: a
# connection that stops answering (a half-open connection, a network black
# hole) is closed by gRPC in the end (later than keepalive time + timeout: about
# a minute where measured), so every call on it fails and resumes instead of
# waiting forever; a stream notices sooner (DEFAULT_STREAM_IDLE_TIMEOUT). The
# sidecar accepts client pings down to one a second, with or without calls.
KEEPALIVE_TIME_MS = 20_000
KEEPALIVE_TIMEOUT_MS = 10_000
_CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),  # keep pinging an idle stream (a tool host's)
    # A channel of its own connections: C-core otherwise shares a connection among
    # the channels of a process, and the channel that replaces one whose
    # connection stopped answering (_replace_stalled_channel) would get it again.
    ("grpc.use_local_subchannel_pool", 1),
)
# A Prompt or WatchActivity stream that receives nothing, not even the
# keepalive frame the sidecar sends each keepalive_s (15 s by default), for
# this long is taken for a dropped connection and resumed.
DEFAULT_STREAM_IDLE_TIMEOUT = 45.0


class SidecarClient(SessionCalls):
    """One channel to a sidecar plus the three service stubs (``sessions``,
    ``prompts``, ``tools``, for anything the wrappers do not cover; pass
    ``metadata=client.metadata`` when calling them directly)."""

    def __init__(self, target: str = DEFAULT_TARGET, token: str | None = None,
                 *, options: Iterable[tuple[str, Any]] = (),
                 call_timeout: float | None = DEFAULT_CALL_TIMEOUT,
                 credentials: grpc.ChannelCredentials | None = None, tls: bool = False,
                 ca_file: PemSource | None = None, cert_file: PemSource | None = None,
                 key_file: PemSource | None = None, server_name: str | None = None,
                 insecure: bool = False,
                 stream_idle_timeout: float | None = DEFAULT_STREAM_IDLE_TIMEOUT) -> None:
        given, target = target, _args.normalize_target(target)
        for flag, value in (("tls", tls), ("insecure", insecure)):
            if not isinstance(value, bool):  # "false" is truthy: it would send the token in cleartext
                raise ValueError(f"{flag}: {value!r}; True or False")
        if stream_idle_timeout is not None and not (stream_idle_timeout > 0 and math.isfinite(stream_idle_timeout)):
            raise ValueError(f"stream_idle_timeout: {stream_idle_timeout!r}; seconds > 0, or None for none")
        if credentials is None and (tls or ca_file is not None or cert_file is not None or key_file is not None):
            credentials = tls_credentials(ca_file, cert_file, key_file)
        if token is not None and not all(" " <= c <= "~" for c in token):  # what gRPC metadata can carry
            raise ValueError("token: a bearer token is printable ASCII (not shown)")
        check_cleartext(target, token, credentials is not None, insecure)
        if server_name:
            options = (*options, ("grpc.ssl_target_name_override", server_name))
        self.target = given
        #: Seconds a stream may go without any frame (keepalives included) before it is resumed.
        self.stream_idle_timeout = stream_idle_timeout
        self.metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()
        if call_timeout is not None and not (call_timeout > 0 and math.isfinite(call_timeout)):
            raise ValueError(f"call_timeout: {call_timeout!r}; seconds > 0, or None for none")
        #: Deadline in seconds of every unary call the wrappers make (None: no deadline); at
        #: most MAX_CALL_TIMEOUT_S, past which gRPC's deadline would wrap into the past.
        self.call_timeout = None if call_timeout is None else min(call_timeout, MAX_CALL_TIMEOUT_S)
        self._channel_args = (target, credentials, channel_options(options))
        self._retired: list[grpc.aio.Channel] = []  # replaced, still serving their calls
        self._closed = False
        self._open_channel()

    def _open_channel(self) -> None:
        target, credentials, options = self._channel_args
        if credentials is None:
            self.channel = grpc.aio.insecure_channel(target, options=options)
        else:  # TLS: a TLS listener of the sidecar, or a proxy in front of it
            self.channel = grpc.aio.secure_channel(target, credentials, options=options)
        self.sessions = session_grpc.SessionServiceStub(self.channel)
        self.prompts = prompt_grpc.PromptServiceStub(self.channel)
        self.tools = tool_grpc.ToolServiceStub(self.channel)

    def _replace_stalled_channel(self, stalled: grpc.aio.Channel) -> grpc.aio.Channel:
        """A stream on ``stalled`` got nothing, not even a keepalive frame, for
        stream_idle_timeout: its connection stopped answering (a half-open
        connection that keepalive pings have not closed yet), and every new call
        would go onto it. Open a new channel (once per stalled channel) for the
        calls to come. The old one is not closed: closing it would cancel every
        call on it, other streams and a ToolHost's among them, as if their
        callers had; those whose connection is dead end by themselves (their
        own idle watchdog, keepalive pings, their deadlines) and resume or
        re-register on the new channel. ``close()`` closes it."""
        if stalled is self.channel:
            self._retired.append(stalled)
            self._open_channel()
        return self.channel

    async def wait_ready(self, timeout: float = 10.0) -> None:
        """Wait until the channel is connected, else raise SidecarError
        UNAVAILABLE saying why, in gRPC's words: the last connection attempt's
        failure (no such socket, connection refused, a certificate that failed
        verification...; it is also the error's ``__cause__``), fetched by one
        health check that takes at most half a second more; when that is one
        address of a host name refusing the connection, each of the name's
        addresses is asked too, half a second at most each (_connect.
        telling_failure: another may have got further). A cancellation
        of the caller always propagates (``asyncio.timeout``: Python 3.11's
        ``wait_for`` drops one that lands as the channel turns ready)."""
        if not (timeout >= 0 and math.isfinite(timeout)):  # NaN fails both
            raise ValueError(f"timeout: {timeout!r} is no wait; seconds >= 0")
        if self._closed:
            raise errors.client_closed()
        try:
            async with asyncio.timeout(timeout):
                await self.channel.channel_ready()
        except TimeoutError:
            pass
        else:
            return
        failure = await connect_failure(self.channel)
        if failure is not None:
            target, credentials, options = self._channel_args
            if not target.startswith(("unix:", "unix-abstract:")):
                failure = await telling_failure(failure, _args.target_address(target), credentials, options)
        message = f"no sidecar reachable at {self.target} within {timeout:g}s"
        if failure is not None:
            message += f": {errors.from_rpc_error(failure).message}"
        raise errors.SidecarError(grpc.StatusCode.UNAVAILABLE, "", message) from failure

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called."""
        return self._closed

    async def close(self) -> None:
        """Close the channel, and those a stalled connection made it replace.
        The calls in flight (unary calls, prompt and watch streams, a ToolHost's
        stream) and every later call raise ``errors.client_closed()``: a
        SidecarError of code CANCELLED, "the client was closed"."""
        self._closed = True
        retired, self._retired = self._retired, []
        for channel in (*retired, self.channel):
            await channel.close()

    async def __aenter__(self) -> SidecarClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def _call(self, method: Any, request: Any) -> Any:
        if self._closed:
            raise errors.client_closed()
        try:
            return await method(request, metadata=self.metadata, timeout=self.call_timeout)
        except grpc.RpcError as exc:
            raise errors.from_rpc_error(exc) from exc
        except asyncio.CancelledError:
            # close() cancels the calls on the channel: not a cancellation of this task.
            if self.closed and not task_cancelling():
                raise errors.client_closed() from None
            raise

    # -- PromptService ----------------------------------------------------

    def prompt(self, text: str, *, source: SourceLike | None = None, session_key: str = "",
               request_id: str | None = None, delivery: str | int = "follow_up",
               profile: str | None = None, attachments: Iterable[Any] = (),
               timeout: float | None = None, resume_timeout: float = 30.0,
               retry_refusals: bool = True) -> FrameStream:
        """Run one turn; iterate the result for its frames (keepalives skipped).

        The stream resumes by itself after a dropped connection, with the same
        ``request_id`` (a fresh uuid4 when None): first by repeating the Prompt
        while no frame has arrived (idempotent), then with
        ``WatchActivity(request_id, after_seq=last seen)``. After a ``failed``
        frame the next step raises the typed error (e.g. ``AgentBusy``).
        ``timeout`` is the deadline of the whole turn, in seconds: every call
        of the turn gets what is left of it, and waiting to resume stops when
        it passes (before ``resume_timeout`` if that is longer). Passing it
        raises ``DeadlineExceeded``. A refusal the sidecar says may be
        retried with the same request id (OVERLOADED, STORE_UNAVAILABLE,
        LANE_MOVED, ...: ``errors.RETRY_SAME_REQUEST_REASONS``) is, after its
        RetryInfo delay, within ``resume_timeout``; with ``retry_refusals``
        False it is raised at once (a load generator counts them).
        """
        if (source is None) == (not session_key):
            raise ValueError("give exactly one of source and session_key")
        attachments = list(attachments)
        check_text(text=text, source=source, session_key=session_key, request_id=request_id, profile=profile,
                   attachments=attachments)
        request = prompt_pb.PromptRequest(
            request_id=request_id or str(uuid.uuid4()), text=text, delivery=as_delivery(delivery),
            profile=profile or "", session_key=session_key,
            attachments=[_args.build(prompt_pb.Attachment, a, f"attachments[{i}]") for i, a in enumerate(attachments)],
            source=as_source(source) if source is not None else None)
        frame_filter = SeqFilter()
        deadline = Deadline(timeout)

        def open_first() -> Any:
            return self.prompts.Prompt(request, metadata=self.metadata, timeout=deadline.left())

        def open_resume() -> Any:
            if frame_filter.last_seq == 0:
                return open_first()  # nothing seen: the Prompt itself may not have arrived
            return self.prompts.WatchActivity(
                prompt_pb.WatchActivityRequest(request_id=request.request_id, after_seq=frame_filter.last_seq),
                metadata=self.metadata, timeout=deadline.left())

        return FrameStream(self.channel, open_first, open_resume, frame_filter,
                           request_id=request.request_id, resume_timeout=resume_timeout,
                           deadline=deadline if timeout is not None else None,
                           idle_timeout=self.stream_idle_timeout, on_idle=self._replace_stalled_channel,
                           closed=lambda: self._closed,
                           retry_reasons=errors.RETRY_SAME_REQUEST_REASONS if retry_refusals else frozenset())

    def watch(self, *, request_id: str = "", session_key: str = "", platform: str = "",
              after_seq: int = 0, after_cursor: int = 0, resume_timeout: float = 30.0) -> FrameStream:
        """WatchActivity with the same resume logic as ``prompt``.

        By ``request_id``: that turn's frames after ``after_seq``, ending at its
        terminal frame (raising after ``failed``). By ``session_key`` or
        ``platform``: every turn's frames after ``after_cursor`` (0 = live
        only), endlessly, resuming from the last cursor seen, after a dropped
        connection and after a refusal that allows the same call again
        (STREAM_TOO_SLOW for a reader that stalled, OVERLOADED, ...).
        """
        if sum(map(bool, (request_id, session_key, platform))) != 1:
            raise ValueError("give exactly one of request_id, session_key and platform")
        check_text(request_id=request_id, session_key=session_key, platform=platform)
        check_ints(64, after_seq=after_seq, after_cursor=after_cursor)
        check_resume_point(bool(request_id), after_seq, after_cursor)
        frame_filter: SeqFilter | CursorFilter = SeqFilter(after_seq) if request_id else CursorFilter(after_cursor)

        def open_call() -> Any:
            point = frame_filter.resume_point
            return self.prompts.WatchActivity(prompt_pb.WatchActivityRequest(
                request_id=request_id, session_key=session_key, platform=platform,
                after_seq=point if request_id else 0, after_cursor=0 if request_id else point),
                metadata=self.metadata)

        return FrameStream(self.channel, open_call, open_call, frame_filter, request_id=request_id,
                           raise_on_failed=bool(request_id), resume_timeout=resume_timeout,
                           idle_timeout=self.stream_idle_timeout, own_watch=bool(request_id),
                           on_idle=self._replace_stalled_channel, closed=lambda: self._closed)

    async def cancel(self, session_key: str = "", request_id: str = "") -> bool:
        """Stop the in-flight turn (it ends with failed{CANCELLED})."""
        check_text(session_key=session_key, request_id=request_id)
        response: prompt_pb.CancelResponse
        response = await self._call(self.prompts.Cancel, prompt_pb.CancelRequest(
            session_key=session_key, request_id=request_id))
        return response.cancelled

    async def get_queue(self, session_key: str) -> prompt_pb.GetQueueResponse:
        """``.pending`` (the follow-up slot, check ``HasField``) and ``.queued``."""
        check_text(session_key=session_key)
        response: prompt_pb.GetQueueResponse
        response = await self._call(self.prompts.GetQueue, prompt_pb.GetQueueRequest(session_key=session_key))
        return response


def channel_options(options: Iterable[tuple[str, Any]] = ()) -> tuple[tuple[str, Any], ...]:
    """The client's channel options: quick reconnects, keepalive pings and the
    shipped service config, then ``options`` (an option named there replaces
    ours: ``("grpc.keepalive_time_ms", 60_000)``, a ``grpc.service_config``)."""
    extra = tuple(options)
    given = {name for name, _ in extra}
    ours = tuple(o for o in (*_CHANNEL_OPTIONS, ("grpc.service_config", SERVICE_CONFIG)) if o[0] not in given)
    return ours + extra


async def connect(target: str = DEFAULT_TARGET, token: str | None = None, *, wait_ready: bool = True,
                  timeout: float = 10.0, options: Iterable[tuple[str, Any]] = (),
                  call_timeout: float | None = DEFAULT_CALL_TIMEOUT,
                  credentials: grpc.ChannelCredentials | None = None, tls: bool = False,
                  ca_file: PemSource | None = None, cert_file: PemSource | None = None,
                  key_file: PemSource | None = None, server_name: str | None = None,
                  insecure: bool = False,
                  stream_idle_timeout: float | None = DEFAULT_STREAM_IDLE_TIMEOUT) -> SidecarClient:
    """Open a client. ``target`` is one of (the same in every client of this
    repository; anything else raises ValueError at once): ``"unix:PATH"``
    (``"unix:./data/sidecar.sock"``), ``"unix:///abs/path"``, a bare socket path
    (``"/abs/path"``, ``"./rel/path"``), ``"host:port"``, ``"[::1]:port"``,
    ``"tcp:host:port"`` (or ``"tcp://host:port"``) and ``"dns:[//authority/]host:port"``.

    ``stream_idle_timeout``: a Prompt or WatchActivity stream that gets no frame
    at all (the sidecar sends a keepalive frame on a silent stream every
    ``keepalive_s``, 15 s by default) for this many seconds is taken for a
    dropped connection and resumed (default 45; None: never). Keepalive pings
    (20 s, answered within 10 s) close a connection that stopped answering;
    ``options`` may change them (``grpc.keepalive_time_ms``, ...).

    ``token`` is sent as ``authorization: Bearer <token>`` metadata on every
    call. With ``wait_ready`` the call fails fast (SidecarError,
    UNAVAILABLE) when nothing answers within ``timeout`` seconds, saying why
    (gRPC's reason for the last failed connection attempt).
    ``call_timeout`` is the deadline of each unary call (default 30 s; None
    for none); the idempotent reads are retried on UNAVAILABLE within it.

    TLS, for a TCP listener with a certificate (``[[listen]] cert/key``):
    ``tls=True`` verifies the sidecar's certificate with the system's roots,
    ``ca_file`` with these CA certificates instead (a private CA);
    ``cert_file`` and ``key_file`` present a client certificate, which a
    listener with a ``client_ca`` requires (mTLS). Each is a path or PEM
    bytes, and any of them implies ``tls``. ``server_name`` is the name to
    expect in the certificate when it is not the target's host.
    ``credentials`` (any ``grpc.ChannelCredentials``) replaces all of these.

    The token is never sent in cleartext to another machine by accident: a
    token on a plain channel to a host that is not loopback raises
    ValueError unless ``insecure=True`` (Unix sockets and 127.0.0.1 need no
    TLS).
    """
    client = SidecarClient(target, token, options=options, call_timeout=call_timeout,
                           credentials=credentials, tls=tls, ca_file=ca_file, cert_file=cert_file,
                           key_file=key_file, server_name=server_name, insecure=insecure,
                           stream_idle_timeout=stream_idle_timeout)
    if wait_ready:
        try:
            await client.wait_ready(timeout)
        except BaseException:
            await client.close()
            raise
    return client

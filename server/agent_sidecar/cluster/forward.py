"""``Forwarder``: a call for a lane another node runs, passed to that node.

Any sidecar of a cluster answers any call. When a call needs the lane's
holder (a Prompt, a lane admin call, Cancel, GetQueue) and another live node
holds the lease, the handler raises ``LaneElsewhere``; api/rpc.py hands the
call here, and it is made again on the holder (its advertised address, from
the lease row) with the cluster token, and the holder's answer or stream is
relayed as it comes, status and rich error details included. The caller was
authenticated and its request checked here first; the holder trusts the
cluster token.

The forwarded call carries the trace context (tracing on): the holder's
spans are children of this node's span of the call, in the caller's trace.

A forwarded call is marked (``HOP``) and never forwarded again: if the lane
moved meanwhile the holder answers LANE_MOVED, and so does this node when
the holder cannot be reached (its lease runs out within ``seconds_left``, and
a retry then takes the lane over). The client's retry with the same request
id is safe either way: it follows the turn if its accept had committed.
A holder's refusal of the cluster token (UNAUTHENTICATED: the nodes' tokens
differ) is the cluster's fault, not the caller's: UNAVAILABLE with RetryInfo,
and a warning once per holder address.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc

from ..config import Config
from ..errors import LANE_MOVED, UNAVAILABLE, SidecarError
from ..logs import FaultEpisode
from ..obs import tracing
from ..tls import read_pem, target_is_local
from ..turns.leasing import LaneElsewhere
from ..v1 import prompt_service_pb2_grpc, session_service_pb2_grpc

log = logging.getLogger("agent_sidecar.cluster")

HOP = "x-agent-sidecar-forwarded-by"
_STUBS = {"PromptService": prompt_service_pb2_grpc.PromptServiceStub,
          "SessionService": session_service_pb2_grpc.SessionServiceStub}
PING_FLOOR_MS = 1000  # the shortest ping interval a node's server accepts (api/server.py)
# Transport failures reaching the holder (as opposed to the holder's own answer,
# which carries rich details). A bare CANCELLED is the holder's server
# cancelling the call as it stops: this node's caller going away cancels the
# forwarding task instead, so it never arrives here as an error.
_UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)


def forwarded(context) -> bool:
    return any(k == HOP for k, _ in context.invocation_metadata() or ())


def moved(e: LaneElsewhere, why: str) -> SidecarError:
    return SidecarError(LANE_MOVED, f"the session's lane is run by {e.node_id}, {why}; retry",
                        retry_after_s=max(0.2, min(e.seconds_left, 5.0)))


class Forwarder:
    def __init__(self, cfg: Config, max_message_bytes: int):
        self.node_id = cfg.node_id()
        self._metadata = ((HOP, self.node_id),) + (
            (("authorization", f"Bearer {cfg.cluster.token}"),) if cfg.cluster.token else ())
        self._options = [("grpc.max_send_message_length", max_message_bytes),
                         ("grpc.max_receive_message_length", max_message_bytes),
                         *holder_keepalive(cfg.cluster.lease_ttl_s)]
        self._credentials = _peer_credentials(cfg)
        self._channels: dict[str, grpc.aio.Channel] = {}
        # Per holder address: one warning while it cannot be reached, not one per call.
        self._unreachable: dict[str, FaultEpisode] = {}
        self._refused: dict[str, FaultEpisode] = {}  # per holder address: its refusals of our token

    def _call(self, e: LaneElsewhere, service: str, method: str):
        if not e.address:
            raise moved(e, "which advertises no address")
        channel = self._channels.get(e.address)
        if channel is None:
            channel = self._channels[e.address] = (
                grpc.aio.secure_channel(e.address, self._credentials, options=self._options)
                if self._credentials is not None else
                grpc.aio.insecure_channel(e.address, options=self._options))
        return getattr(_STUBS[service](channel), method)

    def _call_metadata(self) -> tuple[tuple[str, str], ...]:
        """The hop mark and the cluster token, and the trace context while
        tracing is on: the holder's spans continue the caller's trace."""
        return self._metadata + tracing.outgoing_metadata()

    def _timeout(self, context) -> float | None:
        left = context.time_remaining()
        return left if left is not None and left < 1e9 else None

    async def unary(self, e: LaneElsewhere, service: str, method: str, request, context) -> Any:
        call = self._call(e, service, method)
        try:
            answer = await call(request, metadata=self._call_metadata(), timeout=self._timeout(context))
        except grpc.aio.AioRpcError as err:
            await self._relay(e, err, context)
        self._reached(e)
        return answer

    async def stream(self, e: LaneElsewhere, service: str, method: str, request,
                     context) -> AsyncIterator[Any]:
        call = self._call(e, service, method)(request, metadata=self._call_metadata(),
                                              timeout=self._timeout(context))
        try:
            async for item in call:
                self._reached(e)
                yield item
        except grpc.aio.AioRpcError as err:
            await self._relay(e, err, context)
        finally:  # the caller went away: the holder's stream (its subscriber) ends now, not when collected
            call.cancel()

    def _reached(self, e: LaneElsewhere) -> None:
        for episodes in (self._unreachable, self._refused):
            episode = episodes.get(e.address)
            if episode is not None:
                episode.ended()

    @staticmethod
    def _episode(episodes: dict[str, FaultEpisode], e: LaneElsewhere, msg: str) -> FaultEpisode:
        episode = episodes.get(e.address)
        if episode is None:
            episode = episodes[e.address] = FaultEpisode(log, msg)
        return episode

    async def _relay(self, e: LaneElsewhere, err: grpc.aio.AioRpcError, context) -> None:
        """The holder's error as the caller's; the holder out of reach as LANE_MOVED.
        A call that ran out of the caller's own time is no sign of the holder's
        health: it ends DEADLINE_EXCEEDED, with no warning about the holder."""
        left = context.time_remaining()
        if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED and left is not None and left <= 0.001:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "the call's deadline passed")
        if err.code() in _UNREACHABLE and not _from_sidecar(err):
            self._episode(self._unreachable, e, "lane holder unreachable").failed(
                node=e.node_id, address=e.address, error=err.details())
            raise moved(e, f"which cannot be reached at {e.address}")
        if err.code() == grpc.StatusCode.UNAUTHENTICATED:
            # The caller was authenticated here; what the holder refused is this
            # node's cluster token (the nodes' tokens differ): a fault of the
            # cluster's config, not of the caller's credentials.
            self._episode(self._refused, e, "lane holder refused this node's cluster token").failed(
                node=e.node_id, address=e.address, error=err.details())
            raise SidecarError(UNAVAILABLE, f"the session's lane is run by {e.node_id}, which refused this"
                               " sidecar's cluster token (every node's [cluster] token must be an admin"
                               " token of every node); retry", retry_after_s=max(0.2, min(e.seconds_left, 5.0)))
        await context.abort(err.code(), err.details() or "", tuple(err.trailing_metadata() or ()))

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()


def holder_keepalive(lease_ttl_s: float) -> list[tuple[str, int]]:
    """Channel options that find a holder that stopped answering (a stalled
    process: its kernel keeps the TCP connection up, so nothing else would):
    a ping after half a lease TTL without a byte from it, and the connection
    given up when its answer takes another half. The calls on it then end
    LANE_MOVED within about a TTL, when the holder's lease has run out and a
    retry takes the lane over, instead of at their callers' deadlines. The
    nodes' servers accept pings this often (api/server.py)."""
    half_ms = max(PING_FLOOR_MS, int(lease_ttl_s * 500))
    # gRPC as pinned here (1.85) times a ping out by ping_timeout_ms; older releases read keepalive_timeout_ms.
    return [("grpc.keepalive_time_ms", half_ms), ("grpc.keepalive_timeout_ms", half_ms),
            ("grpc.http2.ping_timeout_ms", half_ms), ("grpc.http2.max_pings_without_data", 0)]


def advertise_problem(cfg: Config) -> str | None:
    """Why the other nodes may not reach this one where it advertises
    itself, judged from its own listeners; None when one fits. The other
    nodes forward every call for a lane this node holds to ``[cluster]
    advertise`` (over TLS exactly when ``[cluster] ca_file`` is set, as every
    node of a cluster is configured alike): with no TCP listener on that port,
    or one of the other kind, those calls fail while this node runs the lane.
    Only a warning (``serve``): a port mapping or proxy may lead there."""
    port = cfg.cluster.advertise.rsplit(":", 1)[1]
    on_port = [li for li in cfg.all_listeners()
               if not li.address.startswith("unix:") and li.address.rsplit(":", 1)[1] == port]
    if not on_port:
        return f"no TCP listener of this sidecar is on port {port}"
    tls = bool(cfg.cluster.ca_file)
    if not any(li.tls == tls for li in on_port):
        return (f"its listener on port {port} serves {'plaintext' if tls else 'TLS'}, and the other nodes"
                f" call it over {'TLS' if tls else 'plaintext'} ([cluster] ca_file"
                f" {'set' if tls else 'unset'})")
    return None


def _peer_credentials(cfg: Config) -> grpc.ChannelCredentials | None:
    """TLS to the other sidecars when ``[cluster] ca_file`` is set (with a
    client certificate for their mTLS listeners when ``cert_file`` is)."""
    c = cfg.cluster
    if not c.ca_file:
        if c.token and not all(target_is_local(a) for a in (c.advertise,) if a):
            log.warning("calls between sidecars carry the cluster token in cleartext: set "
                        "[cluster] ca_file (TLS listeners) unless the network is private")
        return None
    chain = read_pem(c.cert_file) if c.cert_file else None
    return grpc.ssl_channel_credentials(read_pem(c.ca_file), read_pem(c.key_file) if chain else None, chain)


def _from_sidecar(err: grpc.aio.AioRpcError) -> bool:
    """Whether the status came from a sidecar (rich details attached), not the transport."""
    return any(k == "grpc-status-details-bin" for k, _ in err.trailing_metadata() or ())

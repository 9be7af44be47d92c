"""Why a channel is not connected, in gRPC's own words.

``channel_ready()`` only says "not yet": a wait that runs out would otherwise
report "no sidecar reachable" whether the socket path is wrong, the port
refuses, the sidecar's certificate fails verification or an mTLS listener
turns the client away, and the user has to guess. gRPC keeps the reason of
the channel's last failed connection attempt and gives it to the next call
that does not wait for the channel (the default), so one such call, cheap and
unauthenticated (the standard health check), fetches it.
"""

from __future__ import annotations

import grpc

# The standard health check: served without a token, even over TCP.
_PROBE_METHOD = "/grpc.health.v1.Health/Check"
# How long the probe may take: a channel in TRANSIENT_FAILURE answers at once;
# one still connecting (a host that drops packets) gives no reason in time.
PROBE_TIMEOUT_S = 0.5


async def connect_failure(channel: grpc.aio.Channel) -> grpc.aio.AioRpcError | None:
    """The error a call gets now on ``channel`` when its last connection
    attempt failed (its details name the reason: "connect failed ... No such
    file or directory", "Connection refused", "CERTIFICATE_VERIFY_FAILED"...);
    None when the call got through or gave no reason within PROBE_TIMEOUT_S.
    A cancellation of the caller propagates."""
    # No (de)serializers: bytes in and out, the empty request.
    probe: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(_PROBE_METHOD)
    try:
        await probe(b"", timeout=PROBE_TIMEOUT_S)
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.UNAVAILABLE and exc.details():
            return exc
    return None

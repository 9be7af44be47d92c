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

import re

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


# gRPC's text for a connection closed as it was being set up, after TCP (and
# TLS) but before HTTP/2 began: gRPC says no more than this.
# Over TCP only: a Unix socket has no TLS.
_CLOSED_AT_SETUP = re.compile(r"failed to connect to all addresses; last error: \w+: ipv[46]:\S+: Socket closed$")
CLOSED_AT_SETUP_HINT = (
    "; the connection was closed as it was set up: so an mTLS listener (one with a client_ca) refuses the TLS "
    "handshake of a client without a client certificate its client_ca signed (give cert_file and key_file), a "
    "TLS listener one without TLS (tls=True or ca_file), and a proxy one it cannot forward (its sidecar is down)")


def explain(message: str) -> str:
    """``message`` (a status's details) with the likely causes of a TCP
    connection closed at setup spelt out. That is all an mTLS listener turning
    a client away (no client certificate, or one of another CA) shows through
    gRPC, whose TLS 1.3 handshake is over on the client's side when the
    listener refuses it, and all a TLS listener reached without TLS shows. A
    proxy in front of a sidecar that is down (Docker's port forwarding, say)
    does the same, so it is no proof of a TLS failure: a ToolHost retries it."""
    return message + CLOSED_AT_SETUP_HINT if _CLOSED_AT_SETUP.search(message) else message

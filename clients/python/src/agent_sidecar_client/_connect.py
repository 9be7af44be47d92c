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

import asyncio
import ipaddress
import re
import socket
from collections.abc import Sequence
from typing import Any

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


# At most this many of a name's addresses are asked on their own (telling_failure).
_MAX_ADDRESSES = 4


async def telling_failure(failure: grpc.aio.AioRpcError, address: str,
                          credentials: grpc.ChannelCredentials | None,
                          options: Sequence[tuple[str, Any]]) -> grpc.aio.AioRpcError:
    """The failure that says most about why ``address`` (``HOST:PORT``) is out
    of reach: ``failure`` (the channel's last one), unless HOST is a name and
    ``failure`` one of its addresses refusing the connection while another
    got further. gRPC reports only the last address it tried,
    so ``localhost`` of a sidecar listening on 127.0.0.1 alone said "::1:
    Connection refused" as often as not, where 127.0.0.1's listener had
    turned the client away in the TLS handshake (an mTLS listener refusing
    its certificate). Each address is then asked once on a channel of its
    own (as ``channel`` would be, its certificate checked against HOST), and
    the first failure that is no refusal is returned."""
    if "Connection refused" not in (failure.details() or ""):
        return failure
    host, _, port = address.rpartition(":")
    try:
        ipaddress.ip_address(host.strip("[]"))
        return failure  # one address: its failure is the reason
    except ValueError:
        pass
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except OSError:
        return failure
    # Every address of the name as this host resolves it: gRPC's resolver may
    # give more (localhost: ::1 as well), and the one that refused is among them.
    ips = list(dict.fromkeys(str(info[4][0]) for info in infos))[:_MAX_ADDRESSES]
    if credentials is not None and not any(name == "grpc.ssl_target_name_override" for name, _ in options):
        options = (*options, ("grpc.ssl_target_name_override", host))
    for ip in ips:
        target = f"ipv6:[{ip}]:{port}" if ":" in ip else f"ipv4:{ip}:{port}"
        channel = (grpc.aio.insecure_channel(target, options=options) if credentials is None
                   else grpc.aio.secure_channel(target, credentials, options=options))
        async with channel:
            own = await connect_failure(channel)
        if own is not None and "Connection refused" not in (own.details() or ""):
            return own
    return failure


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

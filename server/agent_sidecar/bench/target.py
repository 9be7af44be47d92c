"""Where the bench connects, as plain data, and the one way it connects.

A ``Target`` pickles (TLS as the PEM bytes, not grpc's credentials object),
so the client processes of ``--clients`` (bench/fleet.py) open their own
channels to the same place, with the same token and TLS, as the bench's own.
"""

from __future__ import annotations

import dataclasses
import os
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import targets
from ..targets import is_unix, setup_hint
from ..tls import ClientMaterial
from .sockets import unix_path

if TYPE_CHECKING:  # the client is the bench extra's: imported where used
    from agent_sidecar_client import SidecarClient


class BenchError(Exception):
    """A failure the user can act on: printed as one line, exit status 1."""


class TargetLost(BenchError):
    """A target that answered before stopped answering: the run ends there,
    with the report of the points that finished (run.run_bench); ``during``:
    found after the point under way (which is then dropped), not before it."""

    during = False


class ClientLost(BenchError):
    """A bench client process (``--clients``, bench/fleet.py) died or failed:
    like TargetLost, the run ends there with the points that finished."""


@dataclass(frozen=True)
class Target:
    address: str
    token: str | None = None
    tls: ClientMaterial | None = None  # None: a plain channel
    channel_options: tuple = ()
    insecure: bool = False  # --insecure: the token over plain TCP to another host
    connect_timeout_s: float = 5.0

    @property
    def unix(self) -> bool:
        """Whether the target is a Unix socket, however it is spelled (targets.is_unix)."""
        return is_unix(self.address)

    def plain(self, address: str) -> Target:
        """The same settings towards a local server of the bench's own (the
        bare server): no token, no TLS."""
        return dataclasses.replace(self, address=address, token=None, tls=None, channel_options=())


async def connect(target: Target) -> SidecarClient:
    """A client for ``target``; BenchError (one line) when nothing answers,
    saying why the connection failed (_why_unreachable)."""
    from agent_sidecar_client import SidecarError
    from agent_sidecar_client import connect as client_connect
    try:
        credentials = None
        if target.tls is not None:
            import grpc
            credentials = grpc.ssl_channel_credentials(*target.tls)
        client = await client_connect(target.address, target.token, wait_ready=False,
                                      credentials=credentials, options=target.channel_options,
                                      call_timeout=60.0, insecure=target.insecure)
    except Exception as e:  # a malformed target, bad TLS material...
        raise BenchError(f"cannot connect to {target.address}: {e}") from None
    missing = _missing_socket(target.address)
    if missing:  # no wait: nothing will listen there within the connect timeout but a sidecar starting
        await client.close()
        raise BenchError(f"no sidecar at {target.address}: the socket {missing} does not exist")
    try:
        await client.wait_ready(target.connect_timeout_s)
    except SidecarError as e:
        await client.close()
        raise BenchError(f"no sidecar reachable at {target.address} within "
                         f"{target.connect_timeout_s:g}s{_why_unreachable(target, e)}") from None
    return client


def _missing_socket(address: str) -> str | None:
    """The path of ``address``'s Unix socket when there is no file there
    (else None: a TCP target, an abstract socket, a file that exists). gRPC
    would say "No such file or directory" only once the connect timeout is
    over, retrying a connection that cannot succeed until then."""
    path = unix_path(targets.address(address))
    if path is None or os.path.lexists(path) or os.path.lexists(urllib.parse.unquote(path)):
        return None
    return path


async def check_answers(target: Target, client: SidecarClient) -> None:
    """TargetLost when ``client``'s channel to ``target`` cannot connect
    within the connect timeout: a sidecar that died (or restarts) mid-run.
    A busy sidecar passes: this asks for the connection, not for an answer."""
    from agent_sidecar_client import SidecarError
    try:
        await client.wait_ready(target.connect_timeout_s)
    except SidecarError as e:
        raise TargetLost(f"{target.address} stopped answering (no connection within "
                         f"{target.connect_timeout_s:g}s{_why_unreachable(target, e)})") from None


def _why_unreachable(target: Target, error: Exception) -> str:
    """``": <reason>"``: gRPC's account of the channel's last connection
    attempt (refused, no such socket, a TLS handshake that failed and why:
    the CA, the name, no client certificate), which the client's wait_ready
    fetched and kept as its error's cause; "" when there is none. Without it
    every one of those read "no sidecar reachable", so a TLS mistake looked
    like a sidecar that is down. A connection closed as it was set up gets
    the likely causes in the bench's options' words (targets.setup_hint)."""
    details = getattr(error.__cause__, "details", lambda: "")
    details = (details() or "").strip()
    if not details:
        return ""
    hint = setup_hint(details, target.tls is not None, target.tls is not None and target.tls[2] is not None)
    return f": {details.rsplit('last error: ', 1)[-1]}{hint}"

"""A client that cannot reach its sidecar says why, in gRPC's words: the
socket that is not there, the port that refuses, the certificate that fails
verification. Before, ``connect()`` (its ``wait_ready``) said only "no
sidecar reachable at ... within Ns", whatever the cause."""

import asyncio
import socket
import sys
from pathlib import Path

import grpc
import pytest

import agent_sidecar_client as asc

pytest.importorskip("agent_sidecar")
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from helpers.certs import _CLIENT_EXT, _make, make_certs  # noqa: E402
from sidecar_proc import Sidecar, free_port  # noqa: E402


def connect_error(target: str, token: str | None = None, timeout: float = 1, **tls) -> asc.SidecarError:
    """What ``connect()`` raises when the channel does not become ready within
    ``timeout`` (a TLS handshake needs more on a loaded machine: one that
    runs out of time reads "timed out before receiving SETTINGS frame")."""
    async def run() -> asc.SidecarError:
        with pytest.raises(asc.SidecarError) as info:
            await asc.connect(target, token, timeout=timeout, **tls)
        return info.value
    return asyncio.run(asyncio.wait_for(run(), 20))


def test_no_socket_names_the_missing_file(tmp_path):
    error = connect_error(f"unix:{tmp_path}/nobody.sock")
    assert error.code == grpc.StatusCode.UNAVAILABLE and error.reason == "", error
    assert "within 1s" in str(error) and "No such file or directory" in str(error), error
    assert isinstance(error.__cause__, grpc.RpcError), repr(error.__cause__)


def test_a_refused_port_says_refused():
    with socket.socket() as s:  # a port bound, never listening: every connect is refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        error = connect_error(f"127.0.0.1:{port}")
    assert error.code == grpc.StatusCode.UNAVAILABLE and "Connection refused" in str(error), error


def test_a_certificate_that_fails_verification_says_so(tmp_path):
    certs = make_certs(tmp_path / "certs")
    port = free_port()
    config = '[[auth.tokens]]\ntoken = "tok"\nplatforms = ["*"]\n' + certs.listener(f"127.0.0.1:{port}")
    sc = Sidecar(tmp_path / "data", config=config, workers=1).start()
    try:
        error = connect_error(f"127.0.0.1:{port}", "tok", timeout=3, ca_file=certs.other_ca)
    finally:
        sc.stop()
    assert error.code == grpc.StatusCode.UNAVAILABLE and "CERTIFICATE_VERIFY_FAILED" in str(error), error


@pytest.fixture(scope="module")
def mtls(tmp_path_factory):
    """(certs, port) of a sidecar with an mTLS listener on 127.0.0.1:port (clients of certs.ca)."""
    tmp_path = tmp_path_factory.mktemp("mtls")
    certs = make_certs(tmp_path / "certs")
    port = free_port()
    config = '[[auth.tokens]]\ntoken = "tok"\nplatforms = ["*"]\n' + certs.listener(f"127.0.0.1:{port}", client_ca=True)
    sc = Sidecar(tmp_path / "data", config=config, workers=1).start()
    yield certs, port
    sc.stop()


def names_the_client_certificate(error: asc.SidecarError) -> None:
    assert error.code == grpc.StatusCode.UNAVAILABLE and error.reason == "", error
    assert "refuses the TLS handshake" in str(error) and "client certificate" in str(error), error


def test_an_mtls_listener_refusing_the_client_names_the_client_certificate(mtls):
    """An mTLS listener turning a client away shows through gRPC only as
    "Socket closed" at setup; the error says an mTLS listener refuses the TLS
    handshake so and wants a client certificate of its CA, without one and
    with one of another CA alike, from connect() and from a first call."""
    certs, port = mtls
    target = f"127.0.0.1:{port}"
    # A client certificate of another CA than the listener's client_ca.
    stranger = _make(certs.dir, "stranger", "stranger", _CLIENT_EXT, (certs.other_ca, certs.dir / "other-ca.key"))

    async def first_call(**tls) -> asc.SidecarError:
        async with await asc.connect(target, "tok", ca_file=certs.ca, wait_ready=False, **tls) as client:
            with pytest.raises(asc.SidecarError) as info:
                await client.get_or_create_session({"platform": "p", "chat_id": "c"})
            return info.value

    errors = [connect_error(target, "tok", timeout=3, ca_file=certs.ca),
              asyncio.run(asyncio.wait_for(first_call(), 20)),
              asyncio.run(asyncio.wait_for(first_call(cert_file=stranger[0], key_file=stranger[1]), 20))]
    for error in errors:
        names_the_client_certificate(error)


def test_localhost_names_the_client_certificate_not_the_address_that_refused(mtls):
    """``localhost`` is ::1 and 127.0.0.1 to gRPC, which reports the last
    address it tried: a listener on 127.0.0.1 alone made connect() say
    "ipv6:[::1]:PORT: Connection refused" as often as not, with no word of
    the client certificate 127.0.0.1 had refused. Several connects at once,
    as each one's last address is gRPC's to choose, and every one names the
    client certificate."""
    certs, port = mtls

    async def refusal() -> asc.SidecarError:
        with pytest.raises(asc.SidecarError) as info:
            await asc.connect(f"localhost:{port}", "tok", timeout=1, ca_file=certs.ca)
        return info.value

    async def all_of_them() -> list[asc.SidecarError]:
        return await asyncio.gather(*(refusal() for _ in range(8)))

    for error in asyncio.run(asyncio.wait_for(all_of_them(), 30)):
        names_the_client_certificate(error)
        assert "within 1s" in str(error), error

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
from helpers.certs import make_certs  # noqa: E402
from sidecar_proc import Sidecar, free_port  # noqa: E402


def connect_error(target: str, token: str | None = None, **tls) -> asc.SidecarError:
    """What ``connect()`` raises when the channel does not become ready within 1 s."""
    async def run() -> asc.SidecarError:
        with pytest.raises(asc.SidecarError) as info:
            await asc.connect(target, token, timeout=1, **tls)
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
    config = (f'[[auth.tokens]]\ntoken = "tok"\nplatforms = ["*"]\n\n[[listen]]\n'
              f'address = "127.0.0.1:{port}"\ncert = "{certs.server_cert}"\nkey = "{certs.server_key}"\n')
    sc = Sidecar(tmp_path / "data", config=config, workers=1).start()
    try:
        error = connect_error(f"127.0.0.1:{port}", "tok", ca_file=certs.other_ca)
    finally:
        sc.stop()
    assert error.code == grpc.StatusCode.UNAVAILABLE and "CERTIFICATE_VERIFY_FAILED" in str(error), error

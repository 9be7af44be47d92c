"""TLS and mTLS on TCP listeners (issue 17 item 5), against a real sidecar
with three listeners: its Unix socket, a TLS listener and an mTLS listener
(``[[listen]]`` with ``client_ca``), certificates made by helpers.certs.

What a client sees: the Python client reaches the same sessions over TLS with
a private CA (and over mTLS with a client certificate); a wrong CA, a plain
channel to a TLS port and an mTLS listener without a client certificate are
refused in the handshake. ``agent-sidecar health`` takes the same options.
Health answers for each service by name. The bearer token is never sent in
cleartext to another machine: clients and the CLI refuse it unless told to,
and the sidecar warns about a plain TCP listener open to the network.
"""

from __future__ import annotations

import asyncio
import socket
import ssl

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers.certs import available, make_certs
from helpers.cli import cli
from helpers.ids import source
from helpers.logs import log_lines
from helpers.sessions import create
from sidecar_proc import TOKEN, Sidecar, free_port

import agent_sidecar_client as asc
from agent_sidecar.api.server import SERVICE_NAMES

pytestmark = pytest.mark.skipif(not available(), reason="the openssl command is not installed")


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def sc(tmp_path_factory, certs):
    tls, mtls = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    config = (f'[[auth.tokens]]\ntoken = "{TOKEN}"\nadmin = true\n'
              + certs.listener(tls) + certs.listener(mtls, client_ca=True))
    s = Sidecar(tmp_path_factory.mktemp("tls") / "data", config=config, workers=1)
    s.tls_target, s.mtls_target = tls, mtls
    s.start()
    yield s
    s.stop()


async def _session_id(target: str, **kw) -> str:
    """The session of a fixed source, over ``target`` with the Python client (no wait:
    a refused handshake fails the call at once)."""
    async with await asc.connect(target, TOKEN, wait_ready=False, call_timeout=10, **kw) as client:
        return (await client.get_or_create_session({"platform": "telegram", "chat_id": "tls"})).session_id


def session_id(target: str, **kw) -> str:
    return asyncio.run(_session_id(target, **kw))


def refused(target: str, **kw) -> asc.SidecarError:
    with pytest.raises(asc.SidecarError) as e:
        session_id(target, **kw)
    assert e.value.code == grpc.StatusCode.UNAVAILABLE, e.value
    return e.value


# -- the Python client ------------------------------------------------------------------------------

def test_the_python_client_reaches_the_same_sessions_over_tls_with_a_private_ca(sc, certs):
    over_unix = create(sc.sessions(), source("telegram", "tls"))[0].session_id
    assert session_id(sc.tls_target, ca_file=certs.ca) == over_unix
    assert session_id(sc.tls_target, ca_file=certs.ca.read_bytes()) == over_unix  # PEM bytes too
    # Another name in the certificate than the target's host: localhost is one of its names.
    assert session_id(f"localhost:{sc.tls_target.rsplit(':', 1)[1]}", ca_file=certs.ca) == over_unix


def test_a_wrong_ca_and_a_plain_channel_are_refused_by_a_tls_listener(sc, certs):
    assert "CERTIFICATE_VERIFY_FAILED" in refused(sc.tls_target, ca_file=certs.other_ca).message
    refused(sc.tls_target, tls=True)  # the system's roots do not know the test CA
    refused(sc.tls_target)  # plaintext to a TLS port (loopback: the token may go plain)


def test_mtls_takes_the_client_certificate_and_refuses_a_client_without_one(sc, certs):
    over_unix = create(sc.sessions(), source("telegram", "tls"))[0].session_id
    assert session_id(sc.mtls_target, ca_file=certs.ca, cert_file=certs.client_cert,
                      key_file=certs.client_key) == over_unix
    refused(sc.mtls_target, ca_file=certs.ca)
    # The server's own certificate is no client certificate (its usage is serverAuth).
    refused(sc.mtls_target, ca_file=certs.ca, cert_file=certs.server_cert, key_file=certs.server_key)


def _handshake(target: str, certs, version: ssl.TLSVersion) -> str:
    """The TLS version a handshake offering only ``version`` agreed on (an
    old one allowed on this side: OpenSSL's security level 0)."""
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    ctx.minimum_version = ctx.maximum_version = version
    ctx.set_ciphers("DEFAULT@SECLEVEL=0")
    ctx.set_alpn_protocols(["h2"])
    host, port = target.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="localhost") as tls:
        return tls.version() or ""


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")
def test_a_tls_listener_speaks_tls_1_2_and_1_3_only(sc, certs):
    """docs/security.md: TLS 1.0 and 1.1 are refused in the handshake (by the
    sidecar: it ends the connection after the client's hello)."""
    assert _handshake(sc.tls_target, certs, ssl.TLSVersion.TLSv1_2) == "TLSv1.2"
    assert _handshake(sc.tls_target, certs, ssl.TLSVersion.TLSv1_3) == "TLSv1.3"
    for old in (ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1):
        with pytest.raises((ssl.SSLError, ConnectionError)) as e:
            _handshake(sc.tls_target, certs, old)
        assert "NO_PROTOCOLS_AVAILABLE" not in str(e.value), e.value  # offered, then refused


# -- the command line -------------------------------------------------------------------------------

def test_health_over_tls_and_mtls_with_the_target_options(sc, certs):
    ok = cli("health", "--target", sc.tls_target, "--ca", str(certs.ca))
    assert ok.returncode == 0 and ok.stdout.strip() == f"{sc.tls_target}: SERVING", ok
    mtls = ["health", "--target", sc.mtls_target, "--ca", str(certs.ca), "--timeout", "5"]
    ok = cli(*mtls, "--cert", str(certs.client_cert), "--key", str(certs.client_key))
    assert ok.returncode == 0 and ok.stdout.strip() == f"{sc.mtls_target}: SERVING", ok
    no_cert = cli(*mtls)
    assert no_cert.returncode == 1 and "UNAVAILABLE" in no_cert.stdout, no_cert
    wrong_ca = cli("health", "--target", sc.tls_target, "--ca", str(certs.other_ca))
    assert wrong_ca.returncode == 1 and "UNAVAILABLE" in wrong_ca.stdout, wrong_ca
    half = cli("health", "--target", sc.mtls_target, "--cert", str(certs.client_cert))
    assert half.returncode == 2 and half.stderr.strip() == "agent-sidecar health: --cert and --key go together"
    create(sc.sessions(), source("telegram", "tls"))  # this test's own session, whichever ran before it
    listed = cli("sessions", "--target", sc.tls_target, "--token", TOKEN, "--ca", str(certs.ca), "list")
    assert listed.returncode == 0 and "agent:main:telegram:dm:tls" in listed.stdout, listed
    status = cli("status", "--target", sc.mtls_target, "--token", TOKEN, "--ca", str(certs.ca), "--json",
                 "--cert", str(certs.client_cert), "--key", str(certs.client_key))
    assert status.returncode == 0 and '"serving": true' in status.stdout, status


def test_a_failed_handshake_is_one_line_from_every_command_that_talks_to_a_sidecar(sc, certs):
    """The wrong CA: status, sessions and health each say why in their one
    line, and nothing else reaches the terminal; before, status, sessions and
    health printed the gRPC core's own handshake log line too (the bench was
    quietened alone, bench_cmd.run)."""
    base = ["--target", sc.tls_target, "--token", TOKEN, "--ca", str(certs.other_ca)]
    status = cli("status", *base, "--timeout", "5")
    assert status.returncode == 1 and status.stdout == "", status
    (line,) = status.stderr.strip().splitlines()
    assert line.startswith(f"agent-sidecar status: {sc.tls_target}: UNAVAILABLE: ") \
        and "CERTIFICATE_VERIFY_FAILED" in line, line
    listed = cli("sessions", *base, "list")
    assert listed.returncode == 1 and listed.stdout == "", listed
    (line,) = listed.stderr.strip().splitlines()
    assert "CERTIFICATE_VERIFY_FAILED" in line, line
    health = cli("health", *base, "--timeout", "5")
    assert health.returncode == 1 and health.stderr == "", health
    (line,) = health.stdout.strip().splitlines()
    assert line.startswith(f"{sc.tls_target}: UNAVAILABLE: ") and "CERTIFICATE_VERIFY_FAILED" in line, line


def test_every_command_names_the_cause_of_a_connection_closed_at_setup(sc, certs):
    """A TLS listener dialled without TLS and an mTLS listener refusing the
    client certificate show through gRPC only as "Socket closed"; each
    command's line names the option to fix, as the clients' errors do. Before,
    health, status, sessions and bench gave gRPC's bare text."""
    tls, mtls, ca = sc.tls_target, sc.mtls_target, ["--ca", str(certs.ca)]
    foreign = ["--cert", str(certs.foreign_cert), "--key", str(certs.foreign_key)]
    for command, tail in (("health", ["--timeout", "5"]), ("status", ["--timeout", "5"]), ("sessions", ["list"])):
        for options, hint in (([tls], "a TLS listener closes a client without TLS so (use --tls, or --ca)"),
                              ([mtls, *ca], "refuses so a client without a client certificate (give --cert and --key)"),
                              ([mtls, *ca, *foreign], "refuses so a client certificate its client_ca did not sign "
                                                      "(check --cert)")):
            r = cli(command, "--target", *options, "--token", TOKEN, *tail)
            assert r.returncode == 1 and "Socket closed; the connection was closed as it was set up" in \
                r.stdout + r.stderr and hint in r.stdout + r.stderr, (command, options, r)
    bench = cli("bench", "--target", mtls, *ca, "--token", TOKEN, "--connect-timeout", "2", "--duration", "1")
    assert bench.returncode == 1 and bench.stderr.startswith(f"agent-sidecar bench: no sidecar reachable at {mtls}") \
        and "(give --cert and --key)" in bench.stderr, bench


def test_the_cli_refuses_a_token_in_cleartext_to_another_host_unless_told():
    # 192.0.2.1 is TEST-NET-1: nothing answers there; the refusal comes before any connection.
    r = cli("health", "--target", "192.0.2.1:50051", "--token", "t")
    assert r.returncode == 2 and "refusing to send --token in cleartext to 192.0.2.1:50051" in r.stderr, r
    r = cli("health", "--target", "192.0.2.1:50051", "--token", "t", "--insecure", "--timeout", "0.2")
    assert r.returncode == 1 and r.stdout.startswith("192.0.2.1:50051: "), r  # it tried


# -- health per service name ------------------------------------------------------------------------

def test_health_answers_for_each_service_by_name(sc):
    stub = health_pb2_grpc.HealthStub(sc.channel())
    assert set(SERVICE_NAMES) >= {"agent_sidecar.v1.PromptService", "agent_sidecar.v1.SessionService",
                                  "agent_sidecar.v1.ToolService"}
    for name in ("", *SERVICE_NAMES):
        status = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status
        assert status == health_pb2.HealthCheckResponse.SERVING, name
    with pytest.raises(grpc.RpcError) as e:
        stub.Check(health_pb2.HealthCheckRequest(service="agent_sidecar.v1.NoSuchService"), timeout=5)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert "NoSuchService" in e.value.details() and "agent_sidecar.v1.PromptService" in e.value.details()


# -- the sidecar's warning ----------------------------------------------------------------------------

def test_the_sidecar_warns_about_a_plain_tcp_listener_open_to_the_network(tmp_path, certs):
    """The log line is the behaviour under test: the operator's only signal."""
    wide, local, secure = f"0.0.0.0:{free_port()}", f"127.0.0.1:{free_port()}", f"0.0.0.0:{free_port()}"
    config = f'[[auth.tokens]]\ntoken = "{TOKEN}"\n[[listen]]\naddress = "{wide}"\n' \
        f'[[listen]]\naddress = "{local}"\n' + certs.listener(secure)
    s = Sidecar(tmp_path / "data", config=config, workers=1).start()
    try:
        warned = [line["listen"] for line in log_lines(s) if line["level"] == "warning"
                  and "cleartext" in line["msg"]]
        serving = log_lines(s, "serving")[0]["listen"]
    finally:
        s.stop()
    assert warned == [wide], log_lines(s)
    assert f"{secure} (TLS)" in serving and wide in serving and local in serving

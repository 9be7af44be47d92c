"""A TLS listener's files as an operator's tools handle them (docs/security.md,
"TLS and mTLS"): renewed in place (certbot, cert-manager, a mesh's short-lived
certificates), the sidecar serves the new certificate from the next connection
on, without a restart; files no client would take, or that expose the key,
are said so in the log when they are read. Certificates made by helpers.certs;
the clients are the Python client and ``agent-sidecar health`` over real TLS."""

from __future__ import annotations

import asyncio
import os
import shutil

import grpc
import pytest
from helpers.certs import available, make_certs
from helpers.logs import log_lines
from sidecar_proc import TOKEN, Sidecar, free_port

import agent_sidecar_client as asc

pytestmark = pytest.mark.skipif(not available(), reason="the openssl command is not installed")


async def _session_id(target: str, ca) -> str:
    async with await asc.connect(target, TOKEN, wait_ready=False, call_timeout=10, ca_file=ca) as client:
        return (await client.get_or_create_session({"platform": "telegram", "chat_id": "tls"})).session_id


def _served(tmp_path, key_mode: int):
    """Certificates, and the listener's own copies of the server's files
    (what an operator's tool replaces), the key with ``key_mode``."""
    certs = make_certs(tmp_path / "certs")
    served = tmp_path / "served"
    served.mkdir()
    cert, key = served / "server.pem", served / "server.key"
    shutil.copy(certs.server_key, key)
    os.chmod(key, key_mode)
    return certs, cert, key


def _sidecar(tmp_path, cert, key) -> Sidecar:
    address = f"127.0.0.1:{free_port()}"
    config = (f'[[auth.tokens]]\ntoken = "{TOKEN}"\nadmin = true\n'
              f'[[listen]]\naddress = "{address}"\ncert = "{cert}"\nkey = "{key}"\n')
    s = Sidecar(tmp_path / "data", config=config, workers=1)
    s.tls_target = address
    return s


def test_a_renewed_certificate_is_served_from_the_next_connection_without_a_restart(tmp_path):
    """The files were read once, at the bind: a certificate renewed in place
    went on being refused (here: expired) until the sidecar was restarted,
    a drain of every turn for each renewal. Now a connection made after the
    renewal gets the new one; a renewal that does not load as a pair (a
    certificate of another key) leaves the last good one served."""
    certs, cert, key = _served(tmp_path, 0o600)
    certs.reissue(cert, days=0)  # expired as it is made
    with _sidecar(tmp_path, cert, key) as s:
        with pytest.raises(asc.SidecarError) as e:
            asyncio.run(_session_id(s.tls_target, certs.ca))
        assert e.value.code == grpc.StatusCode.UNAVAILABLE and "expired" in str(e.value), e.value
        renewed = certs.reissue(tmp_path / "renewed.pem", days=2)
        os.replace(renewed, cert)  # as certbot and a mounted Secret do: a whole new file
        first = asyncio.run(_session_id(s.tls_target, certs.ca))
        shutil.copy(certs.client_cert, tmp_path / "other.pem")  # a certificate of another key
        os.replace(tmp_path / "other.pem", cert)
        assert asyncio.run(_session_id(s.tls_target, certs.ca)) == first


def test_an_expired_certificate_and_a_key_others_can_read_are_told_at_the_start(tmp_path):
    """Both load (the pair matches) and were served without a word: every
    client then failed its handshake (UNAVAILABLE) with nothing in the
    sidecar's log, and the key sat open to every user of the machine. The
    log lines are the behaviour here."""
    certs, cert, key = _served(tmp_path, 0o644)
    certs.reissue(cert, days=0)
    with _sidecar(tmp_path, cert, key) as s:
        (expired,) = log_lines(s, "a TLS listener's certificate is not valid now: clients refuse it")
        (exposed,) = log_lines(s, "a TLS listener's private key is readable by every user")
    assert expired["listen"] == s.tls_target and expired["cert"] == str(cert), expired
    assert "expired at " in expired["problem"], expired
    assert exposed["key"] == str(key) and "0644" in exposed["problem"], exposed

"""A TLS listener's files as an operator's tools handle them (docs/security.md,
"TLS and mTLS"): files no client would take, or that expose the key, are said
so in the log when they are read. Certificates made by helpers.certs."""

from __future__ import annotations

import os
import shutil

import pytest
from helpers.certs import available, make_certs
from helpers.logs import log_lines
from sidecar_proc import TOKEN, Sidecar, free_port

pytestmark = pytest.mark.skipif(not available(), reason="the openssl command is not installed")


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

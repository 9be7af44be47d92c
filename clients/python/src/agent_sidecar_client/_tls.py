"""TLS for the client's channel, and the rule that keeps the bearer token off
the network in cleartext.

The sidecar serves TLS (and mTLS) on the TCP listeners its operator gives a
certificate (``[[listen]] cert/key/client_ca``). A token is a password: sent
over a plain channel to another machine, anyone on the path can read it and
reuse it. So a client given a token refuses a plain channel to a host that is
not loopback unless told ``insecure=True``; a Unix socket and 127.0.0.1 need
no TLS (nothing leaves the machine).
"""

from __future__ import annotations

import ipaddress
import os
from typing import Union

import grpc

#: A PEM file's path, or its content as bytes.
PemSource = Union[str, "os.PathLike[str]", bytes]


def _pem(name: str, source: PemSource | None) -> bytes | None:
    """The PEM bytes of ``source`` (read from its path); ValueError naming
    ``name`` for an empty path, which an unset variable gives: it read as
    "No such file or directory: ''", naming no option."""
    if source is None or isinstance(source, bytes):
        return source
    if os.fspath(source) == "":
        raise ValueError(f"{name}: an empty path (give the PEM file's path, or its content as bytes)")
    with open(source, "rb") as f:
        return f.read()


def tls_credentials(ca_file: PemSource | None = None, cert_file: PemSource | None = None,
                    key_file: PemSource | None = None) -> grpc.ChannelCredentials:
    """Channel credentials for a TLS listener: ``ca_file`` the CA certificates
    that verify the sidecar's certificate (None: the system's roots);
    ``cert_file`` and ``key_file`` the client certificate a listener with a
    client CA requires (mTLS), both or neither. Paths, or PEM bytes."""
    if (cert_file is None) != (key_file is None):
        raise ValueError("cert_file and key_file go together (the client certificate and its key)")
    roots, chain, key = _pem("ca_file", ca_file), _pem("cert_file", cert_file), _pem("key_file", key_file)
    return grpc.ssl_channel_credentials(root_certificates=roots, private_key=key, certificate_chain=chain)


def is_local_target(target: str) -> bool:
    """Whether ``target`` only reaches this machine: a Unix socket, or a TCP
    address whose host is ``localhost`` or a loopback IP (127.0.0.0/8, ::1)."""
    if target.startswith(("unix:", "unix-abstract:")):
        return True
    for scheme in ("dns:///", "dns:", "ipv4:", "ipv6:"):
        if target.startswith(scheme):
            target = target[len(scheme):]
            break
    host = target.rsplit(":", 1)[0].strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_cleartext(target: str, token: str | None, secure: bool, insecure: bool) -> None:
    """Raise ValueError when ``token`` would travel in cleartext to another machine."""
    if token and not secure and not insecure and not is_local_target(target):
        raise ValueError(
            f"refusing to send the bearer token in cleartext to {target}: connect with TLS "
            "(tls=True, ca_file=...) to a TLS listener, or pass insecure=True to send it anyway")

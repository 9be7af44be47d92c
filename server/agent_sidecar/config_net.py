"""The config sections about reaching the sidecar and being reached:
listeners (TLS, mTLS), bearer tokens, the cluster's peers and the metrics
endpoint. Each checks what it can at load (an address's form, a PEM file's
readability, a certificate against its key, a token a client could send), so
a listener that could never serve, or a token no client could present, is a
config error at start. Declared as config_schema.py says; config.py gathers
them into Config."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .config_checks import host_port, metadata_safe, unix_path
from .config_schema import key


def listen_address(value: str) -> str | None:
    """`unix:PATH` or `HOST:PORT`, as `--listen` and `[[listen]] address` take it."""
    if value.startswith("unix:"):
        return unix_path(value[5:])
    why = host_port(value)
    return f"expected unix:PATH or HOST:PORT ({why})" if why else None


@dataclass
class AuthToken:
    token: str = key("", required=True, secret=True, check=lambda t: _bearer(t), doc="a bearer token")
    platforms: list[str] = key(["*"], nonempty=True, fold="lower",
                               doc="the platforms the token may act on (`*`: all)")
    admin: bool = key(False, doc="may call ClearAllSessions, PruneSessions, delete any session")


@dataclass
class ClusterConfig:
    """This sidecar among several on one PostgreSQL database."""
    node_id: str = key("", doc="this sidecar's name in the cluster, unique (default: the host name "
                               "and the data dir)")
    advertise: str = key("", check=lambda a: host_port(a, port0=False) if a else None,
                         doc="`host:port` where the other sidecars reach this one (a TCP listener "
                             "of this sidecar); set, it makes this sidecar a cluster node "
                             "(unset: it runs alone on its database)")
    token: str = key("", secret=True, check=lambda t: _bearer(t),
                     doc="the bearer token sidecars present to each other "
                         "(an admin token of every sidecar's [[auth.tokens]])")
    lease_ttl_s: float = key(10.0, ge=1, le=86400, doc="a lane's lease lasts this long unless renewed "
                                             "(renewed every third of it)")
    ca_file: str = key("", check=lambda p: _pem_file(p),
                       doc="PEM CA certificates of the other sidecars' TLS listeners: calls forwarded "
                           "to them use TLS (empty: plaintext, for loopback or a private network)")
    cert_file: str = key("", check=lambda p: _pem_file(p),
                         doc="PEM client certificate this sidecar presents to the others (their mTLS)")
    key_file: str = key("", check=lambda p: _pem_file(p), doc="PEM private key of `cert_file`")

    def _validate(self) -> Iterator[tuple[str, str, Any]]:
        if bool(self.cert_file) != bool(self.key_file):
            yield ("key_file" if self.cert_file else "cert_file"), \
                "cert_file and key_file go together (a client certificate and its key)", ""
        if self.cert_file and not self.ca_file:
            yield "ca_file", "required with cert_file (client certificates are for TLS)", ""
        from .tls import client_problems
        for name, problem in client_problems(self.ca_file, self.cert_file, self.key_file):
            yield name, problem, ""


def _pem_file(path: str) -> str | None:
    """A listener's PEM file must be readable ("" is not given: no TLS)."""
    from .tls import readable
    return readable(path) if path else None


@dataclass
class Listener:
    """``[[listen]]``: a listener with settings of its own. With ``cert`` and
    ``key`` a TCP listener serves TLS; with ``client_ca`` too, every client
    must present a certificate that CA signed (mTLS). Bearer tokens are
    needed on TCP either way (docs/security.md)."""
    address: str = key("", required=True, check=listen_address,
                       doc="`HOST:PORT` (or `unix:PATH`, without TLS)")
    cert: str = key("", check=_pem_file,
                    doc="PEM certificate chain of the listener: it serves TLS (needs `key`)")
    client_ca: str = key("", check=_pem_file,
                         doc="PEM CA certificates: clients must present a certificate one of them "
                             "signed (mTLS; needs `cert` and `key`)")
    # Declared last: the name shadows key() in the class body.
    key: str = key("", check=_pem_file, doc="PEM private key of `cert`, unencrypted")

    @property
    def tls(self) -> bool:
        return bool(self.cert)

    def _validate(self) -> Iterator[tuple[str, str, Any]]:
        if self.key and not self.cert:
            yield "cert", "required with key (the certificate of that key)", ""
        if self.cert and not self.key:
            yield "key", "required with cert (the certificate's private key)", ""
        if self.client_ca and not (self.cert or self.key):
            yield "cert", "required with client_ca (mTLS is TLS with client certificates)", ""
        if self.cert and self.address.startswith("unix:"):
            yield "address", "TLS is for TCP listeners (HOST:PORT)", self.address
        if self.cert and self.key:
            from .tls import check_pair
            for name, problem in check_pair(self.cert, self.key, self.client_ca):
                yield name, problem, getattr(self, name)


def _bearer(token: str) -> str | None:
    """A token a client can send: gRPC metadata carries printable ASCII only."""
    if not metadata_safe(token):
        return "must be printable ASCII (what gRPC metadata carries; no client could send it)"
    if token != token.strip():
        return "may not begin or end with a space (the sidecar strips what a client sends: it would never match)"
    return None


def _metrics_address(value: str) -> str | None:
    if not value:
        return None  # off
    why = host_port(value)
    return f"expected HOST:PORT, e.g. 127.0.0.1:9464 (empty: off; {why})" if why else None


@dataclass
class MetricsConfig:
    """The Prometheus endpoint ([operations.md](operations.md#metrics))."""
    listen: str = key("", check=_metrics_address,
                      doc="`HOST:PORT` of the HTTP listener serving `/metrics` (empty: off); "
                          "unauthenticated, so keep it on a private address")

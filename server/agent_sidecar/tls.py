"""TLS material of a listener: its PEM files checked when the config loads,
read when the server binds; what counts as a loopback address; and the shape
of a client's material as plain bytes (``ClientMaterial``).

Why check at load: gRPC meets the files only when the port is added, after
the store and the workers have started, and a key that does not belong to its
certificate, a truncated file or an encrypted key then fails as "Failed to
bind to address" (the reason only in gRPC's own debug log). The standard
library's ``ssl`` parses the same PEM with OpenSSL, so ``agent-sidecar config
check`` and ``serve`` refuse such a listener before anything starts, naming
the key (``listen[1].key``). A PEM file is read only when it is a regular
file of at most MAX_PEM_BYTES (config_loader.read_file): ``/dev/zero`` or a
FIFO is refused, never read without end.

A bound listener follows its files (``ServerFiles``): a renewed certificate
(certbot, cert-manager, a mesh's short-lived ones) is served from the next
connection on, without the restart and drain it used to need; what every
client would refuse (an expired certificate) or what exposes the key (a key
file other users may read) is a warning when the files are read.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import time
from typing import Any

from .config_loader import file_problem, read_file

log = logging.getLogger("agent_sidecar.tls")

_CERT = b"-----BEGIN CERTIFICATE-----"
_KEY = b"PRIVATE KEY-----"

# A client's TLS as plain bytes, in grpc.ssl_channel_credentials' order: (root
# certificates, private key, certificate chain). Bytes pickle; grpc's
# credentials object does not.
ClientMaterial = tuple[bytes | None, bytes | None, bytes | None]

MAX_PEM_BYTES = 4 * 1024 * 1024  # a CA bundle is a few hundred KB


def readable(path: str) -> str | None:
    """None when ``path`` is a PEM file this process can read (a regular file
    of at most MAX_PEM_BYTES), else the problem."""
    try:
        read_pem(path)
    except OSError as e:
        return file_problem(e)
    return None


def _ssl_problem(e: Exception) -> str:
    import ssl
    if isinstance(e, ssl.SSLError) and e.reason:
        return e.reason.lower().replace("_", " ")
    return getattr(e, "strerror", None) or str(e)


def check_pair(cert: str, key: str, client_ca: str) -> list[tuple[str, str]]:
    """(key name, problem) for a certificate chain and private key that do not
    load as a server's pair, or a client CA file that holds no certificate."""
    import ssl
    problems: list[tuple[str, str]] = []
    pem = {}
    for name, path in (("cert", cert), ("key", key), ("client_ca", client_ca)):
        try:
            pem[name] = read_pem(path) if path else b""
        except OSError as e:  # changed since its key's own check read it
            return [(name, file_problem(e))]
    cert_pem, key_pem, ca_pem = pem["cert"], pem["key"], pem["client_ca"]
    if _CERT not in cert_pem:
        problems.append(("cert", "not a PEM certificate (no BEGIN CERTIFICATE block)"))
    if _KEY not in key_pem:
        problems.append(("key", "not a PEM private key (no BEGIN PRIVATE KEY block)"))
    elif b"ENCRYPTED" in key_pem:
        problems.append(("key", "an encrypted private key (give it unencrypted, readable only by the sidecar)"))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    if not problems:
        try:
            ctx.load_cert_chain(cert, key, password=lambda: b"")
        except (ssl.SSLError, OSError) as e:
            problems.append(("key", f"does not load as the private key of cert ({_ssl_problem(e)})"))
    problem = ca_problem(client_ca, ca_pem) if client_ca else None
    if problem:
        problems.append(("client_ca", problem))
    return problems


def client_problems(ca_file: str, cert_file: str, key_file: str) -> list[tuple[str, str]]:
    """(key name, problem) for what a client presents and trusts ([cluster]'s
    ``ca_file``, ``cert_file``, ``key_file``): the pair must load, the CA file
    hold certificates."""
    if cert_file and key_file:
        named = {"cert": "cert_file", "key": "key_file", "client_ca": "ca_file"}
        return [(named[name], problem) for name, problem in check_pair(cert_file, key_file, ca_file)]
    problem = ca_problem(ca_file) if ca_file else None
    return [("ca_file", problem)] if problem else []


def ca_problem(path: str, pem: bytes | None = None) -> str | None:
    """Why the file ``path`` (its bytes ``pem``, when read already) is no PEM
    file of CA certificates, or None."""
    import ssl
    try:
        pem = read_pem(path) if pem is None else pem
    except OSError as e:
        return file_problem(e)
    if _CERT not in pem:
        return "not a PEM file of CA certificates (no BEGIN CERTIFICATE block)"
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=path)
    except (ssl.SSLError, OSError) as e:
        return f"not a PEM file of CA certificates ({_ssl_problem(e)})"
    return None


def read_pem(path: str) -> bytes:
    """A PEM file's bytes; OSError unless it is a regular file of at most MAX_PEM_BYTES."""
    return read_file(path, MAX_PEM_BYTES)


def host_of(address: str) -> str:
    """The host part of ``HOST:PORT`` (``[::1]:5`` -> ``::1``)."""
    return address.rsplit(":", 1)[0].strip("[]")


def is_loopback(host: str) -> bool:
    """Whether ``host`` only reaches this machine: ``localhost`` or a loopback
    IP (127.0.0.0/8, ::1). A wildcard (0.0.0.0, ::) or any other name is not."""
    if host.lower() == "localhost" or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def target_is_local(target: str) -> bool:
    """Whether a gRPC target only reaches this machine: a Unix socket, or a
    TCP address on a loopback host (``localhost:5``, ``127.0.0.1:5``,
    ``[::1]:5``, with or without a ``dns:``/``ipv4:``/``ipv6:`` scheme)."""
    if target.startswith(("unix:", "unix-abstract:")):
        return True
    for scheme in ("dns:///", "dns:", "ipv4:", "ipv6:"):
        if target.startswith(scheme):
            target = target[len(scheme):]
            break
    return is_loopback(host_of(target))


def _validity(path: str) -> tuple[float, float] | None:
    """(not before, not after) of the file's first certificate, the leaf, in
    Unix time; None when it cannot be read. The standard library decodes it
    (a private helper of ``ssl``, present since 3.4: without it, no check)."""
    import ssl
    decode = getattr(ssl._ssl, "_test_decode_cert", None)  # type: ignore[attr-defined]
    if decode is None:
        return None
    try:
        d = decode(path)
        return ssl.cert_time_to_seconds(d["notBefore"]), ssl.cert_time_to_seconds(d["notAfter"])
    except (ssl.SSLError, OSError, KeyError, ValueError):
        return None


def serving_problems(cert: str, key: str) -> list[tuple[str, str]]:
    """(key name, problem) for files that load as a pair but that no client
    would take, or that expose the key: a certificate expired or not valid
    yet (every client verifying it refuses the handshake: UNAVAILABLE, with
    nothing in the sidecar's own log), a key file other users may read."""
    out: list[tuple[str, str]] = []
    validity, now = _validity(cert), time.time()
    if validity is not None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(validity[1] if now > validity[1] else validity[0]))
        if now > validity[1]:
            out.append(("cert", f"expired at {stamp}: clients refuse it"))
        elif now < validity[0]:
            out.append(("cert", f"not valid before {stamp}: clients refuse it"))
    try:
        mode = os.stat(key).st_mode
    except OSError:
        return out
    if mode & 0o004:
        out.append(("key", f"readable by every user (mode {mode & 0o777:04o}): chmod o-r, or 0600"))
    return out


# The warning for each kind of problem serving_problems finds.
_SERVING_PROBLEM = {"cert": "a TLS listener's certificate is not valid now: clients refuse it",
                    "key": "a TLS listener's private key is readable by every user"}


def warn_serving_problems(address: str, cert: str, key: str) -> None:
    """A warning for each of serving_problems, naming the listener and the file."""
    for name, problem in serving_problems(cert, key):
        log.warning(_SERVING_PROBLEM[name], extra={"listen": address, name: cert if name == "cert" else key,
                                                   "problem": problem})


def _stamp(paths: tuple[str, ...]) -> tuple[Any, ...]:
    """What tells a file was replaced or rewritten (a symlink swapped, as
    Kubernetes updates a mounted Secret, included): its inode, size and mtime."""
    out: list[Any] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append(None)
        else:
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


class ServerFiles:
    """A TLS listener's certificate, key and client CA, as gRPC's credentials
    that read them again when they change.

    gRPC asks ``fetch`` before each new connection's handshake: it answers
    None (keep what is served) unless a file changed since it was last read,
    a few ``stat`` calls. A changed set is checked as at load (check_pair);
    one that does not load as a pair (a key renewed after its certificate, a
    file half written) is told once and the previous one stays until the
    files change again. Connections open keep the certificate of their
    handshake."""

    def __init__(self, address: str, cert: str, key: str, client_ca: str):
        self.address, self.cert, self.key, self.client_ca = address, cert, key, client_ca
        self._paths = (cert, key, client_ca) if client_ca else (cert, key)
        self._seen = _stamp(self._paths)

    def credentials(self) -> Any:
        import grpc
        return grpc.dynamic_ssl_server_credentials(self._configuration(), self.fetch,
                                                   require_client_authentication=bool(self.client_ca))

    def _configuration(self) -> Any:
        import grpc
        warn_serving_problems(self.address, self.cert, self.key)
        roots = read_pem(self.client_ca) if self.client_ca else None
        return grpc.ssl_server_certificate_configuration([(read_pem(self.key), read_pem(self.cert))],
                                                         root_certificates=roots)

    def fetch(self) -> Any:
        """The configuration to serve from this connection on, or None for
        no change. Never raises: a failure here would fail the handshake."""
        try:
            stamp = _stamp(self._paths)
            if stamp == self._seen:
                return None
            self._seen = stamp
            problems = check_pair(self.cert, self.key, self.client_ca)
            if problems:
                log.warning("renewed TLS files do not load: the previous certificate is still served",
                            extra={"listen": self.address, "problems": dict(problems)})
                return None
            config = self._configuration()
            log.info("TLS certificate reloaded", extra={"listen": self.address, "cert": self.cert})
            return config
        except Exception as e:  # a file gone between the stat and the read
            log.warning("renewed TLS files do not load: the previous certificate is still served",
                        extra={"listen": self.address, "problems": {"error": f"{type(e).__name__}: {e}"}})
            return None

"""Where a command reaches a sidecar: the target forms every client takes,
read once, here, for every command that talks to a running sidecar
(``health``, ``status``, ``sessions``, ``bench``).

The forms are the clients' shared grammar (clients/conformance/README.md,
"Target forms"; the Python client's ``normalize_target`` is the reference,
and tests/cli check this reading against the same ``target_forms`` table the
Go and Node clients are held to): ``unix:PATH``, ``unix:///ABS/PATH``,
``unix-abstract:NAME``, a bare socket path (``/abs``, ``./rel``, ``../rel``),
``HOST:PORT``, ``[IPV6]:PORT``, ``tcp:HOST:PORT`` (``tcp://HOST:PORT``) and
``dns:[//AUTHORITY/]HOST:PORT``; a port is always given (1 to 65535).
Anything else is refused at once, naming what is wrong, where gRPC would
take it and fail later: a socket path without ``unix:`` was looked up as a
host name (UNAVAILABLE "Domain name not found"), a port past 65535 wrapped
to another port. The server does not depend on the client package (the
image has no client), so the reading is its own; no grpc is imported (the
commands quieten gRPC's C core before it loads).
"""

from __future__ import annotations

import ipaddress
import os
import re
import urllib.parse

from .config_checks import UNIX_PATH_MAX

FORMS = ("unix:PATH, unix:///ABS/PATH, a bare socket path (/abs/path, ./rel/path, ../rel/path), "
         "HOST:PORT, [IPV6]:PORT, tcp:HOST:PORT (or tcp://HOST:PORT), dns:[//AUTHORITY/]HOST:PORT")
_HOST_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._")


def dial(target: str) -> str:
    """The gRPC target that reaches ``target`` (one of the forms), or
    ValueError saying what is wrong with it and which forms there are."""

    def bad(why: str) -> ValueError:
        return ValueError(f"{target[:120]!r} {why}; expected one of {FORMS}")

    if target.strip() == "":
        raise bad("is empty")
    if target != target.strip():
        raise bad("has leading or trailing whitespace")
    t = "unix:" + target if target.startswith(("/", "./", "../")) else target
    scheme, sep, rest = t.partition(":")
    if sep and scheme in ("unix", "unix-abstract"):
        return _unix(scheme, rest, bad)
    if sep and scheme == "tcp":
        address = rest[2:] if rest.startswith("//") else rest
        _check_host_port(address, bad)
        return address
    if sep and scheme == "dns":
        _check_host_port(_dns_address(rest), bad)
        return t
    if sep and scheme.lower() in ("ipv4", "ipv6"):  # gRPC's own: read as host "ipv4", it was told of brackets
        raise bad(f"has gRPC's {scheme}: scheme, which no client dials: give the address alone "
                  "(HOST:PORT, [IPV6]:PORT)")
    if "://" in t or (sep and not rest[:1].isdigit() and not t.startswith("[")):
        raise bad("has a scheme no client dials")
    _check_host_port(t, bad)
    return t


def address(target: str) -> str:
    """Where ``target`` connects: ``unix:PATH`` (``unix-abstract:NAME``) or
    ``HOST:PORT`` (``[V6]:PORT``), its gRPC target with a ``dns:`` scheme and
    authority dropped: for the checks that ask where it leads (is it this
    host, a socket, which process listens there). ValueError as ``dial``."""
    t = dial(target)
    return _dns_address(t[len("dns:"):]) if t.startswith("dns:") else t


def is_unix(target: str) -> bool:
    """Whether ``target`` (one of the forms) is a Unix socket, however spelled."""
    return address(target).startswith(("unix:", "unix-abstract:"))


def _unix(scheme: str, rest: str, bad) -> str:
    if rest.startswith("//"):  # unix://[authority]/path: the path keeps its "/"
        slash = rest.find("/", 2)
        rest = "" if slash < 0 else rest[slash:]
    path = rest.split("?", 1)[0].split("#", 1)[0]
    if path in ("", "/"):
        raise bad("has no socket path")
    raw = urllib.parse.unquote_to_bytes(path.encode("utf-8", "surrogateescape"))
    if len(raw) > UNIX_PATH_MAX:
        raise ValueError(f"a Unix socket path may be at most {UNIX_PATH_MAX} bytes; this one is {len(raw)}")
    if scheme == "unix" and os.path.isdir(raw):  # a sidecar's data dir given for its socket
        raise ValueError(f"{path} is a directory, not a socket (a sidecar listens on sidecar.sock in its data dir)")
    return f"{scheme}:{rest}"  # without an authority, which gRPC's core will not dial


def _dns_address(rest: str) -> str:
    """``HOST:PORT`` of what follows ``dns:``: ``[//AUTHORITY/]HOST:PORT``."""
    if rest.startswith("//"):
        slash = rest.find("/", 2)
        return "" if slash < 0 else rest[slash + 1:]
    return rest


def _check_host_port(hostport: str, bad) -> None:
    if hostport.startswith("["):
        host, close, port = hostport[1:].partition("]")
        if not close or not port.startswith(":"):
            raise bad("is not [ipv6]:port")
        port = port[1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise bad(f"has {host!r}, which is no IPv6 address") from None
    else:
        host, sep, port = hostport.rpartition(":")
        if not sep:
            raise bad("has no port (host:port)")
        if ":" in host:
            raise bad("is not host:port (an IPv6 address goes in brackets: [::1]:50051)")
        if host == "" or not set(host) <= _HOST_CHARS or host.strip(".") == "":
            raise bad("has no valid host (host:port)")
    if not (port.isdigit() and port.isascii() and 1 <= int(port) <= 65535):
        raise bad(f"has port {port!r}; a port is 1..65535")


# gRPC's text for a TCP connection closed as it was set up, after TCP (and
# TLS) but before HTTP/2 began: all gRPC says (a Unix socket has no TLS).
_CLOSED_AT_SETUP = re.compile(r"last error: \w+: ipv[46]:\S+: Socket closed$")
_CLOSED = "; the connection was closed as it was set up: "
_PROXY = ", and a proxy in front of a sidecar that is down closes every connection"


def setup_hint(details: str, tls: bool, client_cert: bool) -> str:
    """What a command adds to gRPC's ``details`` of a failed connection:
    the likely causes, in its options' words, when the connection was closed
    as it was set up (else ""). That is all a TLS listener dialled without
    TLS shows through gRPC, and all an mTLS listener turning a client away
    (no client certificate, or one its client_ca did not sign) shows: its
    TLS 1.3 handshake is over on the client's side when it refuses. ``tls``:
    the command dialled with TLS; ``client_cert``: with --cert and --key."""
    if not _CLOSED_AT_SETUP.search(details):
        return ""
    if not tls:
        return _CLOSED + "a TLS listener closes a client without TLS so (use --tls, or --ca)" + _PROXY
    if client_cert:
        return (_CLOSED + "an mTLS listener (one with a client_ca) refuses so a client certificate its "
                "client_ca did not sign (check --cert)" + _PROXY)
    return (_CLOSED + "an mTLS listener (one with a client_ca) refuses so a client without a client "
            "certificate (give --cert and --key)" + _PROXY)

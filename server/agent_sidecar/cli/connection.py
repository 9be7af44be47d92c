"""How every command that talks to a running sidecar reaches it: the target
options (``--target``, ``--token`` or ``--token-file``, ``--tls``, ``--ca``, ``--cert``/``--key``,
``--server-name``, ``--insecure``) and the channel they describe, built here
and nowhere else (health, sessions, status and bench take the same options).

The bearer token is a password: it is never sent in cleartext to another
machine by accident. A token over a plain TCP channel to a host that is not
loopback is refused unless ``--insecure`` says so (docs/security.md). Read
from a file (``--token-file``), it stays out of ``ps``, ``/proc/PID/cmdline``
and the shell's history, where ``--token`` puts it.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..config_loader import MAX_SECRET_BYTES, read_file
from ..targets import address, dial, is_unix, setup_hint
from ..tls import ClientMaterial, target_is_local
from .argtypes import file_name, target, token, utf8

DEFAULT_TARGET = "unix:./data/sidecar.sock"


class TargetError(Exception):
    """Target options that cannot work together, or a file that cannot be read: one line."""


TARGET_HELP = ("the sidecar's address: a socket path, unix:PATH, HOST:PORT, [IPV6]:PORT, tcp:HOST:PORT or "
               "dns:[//AUTHORITY/]HOST:PORT, as every client takes (docs/configuration.md)")


def add_target_arguments(parser: Any, default: str = DEFAULT_TARGET, target_help: str = TARGET_HELP,
                         target_type: Any = target) -> None:
    """The target options on ``parser`` (a parser or an argument group);
    ``target_type`` reads ``--target`` (one address; the bench's, several: argtypes.target_list)."""
    parser.add_argument("--target", type=target_type, default=default, help=f"{target_help} (default {default})")
    given = parser.add_mutually_exclusive_group()
    given.add_argument("--token", type=token, default=None, help="bearer token (TCP; --token-file keeps it out of ps)")
    given.add_argument("--token-file", dest="token", type=token_file, metavar="FILE",
                       help="read the bearer token from FILE (its first line)")
    parser.add_argument("--tls", action="store_true",
                        help="TLS to the target (the system's roots unless --ca)")
    parser.add_argument("--ca", "--ca-cert", dest="ca_file", type=file_name, default=None, metavar="FILE",
                        help="PEM CA certificates that verify the target's certificate (implies --tls)")
    parser.add_argument("--cert", dest="cert_file", type=file_name, default=None, metavar="FILE",
                        help="PEM client certificate, for a listener that requires one (mTLS; with --key)")
    parser.add_argument("--key", dest="key_file", type=file_name, default=None, metavar="FILE",
                        help="PEM private key of --cert")
    parser.add_argument("--server-name", "--tls-server-name", dest="server_name", type=utf8, default=None,
                        help="the name to expect in the target's certificate (default: the target's host)")
    parser.add_argument("--insecure", action="store_true",
                        help="allow --token over plain TCP to a host that is not loopback (cleartext)")
    parser.set_defaults(quiet_grpc=True)  # main() quietens gRPC's C core for these commands


def quiet_grpc_core() -> None:
    """Keep gRPC's C core from logging below ERROR, unless GRPC_VERBOSITY is
    set: it logs each failed TLS handshake of a connection attempt to stderr
    at INFO (one line per attempt, a dozen while a channel is waited for),
    and the command's own line already says why (the CA, the name, no client
    certificate). Read once, when grpc first loads: main() calls this
    before any command that takes the target options runs, so sessions,
    health, status and bench (and the bench's --clients processes, which
    inherit the environment) are quiet alike."""
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


def token_file(path: str) -> str:
    """The token in the file ``path``: its first line, which must be a token.
    Read as the config reads a ``token_file`` (config_loader.read_file), at
    most 64 KiB: ``/dev/zero`` or a log given by mistake is refused, where a
    line without end was read into memory until the machine ran out. A pipe
    is read too (``--token-file <(pass show sidecar)``)."""
    try:
        data = read_file(path, MAX_SECRET_BYTES, regular=False)
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {e.strerror}" if e.strerror else str(e)) from None
    first = data.decode("utf-8", errors="replace").split("\n", 1)[0].strip()
    if not first:
        raise argparse.ArgumentTypeError(f"{path} holds no token (its first line is empty)")
    return token(first)


def uses_tls(args: argparse.Namespace) -> bool:
    return bool(args.tls or args.ca_file or args.cert_file or args.key_file)


def credentials(args: argparse.Namespace) -> tuple[Any, tuple[tuple[str, str], ...]]:
    """(grpc.ChannelCredentials or None for a plain channel, channel options)
    of the target options; TargetError when they do not fit together."""
    material, options = tls_material(args)
    if material is None:
        return None, ()
    import grpc
    return grpc.ssl_channel_credentials(*material), options


def tls_material(args: argparse.Namespace) -> tuple[ClientMaterial | None, tuple[tuple[str, str], ...]]:
    """What ``credentials`` is built from, as plain bytes: ((root
    certificates, private key, certificate chain) or None for a plain
    channel, channel options). For a caller that builds its channels in
    other processes (the bench's ``--clients``): grpc's credentials do not
    pickle."""
    if bool(args.cert_file) != bool(args.key_file):
        raise TargetError("--cert and --key go together")
    if not uses_tls(args):
        if args.token and not args.insecure and not target_is_local(address(args.target)):
            raise TargetError(f"refusing to send --token in cleartext to {args.target}: use --tls "
                              "(and --ca) for a TLS listener, or --insecure to send it anyway")
        return None, ()
    if is_unix(args.target):
        raise TargetError("TLS is for TCP targets (HOST:PORT), not a Unix socket")
    try:
        roots, cert, key = (_read(path) for path in (args.ca_file, args.cert_file, args.key_file))
    except OSError as e:
        raise TargetError(f"cannot read {e.filename}: {e.strerror}") from None
    options = (("grpc.ssl_target_name_override", args.server_name),) if args.server_name else ()
    return (roots, key, cert), options


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


def open_channel(args: argparse.Namespace) -> Any:
    """A blocking grpc.Channel to ``args.target`` (read by targets.dial, as
    every command reads it) as the target options say."""
    import grpc
    creds, options = credentials(args)
    if creds is None:
        return grpc.insecure_channel(dial(args.target))
    return grpc.secure_channel(dial(args.target), creds, options=options)


def call_metadata(args: argparse.Namespace) -> list[tuple[str, str]] | None:
    return [("authorization", f"Bearer {args.token}")] if args.token else None


def failure(args: argparse.Namespace, error: Any) -> str:
    """``CODE: details`` of a failed call (a grpc.RpcError) on the channel of
    the target options, with the likely causes spelt out in the options'
    words when the connection was closed as it was set up (a TLS listener
    dialled without --tls, an mTLS listener refusing the client certificate:
    targets.setup_hint), where gRPC says only "Socket closed"."""
    details = error.details() or ""
    return f"{error.code().name}: {details}{setup_hint(details, uses_tls(args), bool(args.cert_file))}"

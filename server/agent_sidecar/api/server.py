"""Assemble the grpc.aio server: our services, health, reflection, listeners;
and keep gRPC's helper threads from preempting the event loop.

Why ``calm_grpc_threads``: every RPC of a grpc.aio server passes through the
one event-loop thread; gRPC's own threads (the completion-queue poller, the
event engine's pool, its timer) wake once per completed operation. At equal
priority each wake-up preempts the loop thread wherever it runs, several
times per turn, and the loop pays the kernel's context-switch paths each
time. ``SCHED_BATCH`` (Linux) keeps those threads' fair share of the CPU but
tells the scheduler their wake-ups need not preempt anyone: they run on an
idle core or at the loop's next tick (what it gains: benchmarks/README.md).
Threads gRPC starts later are started by its own threads and inherit the
policy; the loop thread, the children and threads started from the loop
later (store reads) keep the default one.

Every service reaches the server as generic handlers only (ours through the
Boundary, health and reflection through ``GenericOnly``, whose docstring says
why: a call's cost does not then grow with the number of methods).
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import threading
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

from ..cluster.forward import PING_FLOOR_MS
from ..config import Config, Listener
from ..obs.rpc import interceptors
from ..tls import ServerFiles, host_of, is_loopback
from ..v1 import (
    prompt_service_pb2,
    prompt_service_pb2_grpc,
    session_service_pb2,
    session_service_pb2_grpc,
    status_service_pb2,
    status_service_pb2_grpc,
    tool_service_pb2,
    tool_service_pb2_grpc,
)
from .auth import AnonymousStreams
from .boundary import Boundary, parsed_only
from .caps import Caps
from .request_budget import RequestBudget

_ADD = {"SessionService": session_service_pb2_grpc.add_SessionServiceServicer_to_server,
        "PromptService": prompt_service_pb2_grpc.add_PromptServiceServicer_to_server,
        "ToolService": tool_service_pb2_grpc.add_ToolServiceServicer_to_server,
        "StatusService": status_service_pb2_grpc.add_StatusServiceServicer_to_server}

log = logging.getLogger("agent_sidecar")

_SERVICE_MODULES = (session_service_pb2, prompt_service_pb2, tool_service_pb2, status_service_pb2)
SERVICE_NAMES = (
    session_service_pb2.DESCRIPTOR.services_by_name["SessionService"].full_name,
    prompt_service_pb2.DESCRIPTOR.services_by_name["PromptService"].full_name,
    tool_service_pb2.DESCRIPTOR.services_by_name["ToolService"].full_name,
    status_service_pb2.DESCRIPTOR.services_by_name["StatusService"].full_name,
)

# Frames and transcripts can be large; keepalive pings keep idle watch streams
# (adapters waiting for auto-resumed turns) alive through NATs and proxies.
# Clients may ping as often as once a second: the other nodes of a cluster do,
# on short lease TTLs, to find a holder that stopped answering
# (cluster/forward.py holder_keepalive). The receive limit depends on the
# config: server_options().
SERVER_OPTIONS = [
    ("grpc.max_send_message_length", 32 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", PING_FLOOR_MS),
    ("grpc.so_reuseport", 0),
]


def _prepare_unix(path: str) -> None:
    """Remove a stale socket file; refuse if another sidecar is listening on
    it, or if the path is anything but a socket (a file the operator named by
    mistake is never deleted)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise RuntimeError(f"{path} exists and is not a socket; refusing to replace it")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError:
        os.unlink(path)
        return
    finally:
        s.close()
    raise RuntimeError(f"another process is listening on {path}")


def server_options(caps: Caps, listeners: int = 1, open_files: int | None = None) -> list[tuple[str, int]]:
    """SERVER_OPTIONS plus the receive limit: the largest request any RPC of
    ours accepts (each RPC refuses more than its own, smaller share itself:
    api/boundary.py). Past it gRPC refuses the message unread. And the
    connections each of ``listeners`` keeps open at once (connection_cap)."""
    largest = max(caps.request_limit(m.input_type)
                  for pb in _SERVICE_MODULES for service in pb.DESCRIPTOR.services_by_name.values()
                  for m in service.methods)
    return SERVER_OPTIONS + [("grpc.max_receive_message_length", largest),
                             ("grpc.max_allowed_incoming_connections", connection_cap(listeners, open_files))]


# Open files kept for the sidecar's own use whatever its clients do: pipes to
# its workers and writer (a crashed one is respawned through new ones), the
# store's files and connections, the metrics endpoint, the cluster's channels.
MIN_FD_RESERVE = 512
MIN_CONNECTIONS = 64


def connection_cap(listeners: int, open_files: int | None) -> int:
    """How many connections one listener keeps open at once; gRPC closes one
    more as soon as it is accepted. Every connection is an open file, and
    anyone who can reach a TCP port can open them, token or not: without a
    cap they took every file the process may open (runtime.py raises the soft
    limit to the hard one), and then a worker that crashed could not be
    respawned, nor a client on the Unix socket connect. The listeners share
    the open-files limit (``open_files``; None: none known) less a reserve (a
    tenth of it, at least MIN_FD_RESERVE); each counts its own connections, so
    a flood on a TCP port never closes the Unix socket's."""
    soft = open_files if open_files and open_files > 0 else 1 << 20  # RLIM_INFINITY is -1
    reserve = max(MIN_FD_RESERVE, soft // 10)
    return min(1 << 30, max(MIN_CONNECTIONS, (soft - reserve) // max(listeners, 1)))  # a C int


class GenericOnly:
    """Stands in for the grpc.aio server in a generated
    ``add_*Servicer_to_server(servicer, server)``: its handlers reach the
    server as generic handlers only, never as registered methods. Why: the
    grpc.aio server's serving loop keeps one pending request per registered
    method and, for every call it accepts, waits on all of them at once
    (``asyncio.wait`` over the set, a done-callback added to and removed from
    each), so every call costs in proportion to the number of registered
    methods: every method of our services, health's and reflection's. A
    generic handler is one pending request, and finding a call's handler is a
    dict lookup per service. The calls and their statuses are the same either
    way. Each handler gets the boundary's parse step (``parsed_only``), and
    its response streams ``gate`` (``AnonymousStreams``), when given."""

    def __init__(self, server: grpc.aio.Server, gate: AnonymousStreams | None = None):
        self.server, self.gate = server, gate

    def add_generic_rpc_handlers(self, handlers) -> None:
        pass  # the same handlers follow in add_registered_method_handlers

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        wrapped = {name: parsed_only(service, name, h, self.gate) for name, h in handlers.items()}
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, wrapped),))


def build_server(cfg: Config, services: list, auth, budget: RequestBudget,
                 open_files: int | None = None) -> tuple[grpc.aio.Server, health.HealthServicer, list[str]]:
    """The server with ``services`` (SessionService, PromptService, ToolService,
    StatusService instances), each call through the boundary (auth, size and
    ``budget``, parse, caps), plus health and reflection (as gRPC serves
    them, with a bound on the streams callers without a credential hold
    open, and on the connections each listener keeps: ``open_files``, the
    process's limit, is shared among them); listeners bound."""
    caps = Caps(cfg.limits)
    server = grpc.aio.server(options=server_options(caps, len(cfg.all_listeners()), open_files),
                             interceptors=interceptors())
    trusted_only = all(listener.address.startswith("unix:") for listener in cfg.all_listeners())
    edge = Boundary(server, auth, caps, budget, trusted_only)
    for service in services:
        _ADD[type(service).__name__](service, edge)
    generic = GenericOnly(server, AnonymousStreams(auth))
    health_servicer = SidecarHealth()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, generic)
    # enable_server_reflection(names, server), without the registered methods:
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(reflection.aio.ReflectionServicer(
        SERVICE_NAMES + (health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                         reflection.SERVICE_NAME)), generic)
    return server, health_servicer, bind_listeners(server, cfg)


class SidecarHealth(health.aio.HealthServicer):
    """grpc.health.v1 for the server ("") and for each of our services by
    name: one status for all of them, so ``set("", s)`` sets every name
    (the runtime sets "" as the restore, a store fault and a drain change
    it). A checker asking for ``agent_sidecar.v1.PromptService`` gets the
    same answer as one asking for the server, never NOT_FOUND."""

    async def set(self, service: str, status) -> None:
        await super().set(service, status)
        if service == "":
            for name in SERVICE_NAMES:
                await super().set(name, status)

    async def Check(self, request, context):
        """As grpc's, but an unknown name's NOT_FOUND says which names it knows
        (grpc's comes with no details: a probe printed ``NOT_FOUND:`` alone)."""
        if request.service and request.service not in SERVICE_NAMES:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"service: no health status for {request.service!r}; the sidecar answers for "
                                f"'' (the server) and {', '.join(SERVICE_NAMES)}")
        return await super().Check(request, context)


def bind_listeners(server: grpc.aio.Server, cfg: Config) -> list[str]:
    """Every listener of the config, bound: the one place a listener is added
    (a Unix socket born 0600; TCP only with tokens; TLS where the listener
    has a certificate, client certificates required where it has a client
    CA). Returns what was bound (a TCP port 0 resolved, ``(TLS)`` or
    ``(mTLS)`` after a secure one)."""
    bound = []
    for listener in cfg.all_listeners():
        target = listener.address
        if target.startswith("unix:"):
            _bind_unix(server, target)
            bound.append(target)
            continue
        if not cfg.tokens:
            raise RuntimeError(f"listening on TCP ({target}) needs [[auth.tokens]] in the config")
        if listener.tls:
            port = _add_port(server.add_secure_port, target, server_credentials(listener))
        else:
            port = _add_port(server.add_insecure_port, target)
        address = f"{target.rsplit(':', 1)[0]}:{port}"
        if not listener.tls and not is_loopback(host_of(target)):
            # Tokens reach this port from other machines in cleartext.
            log.warning("a TCP listener without TLS accepts bearer tokens from the network in "
                        "cleartext", extra={"listen": address,
                                            "fix": "give it cert and key in [[listen]] (docs/security.md)"})
        bound.append(address + (" (mTLS)" if listener.client_ca else " (TLS)" if listener.tls else ""))
    return bound


def _add_port(add, target: str, *args) -> int:
    """``add(target, *args)`` (the server's add_insecure_port or
    add_secure_port); when gRPC cannot bind, a RuntimeError that says why
    (``_bind_problem``) instead of gRPC's own, which says only that it failed
    (its C core prints the reason in a line of its own format)."""
    try:
        return add(target, *args)
    except RuntimeError:
        raise RuntimeError(f"cannot listen on {target}: {_bind_problem(target)}") from None


def _bind_problem(target: str) -> str:
    """Why the system refuses to bind ``target`` (an address in use or not of
    this machine, a read-only directory), asked with a plain socket, which
    is closed (and a socket file it made removed) at once."""
    addresses: list[tuple[Any, ...]]
    if target.startswith("unix:"):
        addresses = [(socket.AF_UNIX, socket.SOCK_STREAM, 0, "", target[5:])]
    else:
        try:
            addresses = socket.getaddrinfo(host_of(target), int(target.rsplit(":", 1)[1]),
                                           type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except OSError as e:
            return str(e.strerror or e)
    problem = "gRPC could not bind it (GRPC_VERBOSITY=debug says why)"
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as s:
            try:
                s.bind(address)
            except OSError as e:
                problem = e.strerror or str(e)
            else:
                if family == socket.AF_UNIX:
                    os.unlink(address)
    return problem


def _bind_unix(server: grpc.aio.Server, target: str) -> None:
    path = target[5:]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    _prepare_unix(path)
    old = os.umask(0o177)  # the socket is born 0600: only our own user
    try:
        _add_port(server.add_insecure_port, target)
    finally:
        os.umask(old)


def server_credentials(listener: Listener) -> grpc.ServerCredentials:
    """The listener's TLS credentials (its files were checked at load, and are
    read again when they change: tls.ServerFiles); with a client CA, a client
    without a certificate it signed is refused in the handshake."""
    return ServerFiles(listener.address, listener.cert, listener.key, listener.client_ca).credentials()


def calm_grpc_threads() -> int:
    """Give every thread of this process but the caller (the event loop)
    ``SCHED_BATCH``; call once the server has started (its threads exist).
    Returns how many threads changed; 0 where the policy does not exist."""
    if not hasattr(os, "SCHED_BATCH"):
        return 0
    me = threading.get_native_id()
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return 0
    changed = 0
    for tid in tids:
        if tid == me:
            continue
        try:
            os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
            changed += 1
        except OSError:  # gone meanwhile, or not allowed: keep the default
            pass
    return changed

"""ToolService over gRPC: a tool host registers tools under a namespace and
answers invocations on one bidirectional stream.

One stream, one writer: everything the sidecar sends (registration acks,
invocations) goes through the stream's sender task. The handler only reads. When
the stream ends for any reason (the host half-closes, sends a bad message, or
anything fails) the handler unregisters the host, lets the sender write what was
already queued, and waits for the sender to be gone before it returns or aborts:
ending a call while a write of it is in flight is what gRPC refuses (a hang, or
INTERNAL ``GRPC_CALL_ERROR_TOO_MANY_OPERATIONS``). So every stream ends with a
status: OK for a clean half-close, the error's status and ErrorInfo otherwise
(INVALID_ARGUMENT naming the field for a bad registration).

A host remembers the platforms of the credential it registered with: the
registry invokes its tools only for sessions of those platforms (see
tools/registry.py).
"""

from __future__ import annotations

import asyncio
import logging
import re

import grpc
import orjson

from .. import errors as E
from ..tools.registry import ToolHost, ToolSpec
from ..tools.schema import schema_problem
from ..v1 import tool_service_pb2 as pb
from ..v1 import tool_service_pb2_grpc as pb_grpc
from .convert import check_json_depth
from .errors import abort

log = logging.getLogger("agent_sidecar.tools")

# How long a closing stream's sender may take to write what was queued before
# it; a host that stopped reading its responses is not waited for longer.
SENDER_DRAIN_S = 5.0
_CLOSE = object()  # the sender's last item: it returns after writing what came before
# A namespace and a tool name are dotted names of these parts: what every model
# API takes as a function name once the dots are mapped (models/openai_wire.py),
# with no room for a scope's wildcard ("discord.*") or an empty part ("t..x").
_DOTTED = re.compile(r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*")
_DOTTED_RULE = "must be dot-separated parts of letters, digits, '_' and '-'"


class ToolService(pb_grpc.ToolServiceServicer):
    def __init__(self, cfg, auth, registry):
        self.cfg, self.auth, self.registry = cfg, auth, registry

    async def ServeTools(self, request_iterator, context, principal):  # type: ignore[override]  # boundary.py adds principal
        """Authenticated by api/boundary.py, which also checks each message
        ``context.read()`` returns (size, parse, caps) or raises SidecarError."""
        stream = _Stream(principal)
        error: E.SidecarError | None = None
        try:
            await self._read(stream, context)
        except E.SidecarError as e:
            error = e
        except asyncio.CancelledError:  # the call is over (cancelled, deadline): no status to send
            await stream.close(self.registry, graceful=False)
            raise
        except Exception as e:  # never leave the stream without a status
            log.exception("tool host stream failed")
            error = E.SidecarError(E.INTERNAL, f"the tool stream failed: {type(e).__name__}")
        await stream.close(self.registry, graceful=True)
        if error is not None:
            await abort(context, error)

    async def _read(self, stream: _Stream, context) -> None:
        """Read the host's messages until it half-closes; raise on a bad one."""
        while True:
            msg = await context.read()
            if msg is grpc.aio.EOF:
                return
            which = msg.WhichOneof("message")
            if which == "register":
                self._register(stream, msg.register, context)
            elif which == "result" and stream.host is not None:
                r = msg.result
                self.registry.answer(stream.host, r.invocation_id, r.ok, r.result_json, r.error)

    def _register(self, stream: _Stream, reg, context) -> None:
        ns = reg.namespace.strip(".")
        if not ns:
            raise E.invalid("register.namespace", "is required")
        if not _DOTTED.fullmatch(ns):
            raise E.invalid("register.namespace", f"{E.excerpt(ns)} {_DOTTED_RULE}")
        principal = stream.principal
        if not principal.admin:
            principal.require_platform(ns.split(".")[0])
        host = stream.host
        if host is not None and ns != host.namespace:
            raise E.invalid("register.namespace",
                            f"this stream serves {E.excerpt(host.namespace)};"
                            f" open another for {E.excerpt(ns)}")
        specs = [self._spec(i, t, ns) for i, t in enumerate(reg.tools)]
        seen: set[str] = set()
        for i, spec in enumerate(specs):
            if spec.name in seen:
                raise E.invalid(f"register.tools[{i}].name", f"{E.excerpt(spec.name)} is given twice")
            seen.add(spec.name)
        if host is None:
            host = stream.host = ToolHost(namespace=ns, platforms=principal.platforms)
            stream.sender = asyncio.get_running_loop().create_task(_send(host, context, self.registry))
        names = self.registry.register_host(host, specs)
        log.info("tools registered", extra={"namespace": ns, "tools": names})
        host.outbox.put_nowait(pb.ServeToolsResponse(
            registered=pb.ToolsRegistered(namespace=ns, tool_names=names)))

    def _spec(self, i: int, t, ns: str) -> ToolSpec:
        try:
            params = orjson.loads(t.parameters_json_schema or '{"type": "object"}')
        except orjson.JSONDecodeError:
            raise E.invalid(f"register.tools[{i}].parameters_json_schema", "is not valid JSON") from None
        if not isinstance(params, dict):
            raise E.invalid(f"register.tools[{i}].parameters_json_schema", "must be a JSON object (a schema)")
        check_json_depth(params, f"register.tools[{i}].parameters_json_schema")
        problem = schema_problem(params)  # else every turn offered the tool fails at its model
        if problem is not None:
            raise E.invalid(f"register.tools[{i}].parameters_json_schema", problem)
        if not t.name.startswith(ns + "."):
            raise E.invalid(f"register.tools[{i}].name",
                            f"must start with the namespace {E.excerpt(ns)}")
        if not _DOTTED.fullmatch(t.name):
            raise E.invalid(f"register.tools[{i}].name", f"{E.excerpt(t.name)} {_DOTTED_RULE}")
        if self.registry.served_in_process(t.name):
            raise E.invalid(f"register.tools[{i}].name", "names a tool the sidecar serves in process")
        return ToolSpec(t.name, t.description, params)


class _Stream:
    """One ServeTools call's state: who opened it, its host once registered,
    and the sender task writing to it."""

    def __init__(self, principal):
        self.principal = principal
        self.host: ToolHost | None = None
        self.sender: asyncio.Task | None = None

    async def close(self, registry, graceful: bool) -> None:
        """Unregister the host (its pending calls fail), then end the sender
        and wait until it is gone. ``graceful``: it first writes what was
        queued (a registration ack the host should see), bounded by
        SENDER_DRAIN_S; otherwise, or past that, it is cancelled."""
        host, sender = self.host, self.sender
        if host is not None:
            registry.unregister_host(host)
            log.info("tool host gone", extra={"namespace": host.namespace})
        if sender is None or sender.done():
            return
        if graceful and host is not None:  # a sender exists only once the host registered
            host.outbox.put_nowait(_CLOSE)
            await asyncio.wait({sender}, timeout=SENDER_DRAIN_S)
        if not sender.done():
            sender.cancel()
            await asyncio.wait({sender})


async def _send(host: ToolHost, context, registry) -> None:
    """The stream's only writer: registrations and invocations, in order,
    until _CLOSE. Invocations queued for a host that has closed since, or
    whose caller stopped waiting (it timed out while the host was not
    reading), are dropped: their callers already got an error result, and a
    host that runs a call the model was told had failed would act twice. A
    write that fails unregisters the host: its tools are no longer offered."""
    try:
        while True:
            item = await host.outbox.get()
            if item is _CLOSE:
                return
            if isinstance(item, dict):
                if host.closed or item["invocation_id"] not in host.pending:
                    continue
                item = pb.ServeToolsResponse(invocation=pb.ToolInvocation(**item))
            await context.write(item)
    except asyncio.CancelledError:
        raise
    except Exception as e:  # the call broke under us: no invocation can reach the host now
        log.info("tool host stream write failed", extra={"namespace": host.namespace,
                                                         "error": f"{type(e).__name__}: {e}"})
        registry.unregister_host(host, "the tool host stream failed")

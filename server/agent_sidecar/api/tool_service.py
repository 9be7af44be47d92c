"""ToolService over gRPC: a tool host registers tools under a namespace and
answers invocations on one bidirectional stream."""

from __future__ import annotations

import asyncio
import logging

import grpc
import orjson

from .. import errors as E
from ..tools.registry import ToolHost, ToolSpec
from ..v1 import tool_service_pb2 as pb
from ..v1 import tool_service_pb2_grpc as pb_grpc
from .errors import abort

log = logging.getLogger("agent_sidecar.tools")


class ToolService(pb_grpc.ToolServiceServicer):
    def __init__(self, cfg, auth, registry):
        self.cfg, self.auth, self.registry = cfg, auth, registry

    async def ServeTools(self, request_iterator, context, principal):
        """Authenticated by api/boundary.py, which also checks each message
        ``context.read()`` returns (size, parse, caps) or raises SidecarError."""
        host: ToolHost | None = None
        sender: asyncio.Task | None = None
        try:
            while True:
                msg = await context.read()
                if msg is grpc.aio.EOF:
                    break
                which = msg.WhichOneof("message")
                if which == "register":
                    reg = msg.register
                    ns = reg.namespace.strip(".")
                    if not ns:
                        raise E.invalid("register.namespace", "is required")
                    principal.require_platform(ns.split(".")[0]) if not principal.admin else None
                    if host is not None and ns != host.namespace:
                        raise E.invalid("register.namespace",
                                        f"this stream serves {E.excerpt(host.namespace)};"
                                        f" open another for {E.excerpt(ns)}")
                    specs = []
                    for i, t in enumerate(reg.tools):
                        try:
                            params = orjson.loads(t.parameters_json_schema or '{"type": "object"}')
                        except orjson.JSONDecodeError:
                            raise E.invalid(f"register.tools[{i}].parameters_json_schema",
                                            "is not valid JSON") from None
                        if not t.name.startswith(ns + "."):
                            raise E.invalid(f"register.tools[{i}].name",
                                            f"must start with the namespace {E.excerpt(ns)}")
                        if self.registry.served_in_process(t.name):
                            raise E.invalid(f"register.tools[{i}].name",
                                            "names a tool the sidecar serves in process")
                        specs.append(ToolSpec(t.name, t.description, params))
                    if host is None:
                        host = ToolHost(namespace=ns)
                        sender = asyncio.get_running_loop().create_task(self._send(host, context))
                    names = self.registry.register_host(host, specs)
                    log.info("tools registered", extra={"namespace": ns, "tools": names})
                    host.outbox.put_nowait(pb.ServeToolsResponse(
                        registered=pb.ToolsRegistered(namespace=ns, tool_names=names)))
                elif which == "result" and host is not None:
                    r = msg.result
                    self.registry.answer(host, r.invocation_id, r.ok, r.result_json, r.error)
        except E.SidecarError as e:
            await abort(context, e)
        finally:
            if host is not None:
                self.registry.unregister_host(host)
                log.info("tool host gone", extra={"namespace": host.namespace})
            if sender is not None:
                sender.cancel()

    async def _send(self, host: ToolHost, context) -> None:
        """The stream's only writer: registrations and invocations, in order."""
        while True:
            item = await host.outbox.get()
            if isinstance(item, dict):
                item = pb.ServeToolsResponse(invocation=pb.ToolInvocation(**item))
            await context.write(item)

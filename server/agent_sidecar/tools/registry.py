"""Where tools live: remote tool hosts (ToolService streams, any language) and
in-process Python tools from the ``agent_sidecar.tools`` entry point group.

Names are dotted (``discord.send_message``); a host registers a namespace and
may only register names under it. The agent loop asks for a call by name; the
registry routes it to the host that registered the name last among those
whose credential covers the session (replicas: when it goes, the one before it
serves again) and waits for the answer, bounded by a timeout. A host that
errors, times out, disconnects or stops reading yields an error result, never
a hang.

A remote host serves only sessions of the platforms its credential covers (the
credential it opened its ServeTools stream with): a profile's tool scope says
which names a session may call, the host's credential says whose conversations
it may see. A call from a session of another platform never reaches the host:
``invoke`` raises TOOL_SCOPE_VIOLATION (the agent loop ends the turn with it,
as for a name outside the profile's scope), and ``specs_for`` does not offer
such a host's tools to that session's model. In-process tools belong to the
sidecar itself and serve every platform.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import itertools
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from .. import errors as E
from ..entry_points import entry_points
from .scope import in_scope

log = logging.getLogger("agent_sidecar.tools")
ENTRY_POINT_GROUP = "agent_sidecar.tools"
SPECS_CACHE_MAX = 1024  # (scopes, platform) pairs whose offered specs are kept
MAX_UNSENT = 256  # invocations queued for one host, not yet written to its stream
# An invocation's timeout_ms, at most: the largest integer every client reads
# exactly (a JavaScript number's; the Node client refuses a larger int64), and
# within the int64 field. A profile's tool_timeout_s may be any finite number:
# past int64 the invocation could not be built, and the host's stream was
# given up, all its tools with it.
MAX_TIMEOUT_MS = 2**53 - 1


@dataclass
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]
    host: ToolHost | None = None
    handler: Callable[..., Any] | None = None  # in-process tools

    def for_model(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


@dataclass(eq=False)
class ToolHost:
    """One connected ServeTools stream. ``platforms``: those of the credential
    it registered with (``"*"``: every platform)."""
    namespace: str
    platforms: frozenset[str] = frozenset({"*"})
    outbox: asyncio.Queue = field(default_factory=asyncio.Queue)
    pending: dict[str, asyncio.Future] = field(default_factory=dict)
    specs: dict[str, ToolSpec] = field(default_factory=dict)  # its last registration's
    closed: bool = False

    def covers(self, platform: str) -> bool:
        return "*" in self.platforms or platform.lower() in self.platforms

    def fail_all(self, why: str) -> None:
        self.closed = True
        for fut in self.pending.values():
            if not fut.done():
                fut.set_result((False, orjson.dumps({"error": why}).decode()))
        self.pending.clear()


class ToolRegistry:
    def __init__(self, default_timeout_s: float = 60.0, *, max_result_bytes: int):
        self.tools: dict[str, ToolSpec] = {}
        self.default_timeout_s = default_timeout_s
        self.max_result_bytes = max_result_bytes
        self._ids = itertools.count(1)
        self.version = 0  # bumped on every (un)registration
        self._specs: dict[tuple, tuple[int, list]] = {}
        self.connected: set[ToolHost] = set()  # hosts registered and not yet gone
        self._serving: dict[str, list[ToolHost]] = {}  # a remote tool's hosts, the newest last

    # -- registration ------------------------------------------------------------

    def load_entry_points(self) -> None:
        for ep in entry_points(ENTRY_POINT_GROUP):
            try:
                for spec in ep.load()():
                    self.tools[spec["name"]] = ToolSpec(
                        spec["name"], spec.get("description", ""),
                        spec.get("parameters", {"type": "object"}), handler=spec["handler"])
            except Exception:
                log.exception("loading a tool entry point failed", extra={"entry_point": ep.name})
        self.version += 1

    def served_in_process(self, name: str) -> bool:
        """An entry-point tool: a remote host may not take its name over (it
        would be gone for good once that host disconnected)."""
        spec = self.tools.get(name)
        return spec is not None and spec.host is None

    def register_host(self, host: ToolHost, specs: list[ToolSpec]) -> list[str]:
        """The host's tools are ``specs`` now: a registration again on its
        stream replaces the last (a tool left out is no longer its). Several
        hosts may serve one name (replicas): the newest registration answers
        (``_host_for``), and when it leaves an older one still connected
        takes over again."""
        prefix = host.namespace + "."
        for s in specs:
            if not s.name.startswith(prefix):
                raise ValueError(f"tool {s.name!r} is outside namespace {host.namespace!r}")
        self._withdraw(host)
        for s in specs:
            s.host = host
            host.specs[s.name] = s
            self._serving[s.name] = [h for h in self._serving.get(s.name, ()) if h is not host] + [host]
            self.tools[s.name] = s
        self.connected.add(host)
        self.version += 1
        return [s.name for s in specs]

    def unregister_host(self, host: ToolHost, why: str = "the tool host disconnected") -> None:
        self._withdraw(host)
        self.connected.discard(host)
        self.version += 1
        host.fail_all(why)

    def _withdraw(self, host: ToolHost) -> None:
        """Take ``host`` off every name it serves; a name still served by
        another host is that host's again (the newest), the others are gone."""
        for name in host.specs:
            hosts = [h for h in self._serving.get(name, ()) if h is not host]
            if hosts:
                self._serving[name], self.tools[name] = hosts, hosts[-1].specs[name]
            else:
                self._serving.pop(name, None)
                self.tools.pop(name, None)
        host.specs = {}

    def _host_for(self, name: str, platform: str) -> ToolHost | None:
        """The newest host serving ``name`` whose credential covers ``platform``."""
        for host in reversed(self._serving.get(name, ())):
            if not host.closed and host.covers(platform):
                return host
        return None

    def namespace_of(self, name: str) -> str:
        """What the metrics label a call of ``name`` with: its host's namespace,
        ``local`` for an in-process tool, ``unknown`` for a name nobody serves
        (a name the model made up must not become a label of its own)."""
        spec = self.tools.get(name)
        if spec is None:
            return "unknown"
        return spec.host.namespace if spec.host is not None else "local"

    def hosts_by_namespace(self) -> dict[str, int]:
        """Tool hosts connected now (ServeTools streams that registered), by namespace."""
        out: dict[str, int] = {}
        for host in self.connected:
            out[host.namespace] = out.get(host.namespace, 0) + 1
        return out

    def specs_for(self, scopes: list[str], platform: str) -> list[dict[str, Any]]:
        """The tool specs a profile's model is offered in a session of
        ``platform``: in the profile's scope and served for that platform;
        cached until the set of registered tools changes."""
        if not scopes:
            return []
        key = (tuple(scopes), platform)
        cached = self._specs.get(key)
        if cached is None or cached[0] != self.version:
            if len(self._specs) >= SPECS_CACHE_MAX:  # platforms are caller-chosen names
                self._specs.clear()
            specs = [s.for_model() for name, s in sorted(self.tools.items())
                     if in_scope(name, scopes) and (s.host is None or self._host_for(name, platform))]
            cached = self._specs[key] = (self.version, specs)
        return cached[1]

    # -- invocation ----------------------------------------------------------------

    async def invoke(self, name: str, arguments_json: str, meta: dict[str, str], *,
                     platform: str, timeout_s: float | None = None) -> tuple[bool, str]:
        """(ok, result JSON) of one call made in a session of ``platform``.
        Raises SidecarError TOOL_SCOPE_VIOLATION, before the host hears of
        the call, when the host's credential does not cover that platform.
        A result of more than ``max_result_bytes`` (``limits.max_text_bytes``),
        an in-process tool's or a host's, comes back as an error result naming
        the limit: it travels whole in a ``tool_result`` frame and the
        transcript, and a client with gRPC's default 4 MiB message limit could
        not receive a much larger one. A host's stream goes on (refused on the
        wire, its stream would end, and every tool it serves with it)."""
        ok, result = await self._invoke(name, arguments_json, meta, platform, timeout_s)
        if len(result) > self.max_result_bytes // 4 and len(result.encode()) > self.max_result_bytes:
            return False, orjson.dumps({"error": f"the result of {name!r} is longer than limits.max_text_bytes"
                                                 f" ({self.max_result_bytes} bytes)"}).decode()
        return ok, result

    async def _invoke(self, name: str, arguments_json: str, meta: dict[str, str], platform: str,
                      timeout_s: float | None) -> tuple[bool, str]:
        spec = self.tools.get(name)
        if spec is None:
            return False, orjson.dumps({"error": f"no tool host serves {name!r}"}).decode()
        timeout = timeout_s or self.default_timeout_s
        if spec.handler is not None:
            return await self._invoke_local(spec, arguments_json, timeout)
        host = self._host_for(name, platform)
        if host is None and any(not h.closed for h in self._serving.get(name, ())):
            raise E.SidecarError(E.TOOL_SCOPE_VIOLATION,
                                 f"the host serving {name!r} holds a credential that does not cover"
                                 f" platform {platform!r}")
        if host is None:
            return False, orjson.dumps({"error": f"the host of {name!r} is gone"}).decode()
        if host.outbox.qsize() >= MAX_UNSENT:  # it stopped reading: fail fast, hold no more
            return False, orjson.dumps({"error": f"the host of {name!r} is not reading its calls"}).decode()
        inv_id = f"inv-{next(self._ids)}"
        fut = asyncio.get_running_loop().create_future()
        host.pending[inv_id] = fut
        await host.outbox.put({"invocation_id": inv_id, "tool_name": name,
                               "arguments_json": arguments_json,
                               "timeout_ms": min(int(timeout * 1000), MAX_TIMEOUT_MS),
                               **meta})
        try:
            async with asyncio.timeout(timeout):
                return await fut
        except TimeoutError:
            return False, orjson.dumps({"error": f"tool {name!r} timed out after {timeout:g} s"}).decode()
        finally:
            host.pending.pop(inv_id, None)

    async def _invoke_local(self, spec: ToolSpec, arguments_json: str, timeout: float):
        """An entry-point tool. A plain function runs in a daemon thread of its
        own: a slow or blocking one holds up its own turn only, never the event
        loop, nor the loop's default executor (which joins the worker and writer
        processes: a few tools hung there would stall a crashed worker's
        recovery), nor the process's exit."""
        handler = spec.handler
        assert handler is not None  # invoke() sends only in-process tools here
        try:
            args = orjson.loads(arguments_json or "{}")
            call = functools.partial(handler, **args) if isinstance(args, dict) \
                else functools.partial(handler, args)
            async with asyncio.timeout(timeout):  # the whole call, an awaitable it returns included
                if inspect.iscoroutinefunction(handler):
                    result = await call()
                else:
                    result = await _in_daemon_thread(call, spec.name)
                    if inspect.isawaitable(result):
                        result = await result
            return True, orjson.dumps(result).decode()
        except TimeoutError:
            return False, orjson.dumps({"error": f"tool {spec.name!r} timed out after {timeout:g} s"}).decode()
        except Exception as e:
            return False, orjson.dumps({"error": f"{type(e).__name__}: {e}"}).decode()

    def answer(self, host: ToolHost, invocation_id: str, ok: bool, result_json: str, error: str) -> None:
        """A host's result. One that says ok but whose ``result_json`` is no
        JSON (``"12:00"`` unquoted, or empty) is a failed call naming the
        field: a tool_result frame's result_json is JSON (docs/api.md), and
        adapters and models parse it. The host cannot be told otherwise
        without ending its stream, and with it every tool it serves."""
        fut = host.pending.get(invocation_id)
        if fut is not None and not fut.done():
            problem = _json_problem(result_json) if ok else None
            if problem:
                ok, error = False, f"result_json: the tool host's result {problem} (got {E.excerpt(result_json)})"
            result = result_json if ok else orjson.dumps({"error": error or result_json or "tool failed"}).decode()
            fut.set_result((ok, result))


def _json_problem(text: str) -> str | None:
    """None when ``text`` is JSON (RFC 8259), else what is wrong with it.
    orjson answers at once for almost all; what it refuses is read again by
    the standard library, since orjson is stricter than JSON: an escaped
    lone surrogate (``"\\ud83d"``, what JSON.stringify and json.dumps write
    for a string cut in the middle of an emoji) or a number past a double's
    range (``1e400``) is valid JSON, and a tool's result is passed on as
    text, never decoded here. NaN and Infinity, which the standard library
    would take, are not JSON. JSON nested deeper than either parser goes
    (orjson stops at 1,024 levels) is refused as such: the adapters and
    models it would go to could not read it either."""
    try:
        orjson.loads(text)
        return None
    except orjson.JSONDecodeError:
        pass
    try:
        json.loads(text, parse_constant=_not_json)
    except RecursionError:
        return "is nested too deeply (at most 1,024 levels of arrays and objects)"
    except ValueError:
        return "is not JSON"
    return None


def _not_json(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _in_daemon_thread(fn: Callable[[], Any], name: str) -> asyncio.Future:
    """``fn()`` on a daemon thread, in the caller's context; its result as a future."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    ctx = contextvars.copy_context()

    def settle(ok: bool, value: Any) -> None:
        if not fut.done():  # the caller may have timed out and gone
            fut.set_result(value) if ok else fut.set_exception(value)

    def run() -> None:
        try:
            value, ok = ctx.run(fn), True
        except BaseException as e:
            value, ok = e, False
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile (the sidecar stopped)
            loop.call_soon_threadsafe(settle, ok, value)
    threading.Thread(target=run, name=f"tool {name}", daemon=True).start()
    return fut

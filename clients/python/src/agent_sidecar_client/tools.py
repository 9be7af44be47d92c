"""ToolHost: serve Python functions as agent tools over ToolService.ServeTools.

Why a decorator: an adapter's tools are ordinary functions; the host does the
protocol (open the stream, register the specs, wait for ToolsRegistered, run
every invocation concurrently, send results back) so the function only sees
its keyword arguments and returns something JSON-serialisable.

    host = ToolHost("conf.python")

    @host.tool(description="Add two integers.")
    def add(a: int, b: int) -> int:        # registered as conf.python.add
        return a + b

    async with host.running(client):       # registered when the block starts
        ...

A raised exception, a non-JSON result or exceeding the invocation's
``timeout_ms`` is reported as ``ok=False`` with the error text (the sidecar
then fails the call with TOOL_INVOKE_FAILED). ``serve`` re-opens the stream
after a transport failure (and re-registers), so a sidecar restart does not
orphan the tools.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import json
import logging
import re
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from agent_sidecar_client import errors
from agent_sidecar_client._args import check_text
from agent_sidecar_client._proto import tool_service_pb2 as tool_pb
from agent_sidecar_client._stream import RESUMABLE_CODES, task_cancelling

log = logging.getLogger("agent_sidecar_client")

# Without an on_retry, serve logs its 1st failed attempt and every this many-th,
# as the Go and Node hosts do (each attempt first waits up to 30 s for the channel).
RETRY_LOG_EVERY = 12
_TLS_FAILURE = re.compile(r"handshake|SSL_ERROR|CERTIFICATE_VERIFY|certificate verify|TSI_", re.IGNORECASE)
# A connection the peer closed (during the handshake or right after it): an outage, not a TLS failure.
_CLOSED = re.compile(r"Socket closed|Connection reset", re.IGNORECASE)

_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", dict: "object"}


@dataclass
class Tool:
    name: str
    description: str
    schema: dict[str, Any]
    func: Callable[..., Any]
    pass_invocation: bool = False


def schema_from_signature(func: Callable[..., Any]) -> dict[str, Any]:
    """A JSON schema for ``func``'s keyword arguments from its annotations.

    Good enough for simple tools; pass ``schema=`` for anything richer.
    """
    props: dict[str, Any] = {}
    required: list[str] = []
    for name, param in inspect.signature(func).parameters.items():
        if name == "invocation" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        annotation = param.annotation
        if isinstance(annotation, str):  # from __future__ import annotations
            annotation = {"int": int, "float": float, "str": str, "bool": bool, "list": list,
                          "dict": dict}.get(annotation, annotation)
        props[name] = {"type": _JSON_TYPES[annotation]} if annotation in _JSON_TYPES else {}
        if param.default is param.empty:
            required.append(name)
    schema: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        schema["required"] = required
    return schema


class ToolHost:
    """A set of tools under one namespace (a dotted prefix such as ``discord``)."""

    def __init__(self, namespace: str) -> None:
        check_text(namespace=namespace)
        self.namespace = namespace.rstrip(".")
        self.tools: dict[str, Tool] = {}
        self.registered: tool_pb.ToolsRegistered | None = None
        self._registered_event = asyncio.Event()
        self._stream_registered = False  # the current stream got its ToolsRegistered

    def tool(self, func: Callable[..., Any] | None = None, *, name: str | None = None,
             description: str | None = None, schema: dict[str, Any] | None = None,
             pass_invocation: bool = False) -> Any:
        """Register a sync or async function; usable bare (``@host.tool``) or
        with options. ``name`` defaults to namespace + "." + function name;
        ``description`` to the docstring. With ``pass_invocation`` the function
        also gets ``invocation=`` (the ToolInvocation: session_key, request_id...)."""

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            full = name or f"{self.namespace}.{fn.__name__}"
            doc = description if description is not None else inspect.getdoc(fn) or ""
            check_text(name=full, description=doc)
            if not full.startswith(self.namespace + "."):
                raise ValueError(f"tool name {full!r} is outside namespace {self.namespace!r}")
            if full in self.tools:  # a second function under one name would silently replace the first
                raise ValueError(f"tool name {full!r} is registered already")
            self.tools[full] = Tool(full, doc, schema if schema is not None else schema_from_signature(fn), fn,
                                    pass_invocation)
            return fn

        return register(func) if func is not None else register

    def _register_message(self) -> tool_pb.ServeToolsRequest:
        return tool_pb.ServeToolsRequest(register=tool_pb.RegisterTools(namespace=self.namespace, tools=[
            tool_pb.ToolSpec(name=t.name, description=t.description,
                             parameters_json_schema=json.dumps(t.schema, sort_keys=True))
            for t in self.tools.values()]))

    async def invoke(self, invocation: tool_pb.ToolInvocation) -> tool_pb.ToolInvocationResult:
        """Run one invocation and build its result (never raises, but for the
        cancellation of the task running it). A TimeoutError or CancelledError
        the tool raises itself is the tool's failure, reported as such."""
        result = tool_pb.ToolInvocationResult(invocation_id=invocation.invocation_id)
        tool = self.tools.get(invocation.tool_name)
        try:
            if tool is None:
                raise LookupError(f"no tool {invocation.tool_name!r} on this host")
            args = json.loads(invocation.arguments_json or "{}")
            if not isinstance(args, dict):
                raise TypeError("arguments must be a JSON object")
            if tool.pass_invocation:
                args["invocation"] = invocation
            if inspect.iscoroutinefunction(tool.func):
                work = tool.func(**args)
            else:
                work = _in_thread(tool.func, args)
            timeout = invocation.timeout_ms / 1000 if invocation.timeout_ms > 0 else None
            scope = asyncio.timeout(timeout)  # (not wait_for: it can drop the host's cancellation)
            try:
                async with scope:
                    value = await work
            except TimeoutError:
                if scope.expired():  # the invocation's timeout, not a TimeoutError of the tool's own
                    raise _InvocationTimeout from None
                raise
            result.result_json = json.dumps(value, allow_nan=False)  # NaN is no JSON
            result.ok = True
        except _InvocationTimeout:
            result.error = f"tool {invocation.tool_name} timed out after {invocation.timeout_ms} ms"
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the host itself is stopping
            # The tool's own CancelledError (a cancelled task or future inside it):
            # a failure of the tool like any other, and its result is sent.
            result.error = _utf8(f"CancelledError: {exc}" if str(exc) else "CancelledError")
        except Exception as exc:  # noqa: BLE001 - any tool failure goes back to the model
            result.error = _utf8(f"{type(exc).__name__}: {exc}")
        if not result.ok:
            result.result_json = json.dumps({"error": result.error})
        return result

    async def _serve_once(self, client: Any) -> None:
        """One ServeTools stream: register, then answer until it ends."""
        outbox: asyncio.Queue[tool_pb.ServeToolsRequest | None] = asyncio.Queue()
        outbox.put_nowait(self._register_message())
        tasks: set[asyncio.Task[Any]] = set()

        async def requests() -> AsyncIterator[tool_pb.ServeToolsRequest]:
            while (request := await outbox.get()) is not None:  # None: the stream is over
                yield request

        async def answer(invocation: tool_pb.ToolInvocation) -> None:
            outbox.put_nowait(tool_pb.ServeToolsRequest(result=await self.invoke(invocation)))

        call = client.tools.ServeTools(requests(), metadata=client.metadata)
        try:
            async for response in call:
                kind = response.WhichOneof("message")
                if kind == "registered":
                    self.registered = response.registered
                    self._stream_registered = True
                    self._registered_event.set()
                elif kind == "invocation":
                    task = asyncio.create_task(answer(response.invocation))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
        finally:
            # gRPC's task that reads requests() outlives a call that ended with a
            # status (a refused registration): ending requests() ends it, or it
            # would wait on the outbox for good.
            outbox.put_nowait(None)
            call.cancel()
            for task in tasks:
                task.cancel()
            self.registered = None
            self._registered_event.clear()

    async def serve(self, client: Any, *, reconnect: bool = True,
                    on_retry: Callable[[int, errors.SidecarError], Any] | None = None) -> None:
        """Host the tools until cancelled. Transport failures re-open the
        stream (and re-register) when ``reconnect``, for as long as the
        sidecar stays out of reach (an adapter may start before it): each
        failed attempt (1, 2, ... since the last registration) goes to
        ``on_retry(attempt, error)``, else to the log (logger
        ``agent_sidecar_client``: the 1st and every RETRY_LOG_EVERY-th), so a
        wrong socket path does not wait in silence. A TLS handshake failure
        (a CA that did not sign the sidecar's certificate) raises at once: no
        wait mends it. A sidecar refusal of the registration (bad namespace,
        auth) raises its typed error. A refusal
        after the stream registered is of a result (one past the sidecar's
        limits, such as a ``result_json`` over ``max_text_bytes``): the sidecar
        ends the stream and fails that call, and the host registers again, as
        after a drop, rather than leave every later call without a host. The
        client's ``close()`` ends it with ``errors.client_closed()``."""
        attempts = 0
        while True:
            if getattr(client, "closed", False):  # a SidecarClient's close() ends serve
                raise errors.client_closed()
            self._stream_registered = False
            try:
                await self._serve_once(client)
                failure: errors.SidecarError | None = None
            except asyncio.CancelledError:
                if getattr(client, "closed", False) and not task_cancelling():
                    raise errors.client_closed() from None
                raise
            except grpc.RpcError as exc:
                if getattr(client, "closed", False):
                    raise errors.client_closed() from exc
                failure = errors.from_rpc_error(exc)
                refused = errors.has_error_info(exc) and not self._stream_registered
                if refused or exc.code() not in RESUMABLE_CODES and not errors.has_error_info(exc) \
                        or not reconnect or _is_tls_failure(failure):
                    raise failure from exc
            if not reconnect:
                return
            if failure is not None:
                attempts = 1 if self._stream_registered else attempts + 1
                self._retrying(attempts, failure, on_retry)
            await asyncio.sleep(0.2 if failure is None else 0.5)
            with contextlib.suppress(errors.SidecarError):
                await client.wait_ready(30.0)

    def _retrying(self, attempt: int, error: errors.SidecarError,
                  on_retry: Callable[[int, errors.SidecarError], Any] | None) -> None:
        """Report a failed attempt before the next one."""
        if on_retry is not None:
            on_retry(attempt, error)
        elif attempt == 1 or attempt % RETRY_LOG_EVERY == 0:
            log.warning("ToolHost %r: ServeTools failed (attempt %d), retrying: %s", self.namespace, attempt, error)

    async def wait_registered(self, timeout: float | None = None) -> tool_pb.ToolsRegistered:
        async with asyncio.timeout(timeout):
            await self._registered_event.wait()
        assert self.registered is not None
        return self.registered

    @contextlib.asynccontextmanager
    async def running(self, client: Any, timeout: float = 10.0,
                      on_retry: Callable[[int, errors.SidecarError], Any] | None = None) -> AsyncIterator[ToolHost]:
        """Serve in the background; the block starts once the tools are registered.

        Not registered within ``timeout``: SidecarError DEADLINE_EXCEEDED naming
        the last failed attempt's error (its ``__cause__``), so a sidecar out of
        reach says why. ``serve`` ending for good inside the block (a TLS
        failure, a refused registration after a reconnect) cancels the block,
        as a TaskGroup does, and ``running`` raises serve's error: the block
        never goes on as if its tools were served. (The client's ``close()``
        ends serve without cancelling the block.)"""
        last: list[errors.SidecarError] = []

        def retried(attempt: int, error: errors.SidecarError) -> None:
            last[:] = [error]
            self._retrying(attempt, error, on_retry)

        task = asyncio.create_task(self.serve(client, on_retry=retried))
        try:
            await self._until_registered(task, timeout, last)
            async with _cancelled_if_it_fails(task, client):
                yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, errors.SidecarError):
                await task

    async def _until_registered(self, task: asyncio.Task[None], timeout: float,
                                last: list[errors.SidecarError]) -> None:
        """Wait for the registration; raise serve's error if it ends first."""
        waiter = asyncio.create_task(self._registered_event.wait())
        try:
            done, _ = await asyncio.wait({task, waiter}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if task in done:
            task.result()  # raises the refusal
            raise errors.SidecarError(grpc.StatusCode.UNAVAILABLE, "", "ServeTools ended before registration")
        if waiter not in done:
            message = f"tools of {self.namespace} not registered within {timeout:g}s"
            raise errors.SidecarError(grpc.StatusCode.DEADLINE_EXCEEDED, "",
                                      f"{message}; last attempt: {last[0]}" if last else message) \
                from (last[0] if last else None)


@contextlib.asynccontextmanager
async def _cancelled_if_it_fails(task: asyncio.Task[None], client: Any) -> AsyncIterator[None]:
    """The block runs while ``task`` (a ToolHost's serve) does: if it fails
    (but for the client's close()), the block's task is cancelled and the
    failure is raised at the block's end, in place of the cancellation (a
    cancellation of the block's task from elsewhere still propagates)."""
    body = asyncio.current_task()
    assert body is not None
    failed = False

    def on_done(t: asyncio.Task[None]) -> None:
        nonlocal failed
        if not t.cancelled() and t.exception() is not None and not getattr(client, "closed", False):
            failed = True
            body.cancel()

    task.add_done_callback(on_done)
    try:
        yield
    except asyncio.CancelledError:
        if not failed or body.uncancel() > 0:
            raise
        raise task.exception() from None  # type: ignore[misc]
    finally:
        task.remove_done_callback(on_done)
    if failed:  # the block swallowed the cancellation
        body.uncancel()
        raise task.exception()  # type: ignore[misc]


async def _in_thread(func: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """Run a sync tool in a daemon thread of its own and await its value.

    Not in the event loop's default executor (``asyncio.to_thread``): a tool
    that never returns (blocked past its timeout; a thread cannot be stopped)
    would hold one of that pool's few workers for good, so that once they were
    all held every other sync tool timed out without running, and
    ``asyncio.run`` would wait for it at exit, shutting the executor down, so
    the adapter could not stop. A daemon thread holds up neither.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(value: Any, exc: BaseException | None) -> None:
        if future.done():  # the call timed out or the host stopped: nobody waits
            return
        if exc is None:
            future.set_result(value)
        else:
            future.set_exception(exc)

    def run() -> None:
        try:
            value, exc = context.run(func, **kwargs), None
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting task
            value, exc = None, e
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(settle, value, exc)

    threading.Thread(target=run, name=f"tool {getattr(func, '__name__', 'sync')}", daemon=True).start()
    return await future


def _is_tls_failure(error: errors.SidecarError) -> bool:
    """A TLS handshake or certificate failure (a CA that did not sign the
    sidecar's certificate, TLS to a plain port): UNAVAILABLE like a refused
    connection, told apart by gRPC's text, as the Go and Node hosts do. Not a
    connection the peer closed, during the handshake ("Handshake read failed
    (Socket closed)") or as it was set up (``_connect.explain``): a proxy
    whose sidecar is down closes them so, and a wait mends that. (An mTLS
    listener refusing the client looks the same, so it is retried too; each
    attempt's error names the client certificate.)"""
    return (error.reason == "" and error.code == grpc.StatusCode.UNAVAILABLE
            and _TLS_FAILURE.search(error.message) is not None and _CLOSED.search(error.message) is None)


class _InvocationTimeout(Exception):
    """The invocation's ``timeout_ms`` passed (told apart from a TimeoutError of the tool's)."""


def _utf8(text: str) -> str:
    """``text`` with any lone surrogate escaped: an exception's message may
    hold one (from a filename, say), and protobuf cannot encode it — the
    result would never be sent and the sidecar would wait out its timeout."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")

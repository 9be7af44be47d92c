"""Tracing on: the spans, through the OpenTelemetry SDK (the ``otel`` extra).
Imported only by tracing.configure() when the environment asks for traces.

The tree of one prompt::

    agent_sidecar.v1.PromptService/Prompt      (SERVER; parent: the caller's traceparent)
    └── turn                                   (accept → terminal frame committed)
        ├── chat {model}                       (CLIENT; one per model call, from the worker)
        └── execute_tool {name}                (CLIENT; one per tool call, in the parent)

The caller's W3C ``traceparent`` (gRPC metadata) is the RPC span's parent.
A tool host gets its tool call's context in ``ToolInvocation.trace_context``.
A model call runs in a worker, which imports no OpenTelemetry: it gets the
turn's traceparent, sends each HTTP call with a traceparent naming a span id
it drew itself, and reports the call (that id, start and end) afterwards; the
parent then records the span with that very id (``_Ids``), so the backend's
own span of the request hangs under the model call's span.

The provider is built from the environment as the SDK documents it: the
exporters named (entry points of ``opentelemetry_traces_exporter``; ``otlp``
is OTLP over HTTP/protobuf unless ``OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL``
says ``grpc``), each behind a BatchSpanProcessor (``OTEL_BSP_*``), the
sampler (``OTEL_TRACES_SAMPLER``), the resource (``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``; service.name defaults to agent-sidecar) and
the propagators (``OTEL_PROPAGATORS``).
"""

from __future__ import annotations

import contextvars
import importlib.metadata
import logging
import os
import threading
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import SpanKind, Status, StatusCode

log = logging.getLogger("agent_sidecar.obs")

# gRPC codes a server span reports as an error (OpenTelemetry's RPC conventions).
_SERVER_ERRORS = frozenset({"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL",
                            "UNAVAILABLE", "DATA_LOSS"})


class _Ids(RandomIdGenerator):
    """Random ids, except a span id set in advance for the next span (the
    event loop is single-threaded, so set-then-start cannot interleave)."""

    preset = 0

    def generate_span_id(self) -> int:
        if self.preset:
            span_id, self.preset = self.preset, 0
            return span_id
        return super().generate_span_id()


def _exporter_class(name: str) -> Any:
    if name == "otlp":
        protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                    or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip()
        name = "otlp_proto_grpc" if protocol == "grpc" else "otlp_proto_http"
    for ep in importlib.metadata.entry_points(group="opentelemetry_traces_exporter", name=name):
        return ep.load()
    raise LookupError(f"no trace exporter {name!r} is installed")


def _export_timeout_s() -> float:
    """The OTLP exporter's timeout as the SDK reads it (seconds; 10 unless set)."""
    raw = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") or os.environ.get("OTEL_EXPORTER_OTLP_TIMEOUT")
    try:
        return max(0.0, float(raw)) if raw else 10.0
    except ValueError:
        return 10.0


def _resource(version: str) -> Resource:
    named = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", "")
    attrs = {"service.version": version}
    if not named:
        attrs["service.name"] = "agent-sidecar"
    return Resource.create(attrs)


# The SDK's loggers of a full span queue: 1.33 and later (the shared batch
# processor, ``Queue full, dropping Span.``), and before it the span processor's.
_QUEUE_LOGGERS = ("opentelemetry.sdk._shared_internal", "opentelemetry.sdk.trace.export")


class _QueueFull(logging.Filter):
    """A full span queue, told once per episode.

    While the exporter is slower than the spans come (a collector that hangs
    holds the export thread up to its timeout per batch), the batch processor
    drops every span past its queue, and the SDK warns ``Queue full, dropping
    Span.`` once every 20 s for as long as that lasts, with the ids of
    whichever turn happened to end a span then. First among its logger's
    filters, this sees each such line, drops it, and tells the first of an
    episode as a line of its own, outside any turn's context (a full queue is
    no one turn's doing). The episode ends with an export that works with no
    span dropped since the one before it (``exported``)."""

    def __init__(self) -> None:
        super().__init__()
        self.told = False  # an episode is on: its line was written
        self.dropped = False  # a span was dropped since the last export that worked

    def install(self) -> None:
        for name in _QUEUE_LOGGERS:
            logging.getLogger(name).filters.insert(0, self)  # before the SDK's repeat filter

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(("Queue full", "Queue is full")):
            return True
        self.dropped = True
        if not self.told:
            self.told = True
            contextvars.Context().run(log.warning, "trace span queue full: spans are dropped until the"
                                      " exporter keeps up")
        return False

    def exported(self) -> None:
        """An export worked (on the processor's thread)."""
        if self.dropped:
            self.dropped = False
        elif self.told:
            self.told = False
            log.info("trace span queue keeps up again")


class _Episodes(SpanExporter):
    """An exporter whose failures are told once per episode.

    The SDK's exporters log every failed export, and the OTLP ones every
    retry too: a collector that is down or refuses logs a line every second
    or two for as long as it lasts, thousands an hour. Here the first failed
    export of an episode is told (the exporter's own lines for it, then
    ``trace export failing``), the exporter's lines are dropped while the
    episode lasts, and ``trace export works again`` ends it (logs.FaultEpisode
    keeps the sidecar's other repeating failures to one line the same way)."""

    def __init__(self, inner: SpanExporter, name: str, queue: _QueueFull):
        self.inner, self.name, self.queue = inner, name, queue
        self.failing = False
        for cls in type(inner).__mro__:  # the exporter's modules log its failures
            if cls.__module__.startswith("opentelemetry.exporter"):
                logging.getLogger(cls.__module__).addFilter(self._quiet_while_failing)

    def _quiet_while_failing(self, record: logging.LogRecord) -> bool:
        return not self.failing

    def export(self, spans: Any) -> SpanExportResult:
        result = self.inner.export(spans)
        if result is SpanExportResult.SUCCESS:
            self.queue.exported()
            if self.failing:
                self.failing = False
                log.info("trace export works again", extra={"exporter": self.name})
        elif not self.failing:
            self.failing = True
            log.warning("trace export failing: spans are dropped until it works again",
                        extra={"exporter": self.name})
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def _detach(token: Any) -> None:
    """Undo rpc_begin's ``attach``, where it can be undone.

    A streaming call its client cancelled (every watch ends that way) is
    closed by gRPC from another context than its handler ran in, where the
    token cannot be reset, nor needs to be: the context it was set in goes
    with the call. The SDK's ``detach`` logged each such end as an ERROR
    with a traceback (``Failed to detach context``). The token is the
    contextvars Token of the SDK's runtime context (its only one), reset
    here as its ``detach`` does, but quietly when it cannot be."""
    try:
        token.var.reset(token)
    except (ValueError, RuntimeError):  # created in another context, or reset already
        pass


class Tracer:
    """The sidecar's spans. Every method runs on the event loop."""

    @classmethod
    def from_env(cls, names: list[str], version: str) -> Tracer | None:
        exporters = []
        queue = _QueueFull()
        for name in names:
            try:
                exporters.append(_Episodes(_exporter_class(name)(), name, queue))
            except Exception as e:  # a bad exporter name or setting: no traces, still serving
                log.error("trace exporter not available", extra={"exporter": name, "error": str(e)})
        if not exporters:
            return None
        queue.install()
        ids = _Ids()
        provider = TracerProvider(resource=_resource(version), id_generator=ids)
        for exporter in exporters:
            provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)  # in-process tools may add spans of their own
        log.info("tracing on", extra={"exporters": names})
        return cls(provider, ids)

    def __init__(self, provider: TracerProvider, ids: _Ids):
        self.provider, self.ids = provider, ids
        self.tracer = provider.get_tracer("agent_sidecar")

    def shutdown(self) -> None:
        """Export what is buffered and stop the exporters, waiting at most
        the exporter's timeout (blocking: call from a thread).

        The SDK's own shutdown waits up to 30 s for its queue, one batch
        after another, each up to the exporter's timeout, so a collector
        that does not answer held the stop that long after the store's last
        write, past a supervisor's stop timeout; the docs promise one
        timeout. What is not exported by then is dropped with a warning (the
        SDK's thread is a daemon: it ends with the process)."""
        wait_s = _export_timeout_s()
        stopping = threading.Thread(target=self.provider.shutdown, name="otel-shutdown", daemon=True)
        stopping.start()
        stopping.join(wait_s)
        if stopping.is_alive():
            log.warning("spans still buffered at the stop were not exported: the exporter did not finish"
                        " within its timeout", extra={"timeout_s": wait_s})

    # -- RPCs ---------------------------------------------------------------------------

    def rpc_begin(self, method: str, metadata) -> tuple[Any, Any]:
        """The RPC's span, current until rpc_end (so a turn it accepts is its child)."""
        service, _, name = method.lstrip("/").partition("/")
        parent = propagate.extract({m.key: m.value for m in metadata or () if isinstance(m.value, str)})
        span = self.tracer.start_span(f"{service}/{name}", context=parent, kind=SpanKind.SERVER,
                                      attributes={"rpc.system": "grpc", "rpc.service": service,
                                                  "rpc.method": name})
        return span, otel_context.attach(trace.set_span_in_context(span, parent))

    def outgoing(self) -> tuple[tuple[str, str], ...]:
        """What is current (rpc_begin attached it) as W3C headers, for a call made on its behalf."""
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        return tuple(carrier.items())

    def rpc_end(self, span: Any, token: Any, code: Any) -> None:
        _detach(token)
        span.set_attribute("rpc.grpc.status_code", code.value[0])
        if code.name in _SERVER_ERRORS:
            span.set_status(Status(StatusCode.ERROR, code.name))
        span.end()

    # -- turns ----------------------------------------------------------------------------

    def turn_began(self, turn: Any) -> None:
        """The turn's span, a child of what is current (the Prompt RPC's span)."""
        turn.span = self.tracer.start_span("turn", attributes={
            "agent_sidecar.request_id": turn.rid, "agent_sidecar.session_key": turn.key,
            "agent_sidecar.platform": turn.platform, "agent_sidecar.profile": turn.profile})

    def turn_ended(self, turn: Any, outcome: str, reason: str) -> None:
        span = turn.span
        if span is None:
            return
        span.set_attributes({"agent_sidecar.outcome": outcome, "agent_sidecar.reason": reason,
                             "gen_ai.usage.input_tokens": int(turn.usage.get("input_tokens", 0)),
                             "gen_ai.usage.output_tokens": int(turn.usage.get("output_tokens", 0))})
        if outcome in ("failed", "left"):
            span.set_status(Status(StatusCode.ERROR, reason))
        span.end()
        turn.span = None  # ended once, whichever way the turn went

    def traceparent(self, turn: Any) -> str:
        """The turn span's W3C traceparent, for its worker (a turn restored from
        the store at startup gets its span here, as it starts)."""
        if turn.span is None:
            self.turn_began(turn)
        ctx = turn.span.get_span_context()
        return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"

    def model_call(self, turn: Any, msg: dict) -> None:
        """One model call the worker made (wire.ModelCall), recorded after the
        fact with the span id its HTTP traceparent carried."""
        if turn.span is None:
            return
        model = msg.get("model") or msg.get("backend", "")
        self.ids.preset = int(msg["span_id"], 16)
        span = self.tracer.start_span(f"chat {model}".strip(), context=trace.set_span_in_context(turn.span),
                                      kind=SpanKind.CLIENT, start_time=msg["start_ns"], attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": model,
            "agent_sidecar.model_backend": msg.get("backend", ""),
            "agent_sidecar.iteration": msg.get("iteration", 0),
            "gen_ai.usage.input_tokens": msg.get("input_tokens", 0),
            "gen_ai.usage.output_tokens": msg.get("output_tokens", 0)})
        self.ids.preset = 0
        if msg.get("error"):
            span.set_status(Status(StatusCode.ERROR, msg["error"][:500]))
        span.end(end_time=msg["end_ns"])

    def tool_begin(self, turn: Any, name: str, call_id: str) -> tuple[Any, dict[str, str]]:
        """A tool call's span and the W3C headers naming it, for the tool host."""
        if turn.span is None:
            return None, {}
        span = self.tracer.start_span(f"execute_tool {name}", context=trace.set_span_in_context(turn.span),
                                      kind=SpanKind.CLIENT, attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": call_id})
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        return span, carrier

    def tool_end(self, span: Any, ok: bool, refused: str = "") -> None:
        if span is None:
            return
        if refused:
            span.set_attribute("agent_sidecar.reason", refused)
        if not ok:
            span.set_status(Status(StatusCode.ERROR, refused or "the tool call failed"))
        span.end()

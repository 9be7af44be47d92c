"""A real (tiny) OTLP/HTTP trace collector for tests: it listens on 127.0.0.1
with an ephemeral port, takes what a sidecar's OTLP exporter POSTs to
``/v1/traces`` (protobuf), and keeps every span it was sent.

``Collector.env()`` is the environment that points a sidecar's exporter at it
(batches sent every 50 ms); ``spans`` holds ``Span`` records in arrival order,
``wait_for(pred)`` polls them. ``refuse_with = 400`` (any status) answers
every export with that status, taking nothing, until it is set back to 0;
``refused`` counts the exports so answered."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from .waiting import wait_until


def _value(v) -> Any:
    which = v.WhichOneof("value")
    return getattr(v, which) if which else None


@dataclass
class Span:
    name: str
    trace_id: str  # hex
    span_id: str  # hex
    parent_id: str  # hex; "" for a root span
    kind: int  # opentelemetry.proto Span.SpanKind: 2 server, 3 client, 1 internal
    start_ns: int
    end_ns: int
    status: int  # 0 unset, 1 ok, 2 error
    attributes: dict[str, Any] = field(default_factory=dict)
    service: str = ""


class Collector:
    """``on_export``: called in the collector's thread as each export request
    arrives, before it is answered (what else was true at that moment)."""

    def __init__(self, on_export: Callable[[], None] | None = None) -> None:
        self.on_export = on_export
        self.spans: list[Span] = []
        self.refuse_with = 0
        self.refused = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1/traces"

    def env(self) -> dict[str, str]:
        return {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": self.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50"}

    def start(self) -> Collector:
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                if collector.on_export is not None:
                    collector.on_export()
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if collector.refuse_with:
                    collector.refused += 1
                    self.send_response(collector.refuse_with)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.headers.get("Content-Encoding") == "gzip":
                    raw = gzip.decompress(raw)
                collector._take(ExportTraceServiceRequest.FromString(raw))
                body = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Collector:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _take(self, req: ExportTraceServiceRequest) -> None:
        out = []
        for rs in req.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    out.append(Span(s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(),
                                    s.kind, s.start_time_unix_nano, s.end_time_unix_nano, s.status.code,
                                    {a.key: _value(a.value) for a in s.attributes},
                                    resource.get("service.name", "")))
        with self._lock:
            self.spans.extend(out)

    def wait_for(self, pred: Callable[[list[Span]], Any], timeout: float = 15, what: str = "") -> Any:
        """Poll ``pred(spans so far)`` until it returns something truthy."""
        def check():
            with self._lock:
                spans = list(self.spans)
            return pred(spans)
        return wait_until(check, timeout, what=what or "spans at the collector")

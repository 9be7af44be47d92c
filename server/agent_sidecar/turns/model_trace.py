"""Model calls of a traced turn, on the worker side: each call's HTTP request
carries a W3C traceparent naming a span of its own, and the call is reported
to the parent afterwards (wire.ModelCall), which records that span (obs/otel.py).

Pure: no OpenTelemetry and no grpc in the worker; a traceparent is a string
and a span id eight random bytes. Used only when the run message carries a
traceparent (tracing is on in the parent); otherwise the backend is called
as it is.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, AsyncIterator, Callable

from ..models.base import ModelEvent, ModelRequest, UsageReport
from . import wire


def _span_id() -> str:
    while True:
        span_id = os.urandom(8).hex()
        if span_id != "0" * 16:  # all zeros is an invalid span id
            return span_id


class TracedBackend:
    """``backend`` with each call traced under the turn's ``traceparent``;
    ``report`` gets each call's ModelCall message when the call is over."""

    def __init__(self, backend: Any, traceparent: str, request_id: str, profile: dict[str, Any],
                 report: Callable[[dict], None]):
        _, self.trace_id, _, self.flags = traceparent.split("-")[:4]
        self.backend, self.request_id, self.report = backend, request_id, report
        self.name = str(profile.get("model", ""))
        self.model = str((profile.get("model_options") or {}).get("model", ""))

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        span_id = _span_id()
        request.traceparent = f"00-{self.trace_id}-{span_id}-{self.flags}"
        start, error, tokens = time.time_ns(), "", [0, 0]
        try:
            async for event in self.backend.stream(request):
                if type(event) is UsageReport:
                    tokens[0] += event.input_tokens
                    tokens[1] += event.output_tokens
                yield event
        except (asyncio.CancelledError, GeneratorExit):
            error = "cancelled"
            raise
        except BaseException as e:
            error = f"{type(e).__name__}: {e}"
            raise
        finally:
            self.report(wire.model_call(self.request_id, span_id, start, time.time_ns(),
                                        request.iteration, self.name, self.model, tokens[0],
                                        tokens[1], error))

    async def aclose(self) -> None:
        """Nothing: the backend is the worker's (cached for later turns), not this turn's."""

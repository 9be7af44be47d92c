"""Whether the sidecar traces, decided once at startup from the standard
OpenTelemetry environment variables; cheap to ask on the hot path.

Off (the default) means no OpenTelemetry import at all and every hook a test
of ``tracing.ACTIVE`` (None) or of ``turn.span`` (None). On when
``OTEL_TRACES_EXPORTER`` names an exporter (not ``none``), or when only an
OTLP endpoint is set (``OTEL_EXPORTER_OTLP_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``: the exporter is then ``otlp``), unless
``OTEL_SDK_DISABLED=true``. Everything else about the exporter (endpoint,
headers, protocol, batching, sampling, resource) is the SDK's, from the same
``OTEL_*`` variables. Tracing asked for without the ``otel`` extra installed
is a warning, not a refusal to start: traces are never worth an outage.

The SDK-backed half lives in otel.py, imported only when tracing is on.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("agent_sidecar.obs")

# The tracer (otel.Tracer) while tracing is on; None when off.
ACTIVE: Any = None


def exporter_names(env: Mapping[str, str]) -> list[str]:
    """The trace exporters the environment asks for ([]: tracing is off)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    names = env.get("OTEL_TRACES_EXPORTER", "").strip()
    if not names:
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        return ["otlp"] if endpoint else []
    return [n.strip() for n in names.split(",") if n.strip() and n.strip().lower() != "none"]


def configure(version: str, env: Mapping[str, str] | None = None) -> bool:
    """Turn tracing on if the environment asks for it; returns whether it is on.

    Traces are best effort: an OTEL_* setting the SDK refuses (an unknown
    propagator, which fails its import; a batch size above the queue size)
    is logged, once, as an error and the sidecar serves without traces, as
    for an exporter that cannot be made; it never stops the start."""
    global ACTIVE
    names = exporter_names(os.environ if env is None else env)
    if not names:
        return False
    try:
        from . import otel
    except ImportError as e:
        log.warning("tracing asked for but OpenTelemetry is not installed: pip install 'agent-sidecar[otel]'",
                    extra={"exporters": names, "error": str(e)})
        return False
    except Exception as e:  # the SDK's import refused a setting (OTEL_PROPAGATORS)
        log.error("tracing not available", extra={"exporters": names, "error": f"{type(e).__name__}: {e}"})
        return False
    try:
        ACTIVE = otel.Tracer.from_env(names, version)
    except Exception as e:  # a setting the SDK refuses (OTEL_BSP_*)
        log.error("tracing not available", extra={"exporters": names, "error": f"{type(e).__name__}: {e}"})
        return False
    return ACTIVE is not None


def outgoing_metadata() -> tuple[tuple[str, str], ...]:
    """The current trace context (the RPC span being served) as gRPC metadata,
    ``traceparent`` and ``tracestate``, for a call this sidecar makes on its
    caller's behalf (cluster/forward.py): the other node's spans then join
    the caller's trace under this node's span instead of starting one of
    their own. Empty while tracing is off, so nothing is propagated then."""
    return ACTIVE.outgoing() if ACTIVE is not None else ()


def turn_left(turn: Any, reason: str) -> None:
    """``turn`` leaves this node without a terminal frame committed here (its
    lane moved or was deleted, it was refused before its accept, the sidecar
    stopped first): its span, if it has one, ends now with ``reason`` as an
    error, so the trace is exported rather than lost with the span."""
    if ACTIVE is not None and turn.span is not None:
        ACTIVE.turn_ended(turn, "left", reason)


def shutdown() -> None:
    """Export what is buffered and stop the exporters (blocking: call from a
    thread). ``ACTIVE`` stays: a span ended later is dropped, not an error."""
    if ACTIVE is not None:
        ACTIVE.shutdown()

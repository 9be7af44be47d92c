"""Stopping and starting a sidecar in recovery tests: health, the
clean-shutdown marker, and a restart that returns once the startup restore is done."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .waiting import wait_until

# How an auto-resume turn's synthetic note begins (turns/supervision.py RESUME_TEXT).
RESUME_PREFIX = "[The previous turn was interrupted"
# The echo's pace (ms a word) for a test that waits for an auto-resume turn:
# that turn echoes the ~60-word note (12 s at 200 ms a word, 3 s at this).
RESUMED_MS = 50


def health(target: str, timeout: float = 1.0) -> str:
    """The health status name, or the RPC error code name when it does not answer."""
    try:
        with grpc.insecure_channel(target) as ch:
            r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
            return health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
    except grpc.RpcError as e:
        return e.code().name


def marker(sc) -> bool:
    """Whether the data dir holds the clean-shutdown marker."""
    return (sc.data_dir / ".clean_shutdown").exists()


def _serving_lines(sc) -> int:
    try:
        return sc.log_path.read_bytes().count(b'"msg":"serving"')
    except OSError:
        return 0


def restart(sc, timeout: float = 30):
    """Start (again) and wait until the startup restore and the auto-resume
    submissions are done. Health alone is not enough: it says SERVING before
    that (see recovery/test_crash_loop.py's health test), and the API has no
    "restored" signal, so this waits for the sidecar's own "serving" log line.
    The line is a readiness signal here, never what a test asserts."""
    before = _serving_lines(sc)
    sc.start(timeout)
    wait_until(lambda: _serving_lines(sc) > before, timeout, 0.01, "the 'serving' log line")
    return sc

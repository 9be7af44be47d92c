"""Stopping and starting a sidecar in recovery tests: health, the
clean-shutdown marker, and a restart that returns once the startup restore is done."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

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


def restart(sc, timeout: float = 30):
    """Start (again); returns once the startup restore is done, every lane
    marked and every auto-resume turn submitted (in the ledger): the sidecar
    reports SERVING only then (recovery/test_crash_loop.py's health test
    holds it to that), and Sidecar.start waits for SERVING."""
    return sc.start(timeout)

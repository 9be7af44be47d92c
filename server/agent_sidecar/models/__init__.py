"""Model backends: the interface (base), the registry, and the built-ins.

Imported by worker processes: nothing here may import grpc or protobuf, and
httpx is imported only by the openai backend, only when it is used.
"""

from agent_sidecar.models.base import (
    ModelBackend,
    ModelError,
    ModelEvent,
    ModelRequest,
    TextDelta,
    ToolCallRequest,
    UsageReport,
)
from agent_sidecar.models.registry import backend_names, load_backend

__all__ = [
    "ModelBackend",
    "ModelError",
    "ModelEvent",
    "ModelRequest",
    "TextDelta",
    "ToolCallRequest",
    "UsageReport",
    "backend_names",
    "load_backend",
]

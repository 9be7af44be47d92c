"""Python asyncio client for agent-sidecar.

    from agent_sidecar_client import connect

    async with await connect("unix:./data/sidecar.sock") as client:
        session = await client.get_or_create_session({"platform": "local", "chat_id": "me"})
        async for frame in client.prompt("hello", session_key=session.session_key):
            if frame.WhichOneof("event") == "text_delta":
                print(frame.text_delta.text, end="")

Frames and sessions are the generated protobuf messages (re-exported below);
errors are the typed classes of ``errors`` (one per reason of docs/api.md).
``ErrorReason`` is the proto's enum of every reason: a reason string is
``ErrorReason.Name(v)`` without the ``ERROR_REASON_`` prefix.
"""

from agent_sidecar_client._args import normalize_target, target_address
from agent_sidecar_client._frames import TERMINAL_KINDS, CursorFilter, SeqFilter, SequenceGap, frame_kind
from agent_sidecar_client._proto.common_pb2 import Message, Session, SessionSource, SessionState, Usage
from agent_sidecar_client._proto.error_reason_pb2 import ErrorReason
from agent_sidecar_client._proto.prompt_service_pb2 import ActivityFrame, Attachment, DeliveryMode
from agent_sidecar_client._proto.tool_service_pb2 import ToolInvocation
from agent_sidecar_client._stream import FrameStream
from agent_sidecar_client._tls import tls_credentials
from agent_sidecar_client.client import DEFAULT_TARGET, SidecarClient, connect
from agent_sidecar_client.errors import (
    AgentBusy,
    AgentTimeout,
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    LaneMoved,
    LlmApiFailure,
    MaxIterations,
    Overloaded,
    PermissionDenied,
    QueueFull,
    RequestNotFound,
    ResourceExhausted,
    RestartInterrupted,
    SessionNotFound,
    ShutdownTimeout,
    SidecarError,
    StoreUnavailable,
    StreamTooSlow,
    ToolInvokeFailed,
    ToolScopeViolation,
    TurnFramesGone,
    Unauthenticated,
    Unavailable,
    WorkerCrashed,
)
from agent_sidecar_client.tools import ToolHost

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_TARGET", "SidecarClient", "connect", "tls_credentials", "FrameStream", "ToolHost",
    "ActivityFrame", "Attachment", "DeliveryMode", "Message", "Session", "SessionSource", "SessionState",
    "ToolInvocation", "Usage", "ErrorReason", "TERMINAL_KINDS", "frame_kind", "SeqFilter", "CursorFilter",
    "SequenceGap", "normalize_target", "target_address",
    "SidecarError", "AgentBusy", "AgentTimeout", "LlmApiFailure", "MaxIterations", "ToolScopeViolation",
    "ToolInvokeFailed", "Cancelled", "SessionNotFound", "InvalidArgument", "Unauthenticated",
    "PermissionDenied", "WorkerCrashed", "DeadlineExceeded", "TurnFramesGone", "FailedPrecondition",
    "ResourceExhausted", "Unavailable", "RequestNotFound", "Internal", "RestartInterrupted", "ShutdownTimeout",
    "StreamTooSlow", "Overloaded", "QueueFull", "StoreUnavailable", "LaneMoved",
]

from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_REASON_UNSPECIFIED: _ClassVar[ErrorReason]
    ERROR_REASON_AGENT_BUSY: _ClassVar[ErrorReason]
    ERROR_REASON_AGENT_TIMEOUT: _ClassVar[ErrorReason]
    ERROR_REASON_LLM_API_FAILURE: _ClassVar[ErrorReason]
    ERROR_REASON_MAX_ITERATIONS: _ClassVar[ErrorReason]
    ERROR_REASON_TOOL_SCOPE_VIOLATION: _ClassVar[ErrorReason]
    ERROR_REASON_TOOL_INVOKE_FAILED: _ClassVar[ErrorReason]
    ERROR_REASON_CANCELLED: _ClassVar[ErrorReason]
    ERROR_REASON_SESSION_NOT_FOUND: _ClassVar[ErrorReason]
    ERROR_REASON_INVALID_ARGUMENT: _ClassVar[ErrorReason]
    ERROR_REASON_UNAUTHENTICATED: _ClassVar[ErrorReason]
    ERROR_REASON_PERMISSION_DENIED: _ClassVar[ErrorReason]
    ERROR_REASON_WORKER_CRASHED: _ClassVar[ErrorReason]
    ERROR_REASON_FAILED_PRECONDITION: _ClassVar[ErrorReason]
    ERROR_REASON_RESOURCE_EXHAUSTED: _ClassVar[ErrorReason]
    ERROR_REASON_UNAVAILABLE: _ClassVar[ErrorReason]
    ERROR_REASON_REQUEST_NOT_FOUND: _ClassVar[ErrorReason]
    ERROR_REASON_INTERNAL: _ClassVar[ErrorReason]
    ERROR_REASON_RESTART_INTERRUPTED: _ClassVar[ErrorReason]
    ERROR_REASON_SHUTDOWN_TIMEOUT: _ClassVar[ErrorReason]
ERROR_REASON_UNSPECIFIED: ErrorReason
ERROR_REASON_AGENT_BUSY: ErrorReason
ERROR_REASON_AGENT_TIMEOUT: ErrorReason
ERROR_REASON_LLM_API_FAILURE: ErrorReason
ERROR_REASON_MAX_ITERATIONS: ErrorReason
ERROR_REASON_TOOL_SCOPE_VIOLATION: ErrorReason
ERROR_REASON_TOOL_INVOKE_FAILED: ErrorReason
ERROR_REASON_CANCELLED: ErrorReason
ERROR_REASON_SESSION_NOT_FOUND: ErrorReason
ERROR_REASON_INVALID_ARGUMENT: ErrorReason
ERROR_REASON_UNAUTHENTICATED: ErrorReason
ERROR_REASON_PERMISSION_DENIED: ErrorReason
ERROR_REASON_WORKER_CRASHED: ErrorReason
ERROR_REASON_FAILED_PRECONDITION: ErrorReason
ERROR_REASON_RESOURCE_EXHAUSTED: ErrorReason
ERROR_REASON_UNAVAILABLE: ErrorReason
ERROR_REASON_REQUEST_NOT_FOUND: ErrorReason
ERROR_REASON_INTERNAL: ErrorReason
ERROR_REASON_RESTART_INTERRUPTED: ErrorReason
ERROR_REASON_SHUTDOWN_TIMEOUT: ErrorReason

import datetime

from agent_sidecar_client._proto import common_pb2 as _common_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DeliveryMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DELIVERY_MODE_UNSPECIFIED: _ClassVar[DeliveryMode]
    DELIVERY_MODE_REJECT_IF_BUSY: _ClassVar[DeliveryMode]
    DELIVERY_MODE_FOLLOW_UP: _ClassVar[DeliveryMode]
    DELIVERY_MODE_QUEUE: _ClassVar[DeliveryMode]
    DELIVERY_MODE_INTERRUPT: _ClassVar[DeliveryMode]
    DELIVERY_MODE_ROLLBACK: _ClassVar[DeliveryMode]
    DELIVERY_MODE_STEER: _ClassVar[DeliveryMode]
DELIVERY_MODE_UNSPECIFIED: DeliveryMode
DELIVERY_MODE_REJECT_IF_BUSY: DeliveryMode
DELIVERY_MODE_FOLLOW_UP: DeliveryMode
DELIVERY_MODE_QUEUE: DeliveryMode
DELIVERY_MODE_INTERRUPT: DeliveryMode
DELIVERY_MODE_ROLLBACK: DeliveryMode
DELIVERY_MODE_STEER: DeliveryMode

class Attachment(_message.Message):
    __slots__ = ("name", "mime_type", "data", "url")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    name: str
    mime_type: str
    data: bytes
    url: str
    def __init__(self, name: _Optional[str] = ..., mime_type: _Optional[str] = ..., data: _Optional[bytes] = ..., url: _Optional[str] = ...) -> None: ...

class PromptRequest(_message.Message):
    __slots__ = ("request_id", "source", "session_key", "text", "attachments", "delivery", "profile")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SESSION_KEY_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    ATTACHMENTS_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    source: _common_pb2.SessionSource
    session_key: str
    text: str
    attachments: _containers.RepeatedCompositeFieldContainer[Attachment]
    delivery: DeliveryMode
    profile: str
    def __init__(self, request_id: _Optional[str] = ..., source: _Optional[_Union[_common_pb2.SessionSource, _Mapping]] = ..., session_key: _Optional[str] = ..., text: _Optional[str] = ..., attachments: _Optional[_Iterable[_Union[Attachment, _Mapping]]] = ..., delivery: _Optional[_Union[DeliveryMode, str]] = ..., profile: _Optional[str] = ...) -> None: ...

class ActivityFrame(_message.Message):
    __slots__ = ("request_id", "session_key", "session_id", "seq", "at", "cursor", "accepted", "started", "text_delta", "tool_call", "tool_result", "usage", "completed", "failed", "superseded", "keepalive")
    class Accepted(_message.Message):
        __slots__ = ("queue_position",)
        QUEUE_POSITION_FIELD_NUMBER: _ClassVar[int]
        queue_position: int
        def __init__(self, queue_position: _Optional[int] = ...) -> None: ...
    class Started(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class TextDelta(_message.Message):
        __slots__ = ("text",)
        TEXT_FIELD_NUMBER: _ClassVar[int]
        text: str
        def __init__(self, text: _Optional[str] = ...) -> None: ...
    class ToolCall(_message.Message):
        __slots__ = ("call_id", "name", "arguments_json")
        CALL_ID_FIELD_NUMBER: _ClassVar[int]
        NAME_FIELD_NUMBER: _ClassVar[int]
        ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
        call_id: str
        name: str
        arguments_json: str
        def __init__(self, call_id: _Optional[str] = ..., name: _Optional[str] = ..., arguments_json: _Optional[str] = ...) -> None: ...
    class ToolResult(_message.Message):
        __slots__ = ("call_id", "ok", "result_json")
        CALL_ID_FIELD_NUMBER: _ClassVar[int]
        OK_FIELD_NUMBER: _ClassVar[int]
        RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
        call_id: str
        ok: bool
        result_json: str
        def __init__(self, call_id: _Optional[str] = ..., ok: _Optional[bool] = ..., result_json: _Optional[str] = ...) -> None: ...
    class Completed(_message.Message):
        __slots__ = ("final_text",)
        FINAL_TEXT_FIELD_NUMBER: _ClassVar[int]
        final_text: str
        def __init__(self, final_text: _Optional[str] = ...) -> None: ...
    class Failed(_message.Message):
        __slots__ = ("reason", "message")
        REASON_FIELD_NUMBER: _ClassVar[int]
        MESSAGE_FIELD_NUMBER: _ClassVar[int]
        reason: str
        message: str
        def __init__(self, reason: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...
    class Superseded(_message.Message):
        __slots__ = ("by_request_id",)
        BY_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
        by_request_id: str
        def __init__(self, by_request_id: _Optional[str] = ...) -> None: ...
    class Keepalive(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_KEY_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    TEXT_DELTA_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    TOOL_RESULT_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    SUPERSEDED_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    session_key: str
    session_id: str
    seq: int
    at: _timestamp_pb2.Timestamp
    cursor: int
    accepted: ActivityFrame.Accepted
    started: ActivityFrame.Started
    text_delta: ActivityFrame.TextDelta
    tool_call: ActivityFrame.ToolCall
    tool_result: ActivityFrame.ToolResult
    usage: _common_pb2.Usage
    completed: ActivityFrame.Completed
    failed: ActivityFrame.Failed
    superseded: ActivityFrame.Superseded
    keepalive: ActivityFrame.Keepalive
    def __init__(self, request_id: _Optional[str] = ..., session_key: _Optional[str] = ..., session_id: _Optional[str] = ..., seq: _Optional[int] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cursor: _Optional[int] = ..., accepted: _Optional[_Union[ActivityFrame.Accepted, _Mapping]] = ..., started: _Optional[_Union[ActivityFrame.Started, _Mapping]] = ..., text_delta: _Optional[_Union[ActivityFrame.TextDelta, _Mapping]] = ..., tool_call: _Optional[_Union[ActivityFrame.ToolCall, _Mapping]] = ..., tool_result: _Optional[_Union[ActivityFrame.ToolResult, _Mapping]] = ..., usage: _Optional[_Union[_common_pb2.Usage, _Mapping]] = ..., completed: _Optional[_Union[ActivityFrame.Completed, _Mapping]] = ..., failed: _Optional[_Union[ActivityFrame.Failed, _Mapping]] = ..., superseded: _Optional[_Union[ActivityFrame.Superseded, _Mapping]] = ..., keepalive: _Optional[_Union[ActivityFrame.Keepalive, _Mapping]] = ...) -> None: ...

class PromptResponse(_message.Message):
    __slots__ = ("frame",)
    FRAME_FIELD_NUMBER: _ClassVar[int]
    frame: ActivityFrame
    def __init__(self, frame: _Optional[_Union[ActivityFrame, _Mapping]] = ...) -> None: ...

class WatchActivityRequest(_message.Message):
    __slots__ = ("request_id", "session_key", "platform", "after_seq", "after_cursor")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_KEY_FIELD_NUMBER: _ClassVar[int]
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    AFTER_CURSOR_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    session_key: str
    platform: str
    after_seq: int
    after_cursor: int
    def __init__(self, request_id: _Optional[str] = ..., session_key: _Optional[str] = ..., platform: _Optional[str] = ..., after_seq: _Optional[int] = ..., after_cursor: _Optional[int] = ...) -> None: ...

class WatchActivityResponse(_message.Message):
    __slots__ = ("frame",)
    FRAME_FIELD_NUMBER: _ClassVar[int]
    frame: ActivityFrame
    def __init__(self, frame: _Optional[_Union[ActivityFrame, _Mapping]] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("session_key", "request_id")
    SESSION_KEY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    session_key: str
    request_id: str
    def __init__(self, session_key: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ("cancelled",)
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    cancelled: bool
    def __init__(self, cancelled: _Optional[bool] = ...) -> None: ...

class GetQueueRequest(_message.Message):
    __slots__ = ("session_key",)
    SESSION_KEY_FIELD_NUMBER: _ClassVar[int]
    session_key: str
    def __init__(self, session_key: _Optional[str] = ...) -> None: ...

class QueuedPrompt(_message.Message):
    __slots__ = ("request_id", "text", "delivery", "enqueued_at", "text_truncated", "text_bytes")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    ENQUEUED_AT_FIELD_NUMBER: _ClassVar[int]
    TEXT_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    TEXT_BYTES_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    text: str
    delivery: DeliveryMode
    enqueued_at: _timestamp_pb2.Timestamp
    text_truncated: bool
    text_bytes: int
    def __init__(self, request_id: _Optional[str] = ..., text: _Optional[str] = ..., delivery: _Optional[_Union[DeliveryMode, str]] = ..., enqueued_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., text_truncated: _Optional[bool] = ..., text_bytes: _Optional[int] = ...) -> None: ...

class GetQueueResponse(_message.Message):
    __slots__ = ("pending", "queued")
    PENDING_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    pending: QueuedPrompt
    queued: _containers.RepeatedCompositeFieldContainer[QueuedPrompt]
    def __init__(self, pending: _Optional[_Union[QueuedPrompt, _Mapping]] = ..., queued: _Optional[_Iterable[_Union[QueuedPrompt, _Mapping]]] = ...) -> None: ...

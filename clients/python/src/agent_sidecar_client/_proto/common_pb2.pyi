import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SessionState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SESSION_STATE_UNSPECIFIED: _ClassVar[SessionState]
    SESSION_STATE_IDLE: _ClassVar[SessionState]
    SESSION_STATE_RUNNING: _ClassVar[SessionState]
SESSION_STATE_UNSPECIFIED: SessionState
SESSION_STATE_IDLE: SessionState
SESSION_STATE_RUNNING: SessionState

class SessionSource(_message.Message):
    __slots__ = ("platform", "chat_id", "chat_name", "chat_type", "user_id", "user_name", "thread_id", "chat_topic", "user_id_alt", "chat_id_alt", "is_bot", "guild_id", "parent_chat_id", "message_id", "role_authorized")
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    CHAT_ID_FIELD_NUMBER: _ClassVar[int]
    CHAT_NAME_FIELD_NUMBER: _ClassVar[int]
    CHAT_TYPE_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    USER_NAME_FIELD_NUMBER: _ClassVar[int]
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    CHAT_TOPIC_FIELD_NUMBER: _ClassVar[int]
    USER_ID_ALT_FIELD_NUMBER: _ClassVar[int]
    CHAT_ID_ALT_FIELD_NUMBER: _ClassVar[int]
    IS_BOT_FIELD_NUMBER: _ClassVar[int]
    GUILD_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_CHAT_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_AUTHORIZED_FIELD_NUMBER: _ClassVar[int]
    platform: str
    chat_id: str
    chat_name: str
    chat_type: str
    user_id: str
    user_name: str
    thread_id: str
    chat_topic: str
    user_id_alt: str
    chat_id_alt: str
    is_bot: bool
    guild_id: str
    parent_chat_id: str
    message_id: str
    role_authorized: bool
    def __init__(self, platform: _Optional[str] = ..., chat_id: _Optional[str] = ..., chat_name: _Optional[str] = ..., chat_type: _Optional[str] = ..., user_id: _Optional[str] = ..., user_name: _Optional[str] = ..., thread_id: _Optional[str] = ..., chat_topic: _Optional[str] = ..., user_id_alt: _Optional[str] = ..., chat_id_alt: _Optional[str] = ..., is_bot: _Optional[bool] = ..., guild_id: _Optional[str] = ..., parent_chat_id: _Optional[str] = ..., message_id: _Optional[str] = ..., role_authorized: _Optional[bool] = ...) -> None: ...

class Session(_message.Message):
    __slots__ = ("session_key", "session_id", "created_at", "updated_at", "origin", "display_name", "platform", "chat_type", "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "total_tokens", "estimated_cost_usd", "cost_status", "last_prompt_tokens", "was_auto_reset", "auto_reset_reason", "reset_had_activity", "is_fresh_reset", "expiry_finalized", "suspended", "resume_pending", "resume_reason", "last_resume_marked_at", "state", "turn_count", "queue_depth", "profile")
    SESSION_KEY_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    CHAT_TYPE_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHE_READ_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHE_WRITE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_COST_USD_FIELD_NUMBER: _ClassVar[int]
    COST_STATUS_FIELD_NUMBER: _ClassVar[int]
    LAST_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    WAS_AUTO_RESET_FIELD_NUMBER: _ClassVar[int]
    AUTO_RESET_REASON_FIELD_NUMBER: _ClassVar[int]
    RESET_HAD_ACTIVITY_FIELD_NUMBER: _ClassVar[int]
    IS_FRESH_RESET_FIELD_NUMBER: _ClassVar[int]
    EXPIRY_FINALIZED_FIELD_NUMBER: _ClassVar[int]
    SUSPENDED_FIELD_NUMBER: _ClassVar[int]
    RESUME_PENDING_FIELD_NUMBER: _ClassVar[int]
    RESUME_REASON_FIELD_NUMBER: _ClassVar[int]
    LAST_RESUME_MARKED_AT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TURN_COUNT_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    session_key: str
    session_id: str
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    origin: SessionSource
    display_name: str
    platform: str
    chat_type: str
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    total_tokens: int
    estimated_cost_usd: float
    cost_status: str
    last_prompt_tokens: int
    was_auto_reset: bool
    auto_reset_reason: str
    reset_had_activity: bool
    is_fresh_reset: bool
    expiry_finalized: bool
    suspended: bool
    resume_pending: bool
    resume_reason: str
    last_resume_marked_at: _timestamp_pb2.Timestamp
    state: SessionState
    turn_count: int
    queue_depth: int
    profile: str
    def __init__(self, session_key: _Optional[str] = ..., session_id: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., origin: _Optional[_Union[SessionSource, _Mapping]] = ..., display_name: _Optional[str] = ..., platform: _Optional[str] = ..., chat_type: _Optional[str] = ..., input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., cache_read_tokens: _Optional[int] = ..., cache_write_tokens: _Optional[int] = ..., total_tokens: _Optional[int] = ..., estimated_cost_usd: _Optional[float] = ..., cost_status: _Optional[str] = ..., last_prompt_tokens: _Optional[int] = ..., was_auto_reset: _Optional[bool] = ..., auto_reset_reason: _Optional[str] = ..., reset_had_activity: _Optional[bool] = ..., is_fresh_reset: _Optional[bool] = ..., expiry_finalized: _Optional[bool] = ..., suspended: _Optional[bool] = ..., resume_pending: _Optional[bool] = ..., resume_reason: _Optional[str] = ..., last_resume_marked_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., state: _Optional[_Union[SessionState, str]] = ..., turn_count: _Optional[int] = ..., queue_depth: _Optional[int] = ..., profile: _Optional[str] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("role", "content", "tool_call_id", "tool_name", "tool_calls_json", "created_at", "seq", "active", "synthetic")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_JSON_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    SYNTHETIC_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    tool_call_id: str
    tool_name: str
    tool_calls_json: str
    created_at: _timestamp_pb2.Timestamp
    seq: int
    active: bool
    synthetic: bool
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., tool_call_id: _Optional[str] = ..., tool_name: _Optional[str] = ..., tool_calls_json: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., seq: _Optional[int] = ..., active: _Optional[bool] = ..., synthetic: _Optional[bool] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "cost_usd")
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHE_READ_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHE_WRITE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COST_USD_FIELD_NUMBER: _ClassVar[int]
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cost_usd: float
    def __init__(self, input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., cache_read_tokens: _Optional[int] = ..., cache_write_tokens: _Optional[int] = ..., cost_usd: _Optional[float] = ...) -> None: ...

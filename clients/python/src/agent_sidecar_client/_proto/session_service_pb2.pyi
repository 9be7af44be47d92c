import datetime

from agent_sidecar_client._proto import common_pb2 as _common_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetOrCreateSessionRequest(_message.Message):
    __slots__ = ("source", "force_new", "profile")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    FORCE_NEW_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    source: _common_pb2.SessionSource
    force_new: bool
    profile: str
    def __init__(self, source: _Optional[_Union[_common_pb2.SessionSource, _Mapping]] = ..., force_new: _Optional[bool] = ..., profile: _Optional[str] = ...) -> None: ...

class GetOrCreateSessionResponse(_message.Message):
    __slots__ = ("session", "created")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    session: _common_pb2.Session
    created: bool
    def __init__(self, session: _Optional[_Union[_common_pb2.Session, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("session_key", "session_id")
    SESSION_KEY_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_key: str
    session_id: str
    def __init__(self, session_key: _Optional[str] = ..., session_id: _Optional[str] = ...) -> None: ...

class GetSessionResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: _common_pb2.Session
    def __init__(self, session: _Optional[_Union[_common_pb2.Session, _Mapping]] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ("platform", "active_within_seconds", "page_size", "page_token")
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_WITHIN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    platform: str
    active_within_seconds: int
    page_size: int
    page_token: str
    def __init__(self, platform: _Optional[str] = ..., active_within_seconds: _Optional[int] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ("sessions", "next_page_token")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[_common_pb2.Session]
    next_page_token: str
    def __init__(self, sessions: _Optional[_Iterable[_Union[_common_pb2.Session, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ResetSessionRequest(_message.Message):
    __slots__ = ("session_key", "display_name")
    SESSION_KEY_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    session_key: str
    display_name: str
    def __init__(self, session_key: _Optional[str] = ..., display_name: _Optional[str] = ...) -> None: ...

class ResetSessionResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: _common_pb2.Session
    def __init__(self, session: _Optional[_Union[_common_pb2.Session, _Mapping]] = ...) -> None: ...

class SwitchSessionRequest(_message.Message):
    __slots__ = ("session_key", "target_session_id")
    SESSION_KEY_FIELD_NUMBER: _ClassVar[int]
    TARGET_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_key: str
    target_session_id: str
    def __init__(self, session_key: _Optional[str] = ..., target_session_id: _Optional[str] = ...) -> None: ...

class SwitchSessionResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: _common_pb2.Session
    def __init__(self, session: _Optional[_Union[_common_pb2.Session, _Mapping]] = ...) -> None: ...

class SuspendSessionRequest(_message.Message):
    __slots__ = ("session_key",)
    SESSION_KEY_FIELD_NUMBER: _ClassVar[int]
    session_key: str
    def __init__(self, session_key: _Optional[str] = ...) -> None: ...

class SuspendSessionResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: _common_pb2.Session
    def __init__(self, session: _Optional[_Union[_common_pb2.Session, _Mapping]] = ...) -> None: ...

class MarkResumePendingRequest(_message.Message):
    __slots__ = ("session_key", "reason")
    SESSION_KEY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    session_key: str
    reason: str
    def __init__(self, session_key: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class MarkResumePendingResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: _common_pb2.Session
    def __init__(self, session: _Optional[_Union[_common_pb2.Session, _Mapping]] = ...) -> None: ...

class DeleteSessionRequest(_message.Message):
    __slots__ = ("session_key",)
    SESSION_KEY_FIELD_NUMBER: _ClassVar[int]
    session_key: str
    def __init__(self, session_key: _Optional[str] = ...) -> None: ...

class DeleteSessionResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class ClearAllSessionsRequest(_message.Message):
    __slots__ = ("confirm",)
    CONFIRM_FIELD_NUMBER: _ClassVar[int]
    confirm: str
    def __init__(self, confirm: _Optional[str] = ...) -> None: ...

class ClearAllSessionsResponse(_message.Message):
    __slots__ = ("sessions_deleted",)
    SESSIONS_DELETED_FIELD_NUMBER: _ClassVar[int]
    sessions_deleted: int
    def __init__(self, sessions_deleted: _Optional[int] = ...) -> None: ...

class SeedSessionRequest(_message.Message):
    __slots__ = ("source", "session_key", "messages", "profile")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SESSION_KEY_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    source: _common_pb2.SessionSource
    session_key: str
    messages: _containers.RepeatedCompositeFieldContainer[_common_pb2.Message]
    profile: str
    def __init__(self, source: _Optional[_Union[_common_pb2.SessionSource, _Mapping]] = ..., session_key: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_common_pb2.Message, _Mapping]]] = ..., profile: _Optional[str] = ...) -> None: ...

class SeedSessionResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: _common_pb2.Session
    def __init__(self, session: _Optional[_Union[_common_pb2.Session, _Mapping]] = ...) -> None: ...

class GetTranscriptRequest(_message.Message):
    __slots__ = ("session_id", "include_rewound", "page_size", "page_token")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_REWOUND_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    include_rewound: bool
    page_size: int
    page_token: str
    def __init__(self, session_id: _Optional[str] = ..., include_rewound: _Optional[bool] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class GetTranscriptResponse(_message.Message):
    __slots__ = ("messages", "next_page_token")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[_common_pb2.Message]
    next_page_token: str
    def __init__(self, messages: _Optional[_Iterable[_Union[_common_pb2.Message, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class AppendMessagesRequest(_message.Message):
    __slots__ = ("session_id", "messages")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    messages: _containers.RepeatedCompositeFieldContainer[_common_pb2.Message]
    def __init__(self, session_id: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_common_pb2.Message, _Mapping]]] = ...) -> None: ...

class AppendMessagesResponse(_message.Message):
    __slots__ = ("first_seq", "last_seq")
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    first_seq: int
    last_seq: int
    def __init__(self, first_seq: _Optional[int] = ..., last_seq: _Optional[int] = ...) -> None: ...

class RewriteTranscriptRequest(_message.Message):
    __slots__ = ("session_id", "messages")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    messages: _containers.RepeatedCompositeFieldContainer[_common_pb2.Message]
    def __init__(self, session_id: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_common_pb2.Message, _Mapping]]] = ...) -> None: ...

class RewriteTranscriptResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RewindSessionRequest(_message.Message):
    __slots__ = ("session_id", "n")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    n: int
    def __init__(self, session_id: _Optional[str] = ..., n: _Optional[int] = ...) -> None: ...

class RewindSessionResponse(_message.Message):
    __slots__ = ("rewound_count", "turns_undone", "target_text")
    REWOUND_COUNT_FIELD_NUMBER: _ClassVar[int]
    TURNS_UNDONE_FIELD_NUMBER: _ClassVar[int]
    TARGET_TEXT_FIELD_NUMBER: _ClassVar[int]
    rewound_count: int
    turns_undone: int
    target_text: str
    def __init__(self, rewound_count: _Optional[int] = ..., turns_undone: _Optional[int] = ..., target_text: _Optional[str] = ...) -> None: ...

class SearchMessagesRequest(_message.Message):
    __slots__ = ("query", "session_key", "limit")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    SESSION_KEY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    query: str
    session_key: str
    limit: int
    def __init__(self, query: _Optional[str] = ..., session_key: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class SearchHit(_message.Message):
    __slots__ = ("session_key", "session_id", "seq", "role", "snippet", "created_at")
    SESSION_KEY_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    SNIPPET_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    session_key: str
    session_id: str
    seq: int
    role: str
    snippet: str
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, session_key: _Optional[str] = ..., session_id: _Optional[str] = ..., seq: _Optional[int] = ..., role: _Optional[str] = ..., snippet: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class SearchMessagesResponse(_message.Message):
    __slots__ = ("hits",)
    HITS_FIELD_NUMBER: _ClassVar[int]
    hits: _containers.RepeatedCompositeFieldContainer[SearchHit]
    def __init__(self, hits: _Optional[_Iterable[_Union[SearchHit, _Mapping]]] = ...) -> None: ...

class UpdateUsageRequest(_message.Message):
    __slots__ = ("session_key", "delta", "last_prompt_tokens", "cost_status")
    SESSION_KEY_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    LAST_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COST_STATUS_FIELD_NUMBER: _ClassVar[int]
    session_key: str
    delta: _common_pb2.Usage
    last_prompt_tokens: int
    cost_status: str
    def __init__(self, session_key: _Optional[str] = ..., delta: _Optional[_Union[_common_pb2.Usage, _Mapping]] = ..., last_prompt_tokens: _Optional[int] = ..., cost_status: _Optional[str] = ...) -> None: ...

class UpdateUsageResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: _common_pb2.Session
    def __init__(self, session: _Optional[_Union[_common_pb2.Session, _Mapping]] = ...) -> None: ...

class PruneSessionsRequest(_message.Message):
    __slots__ = ("max_age_days",)
    MAX_AGE_DAYS_FIELD_NUMBER: _ClassVar[int]
    max_age_days: int
    def __init__(self, max_age_days: _Optional[int] = ...) -> None: ...

class PruneSessionsResponse(_message.Message):
    __slots__ = ("pruned",)
    PRUNED_FIELD_NUMBER: _ClassVar[int]
    pruned: int
    def __init__(self, pruned: _Optional[int] = ...) -> None: ...

class GetSessionContextRequest(_message.Message):
    __slots__ = ("source", "profile")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    source: _common_pb2.SessionSource
    profile: str
    def __init__(self, source: _Optional[_Union[_common_pb2.SessionSource, _Mapping]] = ..., profile: _Optional[str] = ...) -> None: ...

class GetSessionContextResponse(_message.Message):
    __slots__ = ("prompt_section", "shared_multi_user")
    PROMPT_SECTION_FIELD_NUMBER: _ClassVar[int]
    SHARED_MULTI_USER_FIELD_NUMBER: _ClassVar[int]
    prompt_section: str
    shared_multi_user: bool
    def __init__(self, prompt_section: _Optional[str] = ..., shared_multi_user: _Optional[bool] = ...) -> None: ...

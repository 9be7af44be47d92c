from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ToolSpec(_message.Message):
    __slots__ = ("name", "description", "parameters_json_schema")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    parameters_json_schema: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters_json_schema: _Optional[str] = ...) -> None: ...

class RegisterTools(_message.Message):
    __slots__ = ("namespace", "tools")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    tools: _containers.RepeatedCompositeFieldContainer[ToolSpec]
    def __init__(self, namespace: _Optional[str] = ..., tools: _Optional[_Iterable[_Union[ToolSpec, _Mapping]]] = ...) -> None: ...

class ToolInvocationResult(_message.Message):
    __slots__ = ("invocation_id", "ok", "result_json", "error")
    INVOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    invocation_id: str
    ok: bool
    result_json: str
    error: str
    def __init__(self, invocation_id: _Optional[str] = ..., ok: _Optional[bool] = ..., result_json: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class ServeToolsRequest(_message.Message):
    __slots__ = ("register", "result")
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    register: RegisterTools
    result: ToolInvocationResult
    def __init__(self, register: _Optional[_Union[RegisterTools, _Mapping]] = ..., result: _Optional[_Union[ToolInvocationResult, _Mapping]] = ...) -> None: ...

class ToolsRegistered(_message.Message):
    __slots__ = ("namespace", "tool_names")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAMES_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    tool_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, namespace: _Optional[str] = ..., tool_names: _Optional[_Iterable[str]] = ...) -> None: ...

class ToolInvocation(_message.Message):
    __slots__ = ("invocation_id", "tool_name", "arguments_json", "session_key", "session_id", "request_id", "timeout_ms", "trace_context")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    INVOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    SESSION_KEY_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    invocation_id: str
    tool_name: str
    arguments_json: str
    session_key: str
    session_id: str
    request_id: str
    timeout_ms: int
    trace_context: _containers.ScalarMap[str, str]
    def __init__(self, invocation_id: _Optional[str] = ..., tool_name: _Optional[str] = ..., arguments_json: _Optional[str] = ..., session_key: _Optional[str] = ..., session_id: _Optional[str] = ..., request_id: _Optional[str] = ..., timeout_ms: _Optional[int] = ..., trace_context: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ServeToolsResponse(_message.Message):
    __slots__ = ("registered", "invocation")
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    INVOCATION_FIELD_NUMBER: _ClassVar[int]
    registered: ToolsRegistered
    invocation: ToolInvocation
    def __init__(self, registered: _Optional[_Union[ToolsRegistered, _Mapping]] = ..., invocation: _Optional[_Union[ToolInvocation, _Mapping]] = ...) -> None: ...

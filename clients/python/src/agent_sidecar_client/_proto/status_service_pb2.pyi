import datetime

from agent_sidecar_client._proto import prompt_service_pb2 as _prompt_service_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("version", "node_id", "started_at", "uptime_seconds", "serving", "workers", "turns_in_flight", "prompts_admitted", "queues", "store", "cluster")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    UPTIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SERVING_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    TURNS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_ADMITTED_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    version: str
    node_id: str
    started_at: _timestamp_pb2.Timestamp
    uptime_seconds: float
    serving: bool
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStatus]
    turns_in_flight: int
    prompts_admitted: int
    queues: _containers.RepeatedCompositeFieldContainer[QueueDepth]
    store: StoreStatus
    cluster: ClusterStatus
    def __init__(self, version: _Optional[str] = ..., node_id: _Optional[str] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., uptime_seconds: _Optional[float] = ..., serving: _Optional[bool] = ..., workers: _Optional[_Iterable[_Union[WorkerStatus, _Mapping]]] = ..., turns_in_flight: _Optional[int] = ..., prompts_admitted: _Optional[int] = ..., queues: _Optional[_Iterable[_Union[QueueDepth, _Mapping]]] = ..., store: _Optional[_Union[StoreStatus, _Mapping]] = ..., cluster: _Optional[_Union[ClusterStatus, _Mapping]] = ...) -> None: ...

class WorkerStatus(_message.Message):
    __slots__ = ("index", "pid", "alive", "rss_bytes", "turns_run", "turns_running", "restarts")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    TURNS_RUN_FIELD_NUMBER: _ClassVar[int]
    TURNS_RUNNING_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    index: int
    pid: int
    alive: bool
    rss_bytes: int
    turns_run: int
    turns_running: int
    restarts: int
    def __init__(self, index: _Optional[int] = ..., pid: _Optional[int] = ..., alive: _Optional[bool] = ..., rss_bytes: _Optional[int] = ..., turns_run: _Optional[int] = ..., turns_running: _Optional[int] = ..., restarts: _Optional[int] = ...) -> None: ...

class QueueDepth(_message.Message):
    __slots__ = ("delivery", "prompts")
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    delivery: _prompt_service_pb2.DeliveryMode
    prompts: int
    def __init__(self, delivery: _Optional[_Union[_prompt_service_pb2.DeliveryMode, str]] = ..., prompts: _Optional[int] = ...) -> None: ...

class StoreStatus(_message.Message):
    __slots__ = ("backend", "size_bytes", "fts_backlog", "writable", "writer_pid", "writer_rss_bytes", "writer_backlog", "last_commit_seconds", "commits", "writer_stalled_seconds", "stats_unavailable")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    FTS_BACKLOG_FIELD_NUMBER: _ClassVar[int]
    WRITABLE_FIELD_NUMBER: _ClassVar[int]
    WRITER_PID_FIELD_NUMBER: _ClassVar[int]
    WRITER_RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    WRITER_BACKLOG_FIELD_NUMBER: _ClassVar[int]
    LAST_COMMIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    COMMITS_FIELD_NUMBER: _ClassVar[int]
    WRITER_STALLED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STATS_UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    backend: str
    size_bytes: int
    fts_backlog: int
    writable: bool
    writer_pid: int
    writer_rss_bytes: int
    writer_backlog: int
    last_commit_seconds: float
    commits: int
    writer_stalled_seconds: float
    stats_unavailable: bool
    def __init__(self, backend: _Optional[str] = ..., size_bytes: _Optional[int] = ..., fts_backlog: _Optional[int] = ..., writable: _Optional[bool] = ..., writer_pid: _Optional[int] = ..., writer_rss_bytes: _Optional[int] = ..., writer_backlog: _Optional[int] = ..., last_commit_seconds: _Optional[float] = ..., commits: _Optional[int] = ..., writer_stalled_seconds: _Optional[float] = ..., stats_unavailable: _Optional[bool] = ...) -> None: ...

class ClusterStatus(_message.Message):
    __slots__ = ("lanes_held", "lanes_taken_over", "leases_lost", "fenced_writes")
    LANES_HELD_FIELD_NUMBER: _ClassVar[int]
    LANES_TAKEN_OVER_FIELD_NUMBER: _ClassVar[int]
    LEASES_LOST_FIELD_NUMBER: _ClassVar[int]
    FENCED_WRITES_FIELD_NUMBER: _ClassVar[int]
    lanes_held: int
    lanes_taken_over: int
    leases_lost: int
    fenced_writes: int
    def __init__(self, lanes_held: _Optional[int] = ..., lanes_taken_over: _Optional[int] = ..., leases_lost: _Optional[int] = ..., fenced_writes: _Optional[int] = ...) -> None: ...

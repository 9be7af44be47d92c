"""StatusService over gRPC: GetStatus, the snapshot ``agent-sidecar status``
shows. The snapshot is read by obs/status.py; runtime.py hands this service
the function that reads it, so api/ knows nothing of how."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ..delivery import MODE_NAMES
from ..v1 import status_service_pb2 as pb
from ..v1 import status_service_pb2_grpc as pb_grpc
from .rpc import unary


class StatusService(pb_grpc.StatusServiceServicer):
    def __init__(self, cfg, auth, snapshot: Callable[[], Awaitable[Any]]):
        self.cfg, self.auth, self.snapshot = cfg, auth, snapshot

    @unary
    async def GetStatus(self, request, context, principal):
        principal.require_admin()  # the Unix socket's principal is admin
        return to_proto(await self.snapshot())


def to_proto(s: Any) -> pb.GetStatusResponse:
    """An obs.status.StatusSnapshot as the response."""
    out = pb.GetStatusResponse(version=s.version, node_id=s.node_id, uptime_seconds=s.uptime_seconds,
                               serving=s.serving, turns_in_flight=s.turns_in_flight,
                               prompts_admitted=s.prompts_admitted)
    out.started_at.FromNanoseconds(int(s.started_at * 1e9))
    for w in s.workers:
        out.workers.add(index=w.index, pid=w.pid, alive=w.alive, rss_bytes=w.rss_bytes,
                        turns_run=w.turns_run, turns_running=w.turns_running, restarts=w.restarts)
    for mode in sorted(MODE_NAMES):
        out.queues.add(delivery=mode, prompts=s.queued.get(mode, 0))
    st = out.store
    st.backend = s.backend
    if s.store is not None:
        st.size_bytes, st.fts_backlog = s.store.size_bytes, s.store.fts_backlog
    st.stats_unavailable = s.store is None
    if s.writer is not None:
        st.writer_pid, st.writer_rss_bytes = s.writer.pid, s.writer.rss_bytes
        st.writer_backlog, st.last_commit_seconds = s.writer.backlog, s.writer.last_commit_seconds
        st.commits, st.writer_stalled_seconds = s.writer.commits, s.writer.stalled_seconds
    st.writable = s.store_writable
    c = s.cluster
    if c is not None:
        out.cluster.lanes_held, out.cluster.lanes_taken_over = c.lanes_held, c.lanes_taken_over
        out.cluster.leases_lost, out.cluster.fenced_writes = c.leases_lost, c.fenced_writes
    return out

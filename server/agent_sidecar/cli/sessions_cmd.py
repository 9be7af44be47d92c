"""``agent-sidecar sessions list|show KEY|delete KEY``: talk to a running sidecar."""

from __future__ import annotations

from datetime import UTC, datetime

from .connection import TargetError, call_metadata, failure, open_channel
from .report import error

_INT32_MAX = 2**31 - 1  # ListSessionsRequest.page_size is an int32
_MAX_PAGE = 1000  # the sidecar's largest page by default (limits.max_page_size); it caps a larger one


def _when(ts) -> str:
    if not ts.seconds:
        return "-"
    return datetime.fromtimestamp(ts.seconds, UTC).strftime("%Y-%m-%d %H:%M:%S")


def run(args) -> int:
    import grpc

    from ..v1 import session_service_pb2 as pb
    from ..v1 import session_service_pb2_grpc as pb_grpc

    try:
        channel = open_channel(args)
    except TargetError as e:
        error("sessions", e)
        return 2
    metadata = call_metadata(args)
    with channel:
        stub = pb_grpc.SessionServiceStub(channel)
        try:
            if args.action == "list":
                resp = stub.ListSessions(pb.ListSessionsRequest(
                    platform=args.platform, page_size=min(args.limit, _INT32_MAX)),  # the sidecar caps it lower
                    metadata=metadata, timeout=10)
                print(f"{'UPDATED (UTC)':19}  {'STATE':7}  {'TURNS':>5}  {'SESSION ID':24}  KEY")
                for s in resp.sessions:
                    state = "running" if s.state == 2 else ("suspended" if s.suspended else "idle")
                    print(f"{_when(s.updated_at):19}  {state:7}  {s.turn_count:>5}  "
                          f"{s.session_id:24}  {s.session_key}")
                if resp.next_page_token:
                    print(f"… more (showing {len(resp.sessions)})")
            elif args.action == "show":
                s = stub.GetSession(pb.GetSessionRequest(session_key=args.key),
                                    metadata=metadata, timeout=10).session
                print(s)
                _print_transcript(stub, pb, s.session_id, args.limit, metadata)
            elif args.action == "delete":
                r = stub.DeleteSession(pb.DeleteSessionRequest(session_key=args.key),
                                       metadata=metadata, timeout=30)
                print("deleted" if r.deleted else "not found")
                return 0 if r.deleted else 1
        except grpc.RpcError as e:
            error("sessions", failure(args, e))
            return 1
    return 0


def _print_transcript(stub, pb, session_id: str, limit: int, metadata) -> None:
    """Every message of the transcript, a page at a time (``limit`` > 0: the
    first ``limit``, then a line saying there are more)."""
    shown, token = 0, ""
    while True:
        want = min(limit - shown, _MAX_PAGE) if limit else 0  # 0: the sidecar's default page
        tr = stub.GetTranscript(pb.GetTranscriptRequest(session_id=session_id, page_size=want, page_token=token),
                                metadata=metadata, timeout=10)
        for m in tr.messages:
            print(f"[{m.seq}] {m.role}: {m.content}")
        shown += len(tr.messages)
        token = tr.next_page_token
        if not token:
            return
        if limit and shown >= limit:
            print(f"… more (showing the first {shown}; --limit 0 shows all)")
            return

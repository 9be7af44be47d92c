"""SessionService calls for tests: create and seed sessions, read a lane and
its transcript, expect an error. Plain functions over a stub (``sc.sessions()``)."""

from __future__ import annotations

from contextlib import contextmanager

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sidecar_proc import error_info

from agent_sidecar.v1 import common_pb2 as c
from agent_sidecar.v1 import session_service_pb2 as pb

from .ids import SESSION_ID_RE, source


def msg(role: str, content: str, **kw) -> c.Message:
    return c.Message(role=role, content=content, **kw)


def turns(*texts: str) -> list[c.Message]:
    """Alternate user/assistant messages: turns("u1", "a1", "u2", "a2")."""
    return [msg("user" if i % 2 == 0 else "assistant", t) for i, t in enumerate(texts)]


def create(stub, src=None, **kw):
    """GetOrCreateSession → (session, created)."""
    r = stub.GetOrCreateSession(pb.GetOrCreateSessionRequest(source=src or source(), **kw), timeout=10)
    return r.session, r.created


def seed(stub, src=None, messages=(), **kw):
    return stub.SeedSession(pb.SeedSessionRequest(
        source=src or source(), messages=list(messages), **kw), timeout=10).session


def get_session(stub, key: str):
    """GetSession's Session (its flags: suspended, resume_pending, state, turn_count…)."""
    return stub.GetSession(pb.GetSessionRequest(session_key=key), timeout=10).session


def held(stub, keys: list[str]) -> tuple[int, int]:
    """The completed turns and transcript messages of these sessions, over gRPC."""
    turns = messages = 0
    for key in keys:
        session = get_session(stub, key)
        turns += session.turn_count
        messages += len(transcript(stub, session.session_id))
    return turns, messages


def transcript(stub, session_id: str, include_rewound: bool = False, page_size: int = 0) -> list:
    """Every message of an incarnation through GetTranscript, following page tokens."""
    out, token = [], ""
    while True:
        r = stub.GetTranscript(pb.GetTranscriptRequest(
            session_id=session_id, include_rewound=include_rewound, page_size=page_size,
            page_token=token), timeout=10)
        out += list(r.messages)
        token = r.next_page_token
        if not token:
            return out


@contextmanager
def rpc_error(code: grpc.StatusCode, reason: str | None = None, field: str | None = None):
    """Expect a failed call with this code, ErrorInfo reason and (optionally) field."""
    with pytest.raises(grpc.RpcError) as ei:
        yield ei
    err = ei.value
    assert err.code() == code, f"{err.code()} {err.details()}"
    got_reason, got_field = error_info(err)
    if reason is not None:
        assert got_reason == reason, (got_reason, err.details())
    if field is not None:
        assert got_field == field, (got_field, err.details())


def assert_serving(sc) -> None:
    """The sidecar still answers: health SERVING and a real call succeeds."""
    ch = sc.channel()
    r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert r.status == health_pb2.HealthCheckResponse.SERVING
    s, created = create(sc.sessions())
    assert created and SESSION_ID_RE.match(s.session_id)

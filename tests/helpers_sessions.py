"""Small helpers shared by the gRPC-level session tests (test_sessions_*.py,
test_durability.py, test_bad_input.py, test_cli.py). Plain functions, no fixtures."""

from __future__ import annotations

import itertools
import os
import re
from contextlib import contextmanager

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agent_sidecar.v1 import common_pb2 as c
from agent_sidecar.v1 import session_service_pb2 as pb
from sidecar_proc import error_info

SESSION_ID_RE = re.compile(r"^\d{8}_\d{6}_[0-9a-f]{8}$")
_counter = itertools.count(1)


def uniq(prefix: str = "c") -> str:
    """A chat id no other test uses (tests share one sidecar per module)."""
    return f"{prefix}{os.getpid()}x{next(_counter)}"


def src(platform: str = "telegram", chat_id: str | None = None, **kw) -> c.SessionSource:
    return c.SessionSource(platform=platform, chat_id=uniq() if chat_id is None else chat_id, **kw)


def msg(role: str, content: str, **kw) -> c.Message:
    return c.Message(role=role, content=content, **kw)


def turns(*texts: str) -> list[c.Message]:
    """Alternate user/assistant messages: turns("u1", "a1", "u2", "a2")."""
    return [msg("user" if i % 2 == 0 else "assistant", t) for i, t in enumerate(texts)]


def create(stub, source=None, **kw):
    """GetOrCreateSession → (session, created)."""
    r = stub.GetOrCreateSession(pb.GetOrCreateSessionRequest(source=source or src(), **kw), timeout=10)
    return r.session, r.created


def seed(stub, source=None, messages=(), **kw):
    return stub.SeedSession(pb.SeedSessionRequest(
        source=source or src(), messages=list(messages), **kw), timeout=10).session


def transcript(stub, session_id: str, include_rewound: bool = False, page_size: int = 0):
    """Every message of an incarnation, following page tokens."""
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

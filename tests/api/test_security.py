"""Who may do what over TCP (docs/security.md, docs/semantics.md): bearer
tokens scoped to platforms, admin tokens, and what a caller without a token
can hold open. A real sidecar with several tokens, probed over gRPC."""

from __future__ import annotations

import grpc
import pytest
from helpers.ids import source as src
from helpers.sessions import rpc_error
from sidecar_proc import Sidecar

from agent_sidecar.v1 import session_service_pb2 as pb

DENIED = grpc.StatusCode.PERMISSION_DENIED
TOKENS = """
[[auth.tokens]]
token = "adm"
admin = true
[[auth.tokens]]
token = "tg"
platforms = ["telegram"]
[[auth.tokens]]
token = "tg-admin"
platforms = ["telegram"]
admin = true
"""


def bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    sc = Sidecar(tmp_path_factory.mktemp("security") / "data", config=TOKENS, tcp=True).start()
    yield sc
    sc.stop()


def _session(sc, platform: str):
    return sc.sessions(tcp=True).GetOrCreateSession(
        pb.GetOrCreateSessionRequest(source=src(platform)), timeout=10, metadata=bearer("adm")).session


def test_an_admin_token_deletes_a_session_of_a_platform_outside_its_own(sc):
    """docs/semantics.md: deleting another platform's session needs an admin
    credential; an admin token scoped to telegram has it. A plain telegram
    token has not."""
    tcp = sc.sessions(tcp=True)
    slack = _session(sc, "slack")
    delete = pb.DeleteSessionRequest(session_key=slack.session_key)
    with rpc_error(DENIED, "PERMISSION_DENIED"):
        tcp.DeleteSession(delete, timeout=10, metadata=bearer("tg"))
    assert tcp.DeleteSession(delete, timeout=10, metadata=bearer("tg-admin")).deleted
    with rpc_error(grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND"):
        tcp.GetSession(pb.GetSessionRequest(session_key=slack.session_key), timeout=10,
                       metadata=bearer("adm"))
    # Its own platform's sessions: any token for the platform, admin or not.
    mine = _session(sc, "telegram")
    assert tcp.DeleteSession(pb.DeleteSessionRequest(session_key=mine.session_key), timeout=10,
                             metadata=bearer("tg")).deleted

"""Who may do what over TCP (docs/security.md, docs/semantics.md): bearer
tokens scoped to platforms, admin tokens, and what a caller without a token
can hold open. A real sidecar with several tokens, probed over gRPC."""

from __future__ import annotations

import os
import resource
import signal
import socket
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from helpers.ids import source as src
from helpers.procs import worker_pid
from helpers.sessions import assert_serving, rpc_error
from helpers.store import writes_held
from helpers.streams import collect, prompt_req, run
from helpers.waiting import wait_until
from sidecar_proc import Sidecar, retry_delay

from agent_sidecar.api.auth import MAX_ANONYMOUS_STREAMS
from agent_sidecar.v1 import common_pb2 as c
from agent_sidecar.v1 import prompt_service_pb2 as ppb
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


# Every call that names a slack session, by key, id or source: what a
# telegram token sends, each refused PERMISSION_DENIED before it reads or
# changes anything (``s``: the slack Session).
FOREIGN = {
    "GetSession by key": lambda S, P, s: S.GetSession(pb.GetSessionRequest(session_key=s.session_key)),
    "GetSession by id": lambda S, P, s: S.GetSession(pb.GetSessionRequest(session_id=s.session_id)),
    "GetTranscript": lambda S, P, s: S.GetTranscript(pb.GetTranscriptRequest(session_id=s.session_id)),
    "AppendMessages": lambda S, P, s: S.AppendMessages(pb.AppendMessagesRequest(
        session_id=s.session_id, messages=[c.Message(role="user", content="x")])),
    "RewriteTranscript": lambda S, P, s: S.RewriteTranscript(pb.RewriteTranscriptRequest(session_id=s.session_id)),
    "RewindSession": lambda S, P, s: S.RewindSession(pb.RewindSessionRequest(session_id=s.session_id)),
    "SearchMessages": lambda S, P, s: S.SearchMessages(pb.SearchMessagesRequest(
        query="secret", session_key=s.session_key)),
    "ListSessions": lambda S, P, s: S.ListSessions(pb.ListSessionsRequest(platform="Slack")),
    "ResetSession": lambda S, P, s: S.ResetSession(pb.ResetSessionRequest(session_key=s.session_key)),
    "SuspendSession": lambda S, P, s: S.SuspendSession(pb.SuspendSessionRequest(session_key=s.session_key)),
    "MarkResumePending": lambda S, P, s: S.MarkResumePending(pb.MarkResumePendingRequest(
        session_key=s.session_key, reason="x")),
    "SeedSession by key": lambda S, P, s: S.SeedSession(pb.SeedSessionRequest(session_key=s.session_key)),
    "SeedSession by source": lambda S, P, s: S.SeedSession(pb.SeedSessionRequest(source=s.origin)),
    "UpdateUsage": lambda S, P, s: S.UpdateUsage(pb.UpdateUsageRequest(session_key=s.session_key)),
    "GetSessionContext": lambda S, P, s: S.GetSessionContext(pb.GetSessionContextRequest(source=s.origin)),
    "DeleteSession": lambda S, P, s: S.DeleteSession(pb.DeleteSessionRequest(session_key=s.session_key)),
    "Prompt by key": lambda S, P, s: list(P.Prompt(ppb.PromptRequest(
        request_id="foreign-prompt", session_key=s.session_key.replace(":slack:", ":Slack:", 1), text="x"))),
    "GetQueue": lambda S, P, s: P.GetQueue(ppb.GetQueueRequest(session_key=s.session_key)),
    "Cancel": lambda S, P, s: P.Cancel(ppb.CancelRequest(session_key=s.session_key)),
    "WatchActivity by key": lambda S, P, s: list(P.WatchActivity(ppb.WatchActivityRequest(
        session_key=s.session_key, after_cursor=1))),
    "WatchActivity by platform": lambda S, P, s: list(P.WatchActivity(ppb.WatchActivityRequest(
        platform="SLACK", after_cursor=1))),
}


@pytest.mark.parametrize("call", list(FOREIGN))
def test_a_platform_token_reaches_no_session_of_another_platform(sc, call):
    """Each call naming a slack session with a telegram token: PERMISSION_DENIED,
    and the session, its transcript and its turn's frames as they were."""
    adm = sc.sessions(tcp=True)
    slack = adm.SeedSession(pb.SeedSessionRequest(source=src("slack", user_id="u1"), messages=[
        c.Message(role="user", content="secret plan")]), timeout=10, metadata=bearer("adm")).session
    stub = _Bearer(sc.sessions(tcp=True), "tg"), _Bearer(sc.prompts(tcp=True), "tg")
    with rpc_error(DENIED, "PERMISSION_DENIED"):
        FOREIGN[call](*stub, slack)
    after = adm.GetSession(pb.GetSessionRequest(session_key=slack.session_key), timeout=10,
                           metadata=bearer("adm")).session
    assert (after.session_id, after.suspended, after.resume_pending, after.input_tokens) == \
        (slack.session_id, False, False, 0)
    kept = adm.GetTranscript(pb.GetTranscriptRequest(session_id=slack.session_id, include_rewound=True),
                             timeout=10, metadata=bearer("adm")).messages
    assert [(m.content, m.active) for m in kept] == [("secret plan", True)]


class _Bearer:
    """A stub whose every call carries the token (and a 10 s deadline)."""

    def __init__(self, stub, token: str):
        self._stub, self._token = stub, token

    def __getattr__(self, name):
        method = getattr(self._stub, name)
        return lambda request: method(request, timeout=10, metadata=bearer(self._token))


def _watch(channel, metadata=()):
    """A health Watch, open on the sidecar once its first answer is read."""
    call = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), metadata=metadata)
    assert next(call).status == health_pb2.HealthCheckResponse.SERVING
    return call


def _reflect(channel):
    req = reflection_pb2.ServerReflectionRequest(list_services="")
    return list(reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(iter([req]), timeout=10))


def _reopen(held: list, opening) -> None:
    """Waits until ``opening()`` opens a stream again (a stream just ended gave
    its place back), refused OVERLOADED until then; the stream joins ``held``."""
    def reopened():
        try:
            held.append(opening())
            return True
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
            return False
    wait_until(reopened, what="the cancelled stream's place to be free again")


def test_callers_without_a_token_hold_a_bounded_number_of_streams_open(sc):
    """Health and reflection need no token, so a caller without one could open
    their streams until the sidecar's memory ran out (some 15-20 KB each). Past
    MAX_ANONYMOUS_STREAMS open ones a new one is refused OVERLOADED; a caller
    with a token or on the Unix socket is never refused, and a stream that
    ends makes room again."""
    tcp = sc.channel(tcp=True)
    for _ in range(MAX_ANONYMOUS_STREAMS + 1):  # each ends, and gives its place back
        assert _reflect(tcp)
    held = [_watch(tcp) for _ in range(MAX_ANONYMOUS_STREAMS)]
    try:
        with rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "OVERLOADED"):
            _watch(tcp)
        with rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "OVERLOADED"):
            _reflect(tcp)
        with rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "OVERLOADED"):  # a wrong token is none
            _watch(tcp, bearer("wrong"))
        r = health_pb2_grpc.HealthStub(tcp).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert r.status == health_pb2.HealthCheckResponse.SERVING  # a unary check is no stream
        _watch(tcp, bearer("tg")).cancel()
        _watch(sc.channel()).cancel()
        assert _reflect(sc.channel())
        held.pop().cancel()
        _reopen(held, lambda: _watch(tcp))
    finally:
        for call in held:
            call.cancel()


def _health(sc):
    try:
        with grpc.insecure_channel(sc.target) as ch:
            return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1).status
    except grpc.RpcError:
        return None


def test_a_request_id_unknown_when_watched_shows_no_frames_of_another_platform(tmp_path):
    """WatchActivity(request_id) checked the request's platform once, before
    reading it; a request unknown then (no live turn, no ledger row) passed,
    and when another platform's prompt took that id before the frames were
    read, its whole turn went to the watcher. Made certain here: both calls
    wait for the startup restore (held by the store's write lock), the slack
    prompt first, so it is live when the telegram watch reads on. Now every
    frame a by-request watch sends is checked against the credential."""
    sc = Sidecar(tmp_path / "data", config=TOKENS, tcp=True).start()
    sc.stop()
    out: dict = {}
    with writes_held(sc):  # the restart's restore waits for it: prompts and watches wait for the restore
        threading.Thread(target=sc.start, daemon=True).start()
        wait_until(lambda: _health(sc) == health_pb2.HealthCheckResponse.NOT_SERVING, timeout=30,
                   what="the restarted sidecar's server, restoring")
        slack = ppb.PromptRequest(request_id="shared-id", text="slack only", source=src("slack"))
        watch = ppb.WatchActivityRequest(request_id="shared-id")
        calls = [threading.Thread(target=lambda: out.__setitem__("prompt", collect(
                     sc.prompts().Prompt(slack, timeout=30)))),
                 threading.Thread(target=lambda: out.__setitem__("watch", collect(
                     sc.prompts(tcp=True).WatchActivity(watch, timeout=30, metadata=bearer("tg")))))]
        for call in calls:  # in this order: the prompt waits for the restore first
            call.start()
            time.sleep(0.3)
    try:
        for call in calls:
            call.join(30)
        assert out["prompt"].kinds()[-1:] == ["completed"], out["prompt"].details
        assert out["watch"].kinds() == [], out["watch"].kinds()
        assert out["watch"].code == DENIED, (out["watch"].code, out["watch"].details)
    finally:
        sc.stop()


def test_connections_anyone_opens_on_a_tcp_port_leave_the_sidecar_files_of_its_own(tmp_path):
    """Every connection is an open file, and anyone who reaches a TCP port can
    open them, with no token. 800 idle connections to a sidecar allowed 700
    open files took them all: a client on the Unix socket could not connect,
    and a worker that crashed could not be respawned (the next turn hung). Now
    each listener keeps at most its share of the limit (api/server.py
    connection_cap) and closes the rest as it accepts them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))  # the flood's own files
    sc = Sidecar(tmp_path / "data", config=TOKENS, tcp=True, workers=1,
                 wrapper=["prlimit", "--nofile=700:700", "--"]).start()
    flood: list[socket.socket] = []
    try:
        for _ in range(800):
            flood.append(socket.create_connection(("127.0.0.1", sc.tcp_port), timeout=10))
        assert_serving(sc)  # a new client on the Unix socket: health, then a session created
        crashed = worker_pid(sc, 0)
        os.kill(crashed, signal.SIGKILL)
        wait_until(lambda: worker_pid(sc, 0) not in (None, crashed), timeout=30, what="a new worker")
        turn = run(sc.prompts(), prompt_req(), timeout=60)
        assert turn.end == "completed", (turn.code, turn.details)
    finally:
        for conn in flood:
            conn.close()
        sc.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _platform_watch(stub, metadata=()):
    """A WatchActivity of every telegram frame, open once its first frame is read."""
    call = stub.WatchActivity(ppb.WatchActivityRequest(platform="telegram", after_cursor=0),
                              metadata=metadata, timeout=60)
    assert next(call).HasField("frame")  # a keepalive at once, then the replay
    return call


def test_a_credential_holds_a_bounded_number_of_streams_open(tmp_path):
    """Each open stream holds memory in the sidecar. Past
    limits.max_streams_per_credential open streams of one credential, its next
    WatchActivity, Prompt or ServeTools is refused OVERLOADED with RetryInfo,
    writing nothing, while another token and the Unix socket open theirs; a
    stream that ends makes room again."""
    limit = 3
    sc = Sidecar(tmp_path / "data", config=TOKENS + f"\n[sidecar.limits]\nmax_streams_per_credential = {limit}\n",
                 tcp=True).start()
    held: list = []
    try:
        tcp, tg = sc.prompts(tcp=True), bearer("tg")
        held += [_platform_watch(tcp, tg) for _ in range(limit)]
        refused = prompt_req(source=src("telegram"))
        for opening in (lambda: _platform_watch(tcp, tg),
                        lambda: next(tcp.Prompt(refused, metadata=tg, timeout=30)),
                        lambda: next(sc.tools(tcp=True).ServeTools(iter(()), metadata=tg, timeout=30))):
            with rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "OVERLOADED") as err:
                opening()
            assert "max_streams_per_credential" in err.value.details()
            assert retry_delay(err.value) is not None
        listed = sc.sessions().ListSessions(pb.ListSessionsRequest(platform="telegram"), timeout=10).sessions
        assert not [s for s in listed if s.session_key.endswith(refused.source.chat_id)]  # the refusal wrote none
        _platform_watch(tcp, bearer("adm")).cancel()  # another credential
        _platform_watch(sc.prompts()).cancel()  # the Unix socket
        held.pop().cancel()
        _reopen(held, lambda: _platform_watch(tcp, tg))
    finally:
        for call in held:
            call.cancel()
        sc.stop()

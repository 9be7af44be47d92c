"""Key building through the real sidecar: every row of key_cases.KEY_CASES via
GetOrCreateSession, under the config flags the row names (seed 001 §4, §5)."""

from __future__ import annotations

import grpc
import pytest
from helpers.key_cases import KEY_CASES, WHATSAPP_ALIASES
from helpers.sessions import create, rpc_error
from helpers.streams import run
from sidecar_proc import Sidecar

from agent_sidecar.v1 import common_pb2 as c
from agent_sidecar.v1 import session_service_pb2 as pb

PROFILES = '[profiles.support]\nmodel = "echo"\n'


def _flags_id(flags: dict) -> tuple[bool, bool]:
    return flags["group_sessions_per_user"], flags["thread_sessions_per_user"]


@pytest.fixture(scope="module")
def sidecars(tmp_path_factory):
    """One sidecar per flag combination, started on first use."""
    started: dict[tuple[bool, bool], Sidecar] = {}

    def get(flags: dict) -> Sidecar:
        fid = _flags_id(flags)
        if fid not in started:
            g, t = fid
            cfg = (f"group_sessions_per_user = {str(g).lower()}\n"
                   f"thread_sessions_per_user = {str(t).lower()}\n" + PROFILES)
            d = tmp_path_factory.mktemp(f"keys_{int(g)}{int(t)}") / "data"
            started[fid] = Sidecar(d, config=cfg).start()
        return started[fid]

    yield get
    for sc in started.values():
        sc.stop()


@pytest.mark.parametrize("case", KEY_CASES, ids=[k["id"] for k in KEY_CASES])
def test_key_case(sidecars, case):
    sc = sidecars(case["flags"])
    stub = sc.sessions()
    source = c.SessionSource(**case["source"])
    profile = "" if case["profile"] == "main" else case["profile"]
    s, _ = create(stub, source, profile=profile)
    assert s.session_key == case["key"]
    assert s.profile == case["profile"]
    assert s.platform == case["source"]["platform"]
    # The same lane is found again by key, and the context agrees on sharing.
    got = stub.GetSession(pb.GetSessionRequest(session_key=case["key"]), timeout=10).session
    assert got.session_id == s.session_id
    ctx = stub.GetSessionContext(pb.GetSessionContextRequest(source=source, profile=profile),
                                 timeout=10)
    assert ctx.shared_multi_user is case["shared"]


def test_whatsapp_aliases_one_key_one_session(sidecars):
    stub = sidecars({"group_sessions_per_user": True, "thread_sessions_per_user": False}).sessions()
    dm_ids, dm_keys, grp_ids, grp_keys = set(), set(), set(), set()
    for alias in WHATSAPP_ALIASES:
        for source in (c.SessionSource(platform="whatsapp", chat_type="dm", chat_id=alias),
                       c.SessionSource(platform="whatsapp", chat_type="dm", user_id=alias)):
            s, _ = create(stub, source)
            dm_ids.add(s.session_id)
            dm_keys.add(s.session_key)
        s, _ = create(stub, c.SessionSource(platform="whatsapp", chat_type="group",
                                            chat_id="120363099999999999@g.us", user_id=alias))
        grp_ids.add(s.session_id)
        grp_keys.add(s.session_key)
    assert dm_keys == {"agent:main:whatsapp:dm:+15551234567"}
    assert len(dm_ids) == 1
    assert grp_keys == {"agent:main:whatsapp:group:120363099999999999:+15551234567"}
    assert len(grp_ids) == 1


def test_profiles_separate_lanes(sidecars):
    stub = sidecars({"group_sessions_per_user": True, "thread_sessions_per_user": False}).sessions()
    source = c.SessionSource(platform="telegram", chat_type="dm", chat_id="profiles-1")
    main, _ = create(stub, source)
    main_again, _ = create(stub, source, profile="main")
    support, created = create(stub, source, profile="support")
    assert main.session_key == "agent:main:telegram:dm:profiles-1"
    assert main_again.session_id == main.session_id
    assert support.session_key == "agent:support:telegram:dm:profiles-1"
    assert created and support.session_id != main.session_id


@pytest.mark.parametrize("profile", ["other", "Main", "sup port", "a:b"])
def test_unknown_profile_invalid(sidecars, profile):
    stub = sidecars({"group_sessions_per_user": True, "thread_sessions_per_user": False}).sessions()
    source = c.SessionSource(platform="telegram", chat_id="p1")
    with rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "profile"):
        create(stub, source, profile=profile)
    with rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "profile"):
        stub.SeedSession(pb.SeedSessionRequest(source=source, profile=profile), timeout=10)
    with rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "profile"):
        stub.GetSessionContext(pb.GetSessionContextRequest(source=source, profile=profile),
                               timeout=10)


def test_flags_change_the_key(sidecars):
    """The same group message lands in different lanes depending on the flags."""
    source = c.SessionSource(platform="telegram", chat_type="group", chat_id="-42", user_id="u7")
    per_user, _ = create(sidecars({"group_sessions_per_user": True,
                                   "thread_sessions_per_user": False}).sessions(), source)
    shared, _ = create(sidecars({"group_sessions_per_user": False,
                                 "thread_sessions_per_user": False}).sessions(), source)
    assert per_user.session_key == "agent:main:telegram:group:-42:u7"
    assert shared.session_key == "agent:main:telegram:group:-42"


def _ids(n: int) -> c.SessionSource:
    """A group thread source with every id (and the platform) n characters long."""
    return c.SessionSource(platform="p" * n, chat_type="group", chat_id="c" * n,
                           thread_id="t" * n, user_id="u" * n)


def test_a_source_whose_key_no_call_could_name_is_invalid_argument(sidecars):
    """A key built from a source is at most what a session_key field takes
    (4 x max_id_length = 1024): before, a group thread with per-user lanes and
    every id at its cap made a key of 1044 characters; the session was
    created, and then GetSession, ResetSession, DeleteSession and Prompt by
    that key were all refused as too long."""
    sc = sidecars({"group_sessions_per_user": True, "thread_sessions_per_user": True})
    stub, prompts = sc.sessions(), sc.prompts()
    for source in (_ids(256), _ids(252)):
        with rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "source"):
            create(stub, source)
        with rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "source"):
            stub.SeedSession(pb.SeedSessionRequest(source=source), timeout=10)
        with rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "source"):
            stub.GetSessionContext(pb.GetSessionContextRequest(source=source), timeout=10)
        prompt = run(prompts, src=source, text="hi")
        assert (prompt.code, prompt.field, prompt.frames) == (grpc.StatusCode.INVALID_ARGUMENT, "source", [])
        listed = stub.ListSessions(pb.ListSessionsRequest(platform=source.platform), timeout=10)
        assert not listed.sessions
    # 20 characters of layout and four parts of 251: exactly the cap, and found again by key
    s, created = create(stub, _ids(251))
    assert created and len(s.session_key) == 1024
    assert stub.GetSession(pb.GetSessionRequest(session_key=s.session_key), timeout=10).session == s

"""Request ids belong to the session they were used with (issue 14, item 6):
a Prompt naming a known request id is a twin (it replays the original turn)
only for the same session key; for another session it is INVALID_ARGUMENT on
``request_id`` and never a replay of, or a peek at, someone else's turn, over
the Unix socket and over TCP with platform-scoped tokens. DeleteSession and
ClearAllSessions forget the ids of what they delete: a reuse runs a new turn."""

from __future__ import annotations

import grpc
import pytest
from helpers.config import slow_echo
from helpers.ids import uniq, words
from helpers.streams import start, watch
from sidecar_proc import Sidecar, error_info

from agent_sidecar.api.session_service import CLEAR_ALL_CONFIRM
from agent_sidecar.v1 import common_pb2 as c
from agent_sidecar.v1 import prompt_service_pb2 as ppb
from agent_sidecar.v1 import session_service_pb2 as spb

TOKENS = ('[[auth.tokens]]\ntoken = "adm"\nadmin = true\n'
          '[[auth.tokens]]\ntoken = "tg"\nplatforms = ["telegram"]\n'
          '[[auth.tokens]]\ntoken = "dc"\nplatforms = ["discord"]\n\n')
CONFIG = TOKENS + slow_echo("main", latency_ms=0) + slow_echo("slow", latency_ms=100)
ADMIN, TG, DC = ([("authorization", f"Bearer {t}")] for t in ("adm", "tg", "dc"))


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    s = Sidecar(tmp_path_factory.mktemp("rids") / "data", config=CONFIG, tcp=True, workers=2).start()
    yield s
    s.stop()


def tg():
    return c.SessionSource(platform="telegram", chat_id=uniq("tg"), user_name="Ada")


def dc():
    return c.SessionSource(platform="discord", chat_id=uniq("dc"))


def prompt(stub, rid: str, src, text: str, metadata=None) -> list:
    """The frames of one Prompt call, or the RpcError it ended with."""
    req = ppb.PromptRequest(request_id=rid, text=text, source=src)
    try:
        return [r.frame for r in stub.Prompt(req, timeout=20, metadata=metadata)]
    except grpc.RpcError as e:
        return e


def assert_reused(err, *secrets: str) -> None:
    assert isinstance(err, grpc.RpcError), f"expected a refusal, got frames {err}"
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.code(), err.details())
    assert error_info(err) == ("INVALID_ARGUMENT", "request_id"), error_info(err)
    assert "another session" in err.details()
    for s in secrets:
        assert s not in err.details(), f"the refusal reveals {s!r}"


def test_a_request_id_of_another_platforms_session_is_refused_not_replayed(sc):
    """Over the Unix socket: discord reusing telegram's finished request id is INVALID_ARGUMENT,
    sees nothing of the telegram turn, creates nothing, and leaves that turn alone."""
    prompts, rid, src = sc.prompts(), uniq("r"), tg()
    original = prompt(prompts, rid, src, "telegram secret")
    assert original[-1].WhichOneof("event") == "completed"
    other = dc()
    assert_reused(prompt(prompts, rid, other, "discord text"), original[0].session_key, src.chat_id,
                  "telegram secret")
    with pytest.raises(grpc.RpcError) as e:
        sc.sessions().GetSession(spb.GetSessionRequest(
            session_key=original[0].session_key.replace("telegram", "discord").replace(src.chat_id, other.chat_id)),
            timeout=10)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    again = watch(prompts, request_id=rid)
    assert [(f.seq, f.cursor) for f in again.frames] == [(f.seq, f.cursor) for f in original]
    fresh = prompt(prompts, uniq("r"), other, "discord text")
    assert fresh[-1].completed.final_text == "discord text"


def test_a_request_id_of_a_running_turn_is_refused_for_another_session(sc):
    """While telegram's turn runs, discord's Prompt with its request id is INVALID_ARGUMENT;
    the running turn completes once, as its own."""
    prompts = sc.prompts()
    first = start(prompts, text=words(10), src=tg(), profile="slow")
    first.wait_for("started")
    assert_reused(prompt(prompts, first.request_id, dc(), "hijack"), first.key)
    assert first.result(15).end == "completed" and first.final_text == words(10)


def test_over_tcp_a_platform_token_gets_invalid_argument_not_permission_denied(sc):
    """With two platform-scoped tokens over TCP, discord's reuse of telegram's id is
    INVALID_ARGUMENT (it names the caller's own mistake), and discord's prompt runs with a new id."""
    tcp, rid = sc.prompts(tcp=True), uniq("r")
    original = prompt(tcp, rid, tg(), "from telegram", TG)
    assert original[-1].WhichOneof("event") == "completed"
    assert_reused(prompt(tcp, rid, dc(), "from discord", DC), original[0].session_key)
    ok = prompt(tcp, uniq("r"), dc(), "from discord", DC)
    assert ok[-1].completed.final_text == "from discord"


def test_a_twin_for_the_same_session_replays_by_source_or_by_key(sc):
    """The same request id for the same session is still a twin: by source or by its key."""
    prompts, rid, src = sc.prompts(), uniq("r"), tg()
    original = prompt(prompts, rid, src, "once")
    again = prompt(prompts, rid, src, "once")
    req = ppb.PromptRequest(request_id=rid, text="once", session_key=original[0].session_key)
    by_key = [r.frame for r in prompts.Prompt(req, timeout=20)]
    assert [f.cursor for f in again] == [f.cursor for f in by_key] == [f.cursor for f in original]


def test_a_request_id_stays_its_sessions_across_a_restart(tmp_path):
    """The ledger keeps which session a request id belongs to: after a restart discord's reuse
    is still refused and telegram's is still a replay."""
    s = Sidecar(tmp_path / "data", config=CONFIG, workers=1).start()
    try:
        rid, src = uniq("r"), tg()
        original = prompt(s.prompts(), rid, src, "before the restart")
        s.stop()
        s.restart()
        assert_reused(prompt(s.prompts(), rid, dc(), "after"), original[0].session_key)
        assert [f.cursor for f in prompt(s.prompts(), rid, src, "x")] == [f.cursor for f in original]
    finally:
        s.stop()


def test_a_request_id_of_a_deleted_session_runs_a_new_turn(sc):
    """After DeleteSession the ids of its turns are forgotten, as its ledger rows are: the same
    request id runs a new turn in a new session (it was REQUEST_NOT_FOUND)."""
    prompts, rid, src = sc.prompts(), uniq("r"), tg()
    first = prompt(prompts, rid, src, "first life")
    key = first[0].session_key
    assert sc.sessions().DeleteSession(spb.DeleteSessionRequest(session_key=key), timeout=10).deleted
    second = prompt(prompts, rid, src, "second life")
    assert not isinstance(second, grpc.RpcError), (second.code(), second.details())
    assert second[-1].completed.final_text == "second life"
    assert second[0].session_id != first[0].session_id and second[0].session_key == key
    other = prompt(prompts, uniq("r"), dc(), "x")  # and for another session, once deleted, too
    sc.sessions().DeleteSession(spb.DeleteSessionRequest(session_key=other[0].session_key), timeout=10)
    assert prompt(prompts, other[0].request_id, tg(), "reused")[-1].completed.final_text == "reused"


def test_request_ids_after_clear_all_run_new_turns(tmp_path):
    """ClearAllSessions forgets every request id."""
    s = Sidecar(tmp_path / "data", config=CONFIG, tcp=True, workers=1).start()
    try:
        rid, src = uniq("r"), tg()
        first = prompt(s.prompts(), rid, src, "before")
        s.sessions(tcp=True).ClearAllSessions(spb.ClearAllSessionsRequest(confirm=CLEAR_ALL_CONFIRM),
                                              timeout=10, metadata=ADMIN)
        after = prompt(s.prompts(), rid, src, "after")
        assert not isinstance(after, grpc.RpcError), (after.code(), after.details())
        assert after[-1].completed.final_text == "after" and after[0].session_id != first[0].session_id
    finally:
        s.stop()

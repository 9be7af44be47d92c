"""Tool calls and their results stay together (sessions/transcripts.py
``check_answers``): SeedSession, AppendMessages and RewriteTranscript refuse
a "tool" message that answers no open call of the assistant message before
it (INVALID_ARGUMENT naming ``messages[i].tool_call_id``), and any other
message while that assistant message's calls are unanswered (naming
``messages[i]``), a running turn's call waiting on its tool host included.
Taken, either poisoned the session: an OpenAI-compatible backend refuses
every later turn's transcript ("messages with role 'tool' must be a response
to a preceding message with 'tool_calls'"; "an assistant message with
'tool_calls' must be followed by tool messages responding to each
'tool_call_id'"). A call appended earlier is answerable by a later append."""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from helpers.config import echo, scripted
from helpers.ids import source
from helpers.sessions import msg, rpc_error, seed, transcript
from helpers.streams import PromptRun
from helpers.tools import ToolHost
from sidecar_proc import Sidecar

from agent_sidecar.v1 import session_service_pb2 as pb

BAD = grpc.StatusCode.INVALID_ARGUMENT
CALLS = ('[{"id": "c1", "type": "function", "function": {"name": "t.x", "arguments": "{}"}},'
         ' {"id": "c2", "type": "function", "function": {"name": "t.x", "arguments": "{}"}}]')


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    cfg = echo("main") + scripted("tools", [{"tool_calls": [{"name": "test.wait", "id": "w1"}]},
                                            {"text": "done"}], tools=["test.*"])
    s = Sidecar(tmp_path_factory.mktemp("answers") / "data", config=cfg).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def stub(sc):
    return sc.sessions()


def _calling(stub):
    """A session whose transcript ends with an assistant message calling c1 and c2."""
    return seed(stub, messages=[msg("user", "do it"), msg("assistant", "", tool_calls_json=CALLS)])


def _append(stub, session_id: str, *messages):
    return stub.AppendMessages(pb.AppendMessagesRequest(session_id=session_id, messages=messages),
                               timeout=10)


def test_seed_refuses_a_tool_message_without_its_call(stub):
    src = source()
    with rpc_error(BAD, "INVALID_ARGUMENT", "messages[1].tool_call_id"):
        seed(stub, src, messages=[msg("user", "hi"), msg("tool", "{}", tool_call_id="nope")])
    with rpc_error(BAD, "INVALID_ARGUMENT", "messages[1].tool_call_id"):
        seed(stub, src, messages=[msg("user", "hi"), msg("tool", "{}")])
    with rpc_error(BAD, "INVALID_ARGUMENT", "messages[4].tool_call_id"):  # a call not of the last assistant
        seed(stub, src, messages=[msg("assistant", "", tool_calls_json=CALLS), msg("tool", "1", tool_call_id="c1"),
                                  msg("tool", "2", tool_call_id="c2"), msg("user", "and?"),
                                  msg("tool", "2", tool_call_id="c2")])


def test_append_answers_calls_of_the_transcript_once_each(stub):
    s = _calling(stub)
    _append(stub, s.session_id, msg("tool", "1", tool_call_id="c1"))
    with rpc_error(BAD, "INVALID_ARGUMENT", "messages[0].tool_call_id"):
        _append(stub, s.session_id, msg("tool", "again", tool_call_id="c1"))
    _append(stub, s.session_id, msg("tool", "2", tool_call_id="c2"), msg("assistant", "done"))
    with rpc_error(BAD, "INVALID_ARGUMENT", "messages[0].tool_call_id"):  # after a reply: no call open
        _append(stub, s.session_id, msg("tool", "late", tool_call_id="c2"))
    with rpc_error(BAD, "INVALID_ARGUMENT", "messages[0].tool_call_id"):
        stub.SeedSession(pb.SeedSessionRequest(session_key=s.session_key, messages=[
            msg("tool", "x", tool_call_id="c9")]), timeout=10)
    got = transcript(stub, s.session_id)
    assert [(m.role, m.tool_call_id) for m in got] == [
        ("user", ""), ("assistant", ""), ("tool", "c1"), ("tool", "c2"), ("assistant", "")]


def test_concurrent_answers_to_one_call_take_one(stub):
    s = _calling(stub)

    def answer(n: int) -> bool:
        try:
            _append(stub, s.session_id, msg("tool", str(n), tool_call_id="c1"))
            return True
        except grpc.RpcError as e:
            assert e.code() == BAD, e.details()
            return False
    with ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(answer, range(16))) == 1
    assert [m.tool_call_id for m in transcript(stub, s.session_id)].count("c1") == 1


def test_rewrite_refuses_a_tool_message_without_its_call_and_keeps_the_transcript(stub):
    s = _calling(stub)
    with rpc_error(BAD, "INVALID_ARGUMENT", "messages[1].tool_call_id"):
        stub.RewriteTranscript(pb.RewriteTranscriptRequest(session_id=s.session_id, messages=[
            msg("user", "u"), msg("tool", "x", tool_call_id="c1")]), timeout=10)
    assert len(transcript(stub, s.session_id)) == 2
    stub.RewriteTranscript(pb.RewriteTranscriptRequest(session_id=s.session_id, messages=[
        msg("user", "u"), msg("assistant", "", tool_calls_json=CALLS),
        msg("tool", "1", tool_call_id="c1")]), timeout=10)
    _append(stub, s.session_id, msg("tool", "2", tool_call_id="c2"))
    assert [m.tool_call_id for m in transcript(stub, s.session_id)] == ["", "", "c1", "c2"]


def test_no_other_message_comes_before_the_results_of_open_calls(stub):
    with rpc_error(BAD, "INVALID_ARGUMENT", "messages[2]"):
        seed(stub, messages=[msg("user", "do it"), msg("assistant", "", tool_calls_json=CALLS),
                             msg("user", "well?")])
    s = _calling(stub)
    with rpc_error(BAD, "INVALID_ARGUMENT", "messages[1]"):  # c2 is still open
        _append(stub, s.session_id, msg("tool", "1", tool_call_id="c1"), msg("user", "well?"))
    with rpc_error(BAD, "INVALID_ARGUMENT", "messages[0]"):
        _append(stub, s.session_id, msg("user", "well?"))
    _append(stub, s.session_id, msg("tool", "1", tool_call_id="c1"), msg("tool", "2", tool_call_id="c2"),
            msg("user", "well?"))
    assert [m.role for m in transcript(stub, s.session_id)] == ["user", "assistant", "tool", "tool", "user"]


def test_an_append_during_a_turns_tool_call_is_refused_not_wedged_in(sc, stub):
    """A turn's call waits on its tool host; an adapter's note appended then
    went between the call and its result."""
    with turn_on_its_call(sc) as turn:
        with rpc_error(BAD, "INVALID_ARGUMENT", "messages[0]"):
            _append(stub, turn.session_id, msg("user", "a note from the adapter"))
    _append(stub, turn.session_id, msg("user", "a note from the adapter"))
    assert [(m.role, m.tool_call_id) for m in transcript(stub, turn.session_id)] == [
        ("user", ""), ("assistant", ""), ("tool", "w1"), ("assistant", ""), ("user", "")]


def test_an_answer_to_a_running_turns_call_is_refused_its_host_answers_it(sc, stub):
    """A turn's call waits on its tool host; an adapter's tool message
    answering it was taken, then the turn wrote its host's result: the call
    answered twice."""
    with turn_on_its_call(sc) as turn:
        with rpc_error(BAD, "INVALID_ARGUMENT", "messages[0].tool_call_id"):
            _append(stub, turn.session_id, msg("tool", "mine", tool_call_id="w1"))
    assert [(m.role, m.tool_call_id, m.content) for m in transcript(stub, turn.session_id)][2:] == [
        ("tool", "w1", '{"ok": 1}'), ("assistant", "", "done")]


@contextlib.contextmanager
def turn_on_its_call(sc):
    """A "tools" turn waiting on its call w1, which the test's tool host
    holds until the block ends; then the host answers and the turn completes."""
    release = threading.Event()
    host = ToolHost(sc.tools(), "test", [("test.wait", "waits", {"type": "object"})],
                    handler=lambda inv: (release.wait(30), (True, '{"ok": 1}', ""))[1])
    host.wait_registered()
    try:
        turn = PromptRun(sc.prompts(), text="go", src=source(), profile="tools")
        turn.wait_for("tool_call")
        assert host.on_invocation.wait(10)
        yield turn
        release.set()
        assert turn.result(30).end == "completed", turn.kinds()
    finally:
        host.cancel()

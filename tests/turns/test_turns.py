"""Agent turns through PromptService against a real sidecar subprocess (issue 3):
an echo turn end to end, a scripted multi-step turn with a tool host in this
process, max iterations, timeouts (profile and client deadline), Cancel, and
bad input."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading

import grpc
import pytest
from helpers.config import echo, scripted, table
from helpers.ids import uniq
from helpers.procs import worker_pid
from helpers.sessions import get_session, transcript
from helpers.streams import (
    assert_failed,
    assert_well_formed,
    body_of,
    collect,
    kind_of,
    prompt_req,
    run,
    start,
    watch,
)
from helpers.tools import AB_SCHEMA, ToolHost, answers
from sidecar_proc import Sidecar

from agent_sidecar.v1 import common_pb2 as c
from agent_sidecar.v1 import prompt_service_pb2 as ppb

ADD = {"name": "test.add", "arguments": {"a": 2, "b": 3}}
PROFILES = (
    echo("main")
    + echo("slow", 200)
    + scripted("tool", [{"tool_calls": [ADD]}, {"text_from_last_tool_result": True}],
               tools=["test.*"])
    + scripted("loop", [{"tool_calls": [{"name": "test.add", "arguments": {"a": 1, "b": 1}}],
                         "repeat": True}], tools=["test.*"], max_iterations=3)
    + scripted("sleepy", [{"sleep_ms": 5000, "text": "too late"}], timeout_s=1)
    + scripted("sleeper", [{"sleep_ms": 5000, "text": "too late"}])
    + scripted("waits", [{"tool_calls": [{"name": "hang.wait", "arguments": {}}]}, {"text": "done"}],
               tools=["hang.*"], timeout_s=1)
)


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    s = Sidecar(tmp_path_factory.mktemp("turns") / "data", config=PROFILES, workers=2).start()
    yield s
    s.stop()


def test_echo_turn_end_to_end(sc):
    text = "hello there brave new world"
    out = run(sc.prompts(), prompt_req(text=text))
    assert_well_formed(out)
    kinds = out.kinds()
    assert kinds[:2] == ["accepted", "started"]
    assert out.frames[0].accepted.queue_position == 0
    assert kinds.count("text_delta") >= 2 and kinds.count("usage") >= 1
    # the deltas come before the usage and the terminal frame
    assert max(i for i, k in enumerate(kinds) if k == "text_delta") < kinds.index("usage")
    assert out.text() == text
    assert out.last.completed.final_text == text
    assert out.code == grpc.StatusCode.OK
    key, sid = out.frames[0].session_key, out.frames[0].session_id
    assert sid and all(f.session_id == sid and f.session_key == key for f in out.frames)
    cursors = [f.cursor for f in out.frames]
    assert all(b > a for a, b in zip(cursors, cursors[1:])), cursors

    msgs = transcript(sc.sessions(), sid)
    assert [(m.role, m.content) for m in msgs] == [("user", text), ("assistant", text)]
    assert all(m.active for m in msgs)

    s = get_session(sc.sessions(), key)
    assert s.session_id == sid
    assert s.turn_count == 1
    assert s.state == c.SESSION_STATE_IDLE
    tin, tout = out.usage()
    assert tin > 0 and tout > 0
    assert (s.input_tokens, s.output_tokens) == (tin, tout)

    # a second turn on the same session counts too and sees the history
    out2 = run(sc.prompts(), prompt_req(text="again", session_key=key))
    assert_well_formed(out2)
    assert get_session(sc.sessions(), key).turn_count == 2
    assert [m.role for m in transcript(sc.sessions(), sid)] == ["user", "assistant"] * 2


def test_attachments_are_recorded_not_shown_to_the_model(sc):
    """docs/api.md Attachment: the turn runs on the text; the model (echo: it
    answers with what it was given) and the transcript see no attachment."""
    req = prompt_req(text="look at this")
    req.attachments.add(name="cat.png", mime_type="image/png", data=b"\x89PNG")
    req.attachments.add(name="doc.pdf", url="https://example.com/doc.pdf")
    out = run(sc.prompts(), req)
    assert out.last.completed.final_text == "look at this"
    msgs = transcript(sc.sessions(), out.frames[0].session_id)
    assert [(m.role, m.content) for m in msgs] == [("user", "look at this"), ("assistant", "look at this")]


def test_scripted_multi_step_turn_with_a_tool(sc, host):
    req = prompt_req(text="what is 2 + 3?", profile="tool")
    out = run(sc.prompts(), req)
    assert_well_formed(out)
    kinds = out.kinds()
    call = out.frames[kinds.index("tool_call")].tool_call
    result = out.frames[kinds.index("tool_result")].tool_result
    assert kinds.index("tool_call") < kinds.index("tool_result") < kinds.index("completed")
    assert call.name == "test.add" and json.loads(call.arguments_json) == {"a": 2, "b": 3}
    assert result.call_id == call.call_id and result.ok and json.loads(result.result_json) == 5
    assert out.last.completed.final_text == "5"
    assert kinds.count("usage") == 2  # two model calls

    inv = [i for i in host.invocations if i.request_id == req.request_id]
    assert len(inv) == 1 and inv[0].tool_name == "test.add"
    assert inv[0].session_key == out.frames[0].session_key
    assert json.loads(inv[0].arguments_json) == {"a": 2, "b": 3}

    msgs = transcript(sc.sessions(), out.frames[0].session_id)
    assert [m.role for m in msgs] == ["user", "assistant", "tool", "assistant"]
    calls = json.loads(msgs[1].tool_calls_json)
    assert calls[0]["function"]["name"] == "test.add"
    assert calls[0]["id"] == call.call_id
    assert msgs[2].tool_call_id == call.call_id and json.loads(msgs[2].content) == 5
    assert msgs[3].content == "5"
    s = get_session(sc.sessions(), out.frames[0].session_key)
    assert s.turn_count == 1
    assert (s.input_tokens, s.output_tokens) == out.usage()


def test_max_iterations(sc, host):
    req = prompt_req(text="loop forever", profile="loop")
    out = run(sc.prompts(), req)
    assert_failed(out, "MAX_ITERATIONS", grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert out.count("tool_call") == 3 and out.count("tool_result") == 3
    assert out.count("usage") == 3  # three model calls, no fourth
    assert len([i for i in host.invocations if i.request_id == req.request_id]) == 3
    s = get_session(sc.sessions(), out.frames[0].session_key)
    assert s.turn_count == 0 and s.state == c.SESSION_STATE_IDLE
    assert (s.input_tokens, s.output_tokens) == out.usage()  # a failed turn's usage counts too


def test_timeout_from_the_profile(sc):
    out = run(sc.prompts(), prompt_req(text="slow", profile="sleepy"))
    assert_failed(out, "AGENT_TIMEOUT", grpc.StatusCode.DEADLINE_EXCEEDED)
    assert out.count("text_delta") == 0
    s = get_session(sc.sessions(), out.frames[0].session_key)
    assert s.turn_count == 0 and s.state == c.SESSION_STATE_IDLE


def test_timeout_from_the_client_deadline(sc):
    req = prompt_req(text="slow", profile="sleeper")
    out = collect(sc.prompts().Prompt(req, timeout=1))
    assert out.code == grpc.StatusCode.DEADLINE_EXCEEDED, (out.code, out.details)
    # the turn's own timeout was the call's deadline: it ended long before the 5 s sleep
    w = watch(sc.prompts(), request_id=req.request_id, timeout=10)
    assert_failed(w, "AGENT_TIMEOUT", grpc.StatusCode.DEADLINE_EXCEEDED)
    assert w.count("text_delta") == 0  # it ended during the sleep, not after it


def test_cancel_mid_turn_and_on_an_idle_session(sc):
    stub = sc.prompts()
    words = " ".join(f"w{i}" for i in range(20))
    answers = []

    def on_frame(f):
        if kind_of(f) == "started" and not answers:
            assert get_session(sc.sessions(), f.session_key).state == c.SESSION_STATE_RUNNING
            answers.append(stub.Cancel(ppb.CancelRequest(session_key=f.session_key), timeout=10))
        return False

    out = collect(stub.Prompt(prompt_req(text=words, profile="slow"), timeout=30), stop=on_frame)
    assert answers and answers[0].cancelled is True
    assert_failed(out, "CANCELLED", grpc.StatusCode.CANCELLED)
    assert out.count("text_delta") < 20
    key = out.frames[0].session_key
    s = get_session(sc.sessions(), key)
    assert s.state == c.SESSION_STATE_IDLE and s.turn_count == 0
    # nothing runs now
    assert stub.Cancel(ppb.CancelRequest(session_key=key), timeout=10).cancelled is False
    # and the session takes a new turn
    assert_well_formed(run(stub, prompt_req(text="after", session_key=key)))


def test_cancel_of_a_turn_whose_worker_is_stopped_ends_it_cancelled_and_replaces_the_worker(tmp_path):
    """A worker that cannot answer (SIGSTOP) never ends a cancelled turn: the
    turn waited for its whole timeout and then ended WORKER_CRASHED. Now the
    watchdog replaces the worker ``agent.cancel_grace_s`` after the cancel (1 s
    here), and the turn ends as the cancel said."""
    config = echo("main", 200, timeout_s=600) + table("agent", cancel_grace_s=1)
    with Sidecar(tmp_path / "data", config=config, workers=1) as one:
        stub = one.prompts()
        running = start(stub, prompt_req(text=" ".join(f"w{i}" for i in range(100))))
        running.wait_for("text_delta")
        stopped = worker_pid(one, 0)
        os.kill(stopped, signal.SIGSTOP)
        try:
            assert stub.Cancel(ppb.CancelRequest(request_id=running.request_id), timeout=10).cancelled
            out = running.result(60)  # the turn's own timeout is 600 s
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGCONT)
        assert_failed(out, "CANCELLED", grpc.StatusCode.CANCELLED)
        assert worker_pid(one, 0) != stopped
        assert_well_formed(run(stub, prompt_req(text="after", session_key=out.frames[0].session_key)))


def test_cancel_by_request_id(sc):
    stub = sc.prompts()
    req = prompt_req(text="a b c d e f g h", profile="slow")
    started, box = threading.Event(), {}

    def on_frame(f):
        if kind_of(f) == "started":
            started.set()
        return False

    th = threading.Thread(target=lambda: box.setdefault(
        "out", collect(stub.Prompt(req, timeout=30), stop=on_frame)))
    th.start()
    assert started.wait(10)
    assert stub.Cancel(ppb.CancelRequest(request_id=req.request_id), timeout=10).cancelled
    th.join(10)
    assert_failed(box["out"], "CANCELLED", grpc.StatusCode.CANCELLED)
    assert stub.Cancel(ppb.CancelRequest(request_id=req.request_id), timeout=10).cancelled is False


@pytest.mark.parametrize("how", ["cancel", "timeout"])
def test_turn_ended_during_a_tool_call_leaves_a_valid_transcript(sc, how):
    """Every tool call in the transcript gets a result, even when the turn is
    cancelled or times out while the tool host is still working: the next
    model call must not see an assistant tool_calls message without results."""
    release = threading.Event()
    with ToolHost(sc.tools(), "hang", [("hang.wait", "hang.wait", AB_SCHEMA)],
                  answers({"hang.wait": lambda a: release.wait(10) and "late"})):
        stub = sc.prompts()

        def on_frame(f):
            if how == "cancel" and kind_of(f) == "tool_call":
                assert stub.Cancel(ppb.CancelRequest(request_id=f.request_id), timeout=10).cancelled
            return False
        out = collect(stub.Prompt(prompt_req(text="wait", profile="waits"), timeout=30), stop=on_frame)
        release.set()
    if how == "cancel":
        assert_failed(out, "CANCELLED", grpc.StatusCode.CANCELLED)
    else:
        assert_failed(out, "AGENT_TIMEOUT", grpc.StatusCode.DEADLINE_EXCEEDED)
    call_id = out.frames[out.kinds().index("tool_call")].tool_call.call_id
    msgs = transcript(sc.sessions(), out.frames[0].session_id)
    assert [m.role for m in msgs[:2]] == ["user", "assistant"]
    assert json.loads(msgs[1].tool_calls_json)[0]["id"] == call_id
    results = [m for m in msgs if m.role == "tool" and m.tool_call_id == call_id]
    assert len(results) == 1, [(m.role, m.tool_call_id, m.content) for m in msgs]


def test_gateway_timeout_bounds_a_turn(tmp_path):
    cfg = table("agent", gateway_timeout=1) + scripted("main", [{"sleep_ms": 5000, "text": "late"}])
    with Sidecar(tmp_path / "data", config=cfg, workers=1) as s:
        out = run(s.prompts(), prompt_req(text="slow"))
        assert_failed(out, "AGENT_TIMEOUT", grpc.StatusCode.DEADLINE_EXCEEDED)
        assert out.count("text_delta") == 0  # "late" never came


BAD = [
    ("request_id", dict(request_id="")),
    ("source", dict(session_key="agent:main:telegram:dm:x1")),
    ("profile", dict(profile="no_such_profile")),
    ("text", dict(text="x" * (256 * 1024 + 1))),
]


@pytest.mark.parametrize("field,kw", BAD, ids=[b[0] for b in BAD])
def test_bad_prompt_is_invalid_argument(sc, field, kw):
    kw = dict(kw)
    source = c.SessionSource(platform="telegram", chat_id=uniq("bad"))
    req = prompt_req(source=source, **kw)  # with session_key: both given
    out = run(sc.prompts(), req)
    assert out.code == grpc.StatusCode.INVALID_ARGUMENT, (out.code, out.details)
    assert out.reason == "INVALID_ARGUMENT" and out.field == field, (out.reason, out.field)
    assert out.frames == []  # nothing was accepted
    # the sidecar keeps serving
    ok = run(sc.prompts(), prompt_req(text="still here"))
    assert_well_formed(ok)
    assert body_of(ok.last) == {"final_text": "still here"}


@pytest.mark.parametrize("profile", ["no_such_profile", "slow"])
def test_a_profile_other_than_the_keys_is_invalid_argument(sc, profile):
    """With session_key the turn runs under the key's profile: a profile given
    as well that is unknown, or another one, is refused naming ``profile``
    (it used to be dropped without a word, the turn run under "main")."""
    key = run(sc.prompts(), prompt_req(text="first")).key  # a lane of "main"
    out = run(sc.prompts(), prompt_req(session_key=key, profile=profile, text="second"))
    assert out.code == grpc.StatusCode.INVALID_ARGUMENT, (out.code, out.details)
    assert (out.reason, out.field) == ("INVALID_ARGUMENT", "profile")
    assert out.frames == []
    assert [m.content for m in transcript(sc.sessions(), get_session(sc.sessions(), key).session_id)
            if m.role == "user"] == ["first"]
    ok = run(sc.prompts(), prompt_req(session_key=key, profile="main", text="third"))  # its own: fine
    assert body_of(ok.last) == {"final_text": "third"}


def test_a_prompt_by_source_keeps_a_renamed_chats_name_as_get_or_create_does(sc):
    """A Prompt by source gets the session as GetOrCreateSession does: the
    lane's display_name follows the chat's name (it used to keep the first one)."""
    chat_id = uniq("room")
    first = run(sc.prompts(), prompt_req(source=c.SessionSource(
        platform="telegram", chat_type="group", chat_id=chat_id, chat_name="Old Name")))
    assert get_session(sc.sessions(), first.key).display_name == "Old Name"
    run(sc.prompts(), prompt_req(source=c.SessionSource(
        platform="telegram", chat_type="group", chat_id=chat_id, chat_name="New Name")))
    assert get_session(sc.sessions(), first.key).display_name == "New Name"
    run(sc.prompts(), prompt_req(source=c.SessionSource(  # no name given: the last one stays
        platform="telegram", chat_type="group", chat_id=chat_id)))
    assert get_session(sc.sessions(), first.key).display_name == "New Name"


def test_in_a_shared_thread_each_user_message_names_its_sender(sc):
    """The session context of a shared thread tells the model "messages are
    prefixed with [sender name]" (seed 001 §5): the sidecar does prefix them
    (it used to send the bare text, the model told of prefixes it never got).
    A session of one user gets the text as sent."""
    thread = dict(platform="telegram", chat_type="group", chat_id=uniq("g"), thread_id="7")
    alice = run(sc.prompts(), prompt_req(text="hello there", source=c.SessionSource(
        user_id="u1", user_name="Alice", **thread)))
    bob = run(sc.prompts(), prompt_req(text="me too", source=c.SessionSource(user_id="u2", **thread)))
    assert alice.key == bob.key
    users = [m.content for m in transcript(sc.sessions(), alice.session_id) if m.role == "user"]
    assert users == ["[Alice] hello there", "[u2] me too"]
    alone = run(sc.prompts(), prompt_req(text="just me", source=c.SessionSource(
        platform="telegram", chat_type="group", chat_id=uniq("g"), user_id="u3", user_name="Carol")))
    assert [m.content for m in transcript(sc.sessions(), alone.session_id)][0] == "just me"


def test_prompt_for_an_unknown_session_key_is_not_found(sc):
    rid, key = uniq("r"), f"agent:main:telegram:dm:{uniq('ghost')}"
    out = run(sc.prompts(), prompt_req(request_id=rid, session_key=key))
    assert out.frames == []
    assert out.code == grpc.StatusCode.NOT_FOUND and out.reason == "SESSION_NOT_FOUND", (out.code, out.reason)
    # the refused prompt did not use up its request id: a retry that names a source runs
    ok = run(sc.prompts(), prompt_req(request_id=rid, text="now"))
    assert_well_formed(ok)
    assert ok.last.completed.final_text == "now"

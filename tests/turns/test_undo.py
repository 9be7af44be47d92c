"""Taking back what a user sent while the session is busy (issue 14 item 15,
README "RewindSession during a turn"), through a real sidecar: RewindSession
counts the lane's waiting prompts as the newest user turns (each dropped ends
superseded), then the running turn (cancelled as ROLLBACK: CANCELLED, nothing
it wrote stays), then the transcript; RewriteTranscript cancels the running
turn and keeps the waiting prompts. A transcript never holds a reply without
its user message. The busy turn is a slow echo (100 ms a word)."""

from __future__ import annotations

import threading
import time

import pytest
from helpers.config import scripted, slow_echo
from helpers.ids import source, words
from helpers.sessions import transcript
from helpers.store import writes_held
from helpers.streams import D, PromptRun, get_queue, kind_of, start, watch
from helpers.tools import ToolHost
from helpers.waiting import wait_until
from sidecar_proc import Sidecar

from agent_sidecar.v1 import common_pb2 as c
from agent_sidecar.v1 import session_service_pb2 as spb

QUEUE = D.DELIVERY_MODE_QUEUE
CONFIG = slow_echo("main", 100) + scripted(
    "tools", [{"tool_calls": [{"name": "test.wait", "id": "w1"}]}, {"text_from_last_tool_result": True}],
    tools=["test.*"])


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    s = Sidecar(tmp_path_factory.mktemp("undo") / "data", config=CONFIG, workers=2).start()
    yield s
    s.stop()


@pytest.fixture
def stubs(sc):
    return sc.prompts(), sc.sessions()


def said(sessions, sid: str) -> list[tuple[str, str]]:
    """The live transcript as (role, content)."""
    return [(m.role, m.content) for m in transcript(sessions, sid)]


def no_orphan_reply(msgs: list[tuple[str, str]]) -> bool:
    """Every reply follows its own user message: with the echo model (no tools)
    the live transcript is user, assistant, user, assistant, ..."""
    return [role for role, _ in msgs] == ["user", "assistant"] * (len(msgs) // 2)


def hello(prompts):
    """A session whose transcript is [user hello, assistant hello]."""
    first = start(prompts, text="hello", src=source()).result(10)
    assert first.end == "completed"
    return first


def rewind(sessions, sid: str, n: int = 1):
    return sessions.RewindSession(spb.RewindSessionRequest(session_id=sid, n=n), timeout=10)


def test_undo_during_the_running_turn_cancels_it_and_leaves_no_reply(stubs):
    """/queue one on an idle lane runs at once; /undo while it streams takes it
    back: the turn ends failed CANCELLED and neither its message nor its reply
    stays (today the rewind hid `one` and the turn still wrote its reply)."""
    prompts, sessions = stubs
    first = hello(prompts)
    one = start(prompts, text=words(30, "one"), key=first.key, delivery=QUEUE)
    one.wait_for("text_delta")
    r = rewind(sessions, first.session_id)
    one.result(10)
    assert one.end == "failed" and one.reason == "CANCELLED", one.kinds()
    assert (r.turns_undone, r.target_text) == (1, words(30, "one"))
    assert r.rewound_count >= 1  # its user message, and what it had written
    assert said(sessions, first.session_id) == [("user", "hello"), ("assistant", "hello")]
    again = start(prompts, text="again", key=first.key).result(10)
    assert again.final_text == "again"
    assert said(sessions, first.session_id)[2:] == [("user", "again"), ("assistant", "again")]


def test_undo_of_a_queued_prompt_drops_it_and_lets_the_running_turn_finish(stubs):
    prompts, sessions = stubs
    first = hello(prompts)
    busy = start(prompts, text=words(20, "busy"), key=first.key)
    busy.wait_for("started")
    one = start(prompts, text="one", key=first.key, delivery=QUEUE)
    r = rewind(sessions, first.session_id)
    one.result(10)
    assert one.kinds() == ["accepted", "superseded"] and one.error is None
    assert (r.turns_undone, r.target_text, r.rewound_count) == (1, "one", 0)
    q = get_queue(prompts, first.key)
    assert not q.HasField("pending") and list(q.queued) == []
    assert busy.result(10).end == "completed"
    assert said(sessions, first.session_id) == [
        ("user", "hello"), ("assistant", "hello"),
        ("user", words(20, "busy")), ("assistant", words(20, "busy"))]


def test_undo_takes_a_pending_burst_back_as_one_turn(stubs):
    """Two follow-ups while busy are one pending turn (the second absorbed the
    first): one /undo takes the burst back, and the running turn goes on."""
    prompts, sessions = stubs
    first = hello(prompts)
    busy = start(prompts, text=words(20, "busy"), key=first.key)
    busy.wait_for("started")
    a = start(prompts, text="a", key=first.key)
    b = start(prompts, text="b", key=first.key)
    r = rewind(sessions, first.session_id)
    assert a.result(10).kinds() == ["accepted", "superseded"]
    assert a.last.superseded.by_request_id == b.request_id
    assert b.result(10).kinds() == ["accepted", "superseded"] and b.last.superseded.by_request_id == ""
    assert (r.turns_undone, r.target_text) == (1, "a")
    assert busy.result(10).end == "completed"
    assert [c for _, c in said(sessions, first.session_id)] == ["hello", "hello"] + [words(20, "busy")] * 2


def test_undo_counts_waiting_prompts_then_the_running_turn_then_the_transcript(stubs):
    prompts, sessions = stubs
    first = hello(prompts)
    busy = start(prompts, text=words(30, "busy"), key=first.key)
    busy.wait_for("text_delta")
    queued = start(prompts, text="queued", key=first.key, delivery=QUEUE)
    follow = start(prompts, text="follow", key=first.key)
    r = rewind(sessions, first.session_id, n=4)
    for p in (queued, follow):
        assert p.result(10).kinds() == ["accepted", "superseded"]
    busy.result(10)
    assert busy.end == "failed" and busy.reason == "CANCELLED"
    assert (r.turns_undone, r.target_text) == (4, "hello")
    assert said(sessions, first.session_id) == []
    hidden = transcript(sessions, first.session_id, include_rewound=True)
    assert [m.content for m in hidden if m.role == "user"] == ["hello", words(30, "busy")]


def test_undo_while_the_turn_waits_on_a_tool_leaves_nothing_of_it(sc, stubs):
    """The running turn has written its tool call and waits on a tool host that
    never answers: /undo cancels it at once, and neither its messages nor the
    result the cancelled call gets afterwards stay live."""
    prompts, sessions = stubs
    host = ToolHost(sc.tools(), "test", [("test.wait", "never answers", {"type": "object"})])
    host.wait_registered()
    try:
        p = start(prompts, text="look it up", src=source(), profile="tools")
        p.wait_for("tool_call")
        assert host.on_invocation.wait(10)
        r = rewind(sessions, p.session_id)
        p.result(10)
        assert p.end == "failed" and p.reason == "CANCELLED", p.kinds()
        assert (r.turns_undone, r.target_text) == (1, "look it up")
        assert said(sessions, p.session_id) == []
        everything = transcript(sessions, p.session_id, include_rewound=True)
        assert [m.role for m in everything][:2] == ["user", "assistant"] and not any(m.active for m in everything)
    finally:
        host.cancel()


@pytest.mark.parametrize("attempt", range(4))
def test_queue_then_undo_at_once_never_leaves_an_orphan_reply(stubs, attempt):
    """The console adapter's `/queue one` and `/undo` sent together, without
    waiting for the acknowledgement: whichever the sidecar sees first, exactly one
    user turn is taken back and no reply stays without its user message."""
    prompts, sessions = stubs
    first = hello(prompts)
    one = PromptRun(prompts, text="one", key=first.key, delivery=QUEUE)
    r = rewind(sessions, first.session_id)
    one.result(10)
    msgs = said(sessions, first.session_id)
    assert no_orphan_reply(msgs), msgs
    assert r.turns_undone == 1
    if r.target_text == "hello":  # the undo came first and took back `hello`; `one` ran after
        assert one.end == "completed" and msgs == [("user", "one"), ("assistant", "one")]
    else:  # `one` was taken back: dropped before it ran, cancelled while it ran, or
        # (a loaded machine) already finished before the undo arrived
        assert one.end in ("superseded", "failed", "completed"), one.kinds()
        assert r.target_text == "one" and msgs == [("user", "hello"), ("assistant", "hello")]


def test_undo_of_a_prompt_whose_start_commits_ends_it_before_the_next_one_starts(sc, stubs):
    """RewindSession reaching a prompt whose accept (which also starts it, on
    the idle lane) has not committed: it ends superseded with nothing of it
    kept, and the prompt queued behind it starts only after that end. It used
    to leave the lane at once, so the next prompt's start committed before
    its end: two turns of one lane open at once in the store."""
    prompts, sessions = stubs
    first = hello(prompts)
    answer: list = []
    with writes_held(sc):  # no accept commits while the three calls arrive
        doomed = PromptRun(prompts, text="doomed", key=first.key)
        time.sleep(0.5)  # it reaches the lane before the rewind does
        undo = threading.Thread(target=lambda: answer.append(rewind(sessions, first.session_id)))
        undo.start()
        time.sleep(0.5)  # the rewind has dropped it before the next prompt arrives
        after = PromptRun(prompts, text="after", key=first.key, delivery=QUEUE)
        time.sleep(0.5)
    undo.join(10)
    assert answer and answer[0].target_text == "doomed", answer
    assert doomed.result(10).end == "superseded", doomed.kinds()
    assert after.result(10).final_text == "after"
    ends = watch(prompts, request_id=doomed.request_id).frames[-1]
    starts = next(f for f in watch(prompts, request_id=after.request_id).frames if kind_of(f) == "started")
    assert ends.cursor < starts.cursor, (ends, starts)
    assert said(sessions, first.session_id) == [("user", "hello"), ("assistant", "hello"),
                                                ("user", "after"), ("assistant", "after")]


def test_rewrite_during_a_turn_cancels_it_and_keeps_the_waiting_prompts(stubs):
    """RewriteTranscript replaces what the running turn answers: the turn ends
    CANCELLED and writes nothing more; a prompt waiting behind it was sent by the
    user and runs after, on the rewritten transcript."""
    prompts, sessions = stubs
    first = hello(prompts)
    busy = start(prompts, text=words(30, "busy"), key=first.key)
    busy.wait_for("text_delta")
    after = start(prompts, text="after", key=first.key, delivery=QUEUE)
    sessions.RewriteTranscript(spb.RewriteTranscriptRequest(session_id=first.session_id, messages=[
        c.Message(role="user", content="summary please"), c.Message(role="assistant", content="summary")]),
        timeout=10)
    busy.result(10)
    assert busy.end == "failed" and busy.reason == "CANCELLED"
    assert after.result(10).final_text == "after"
    assert said(sessions, first.session_id) == [
        ("user", "summary please"), ("assistant", "summary"), ("user", "after"), ("assistant", "after")]


def _starting_after_a_switch(sc, prompts, sessions, operation):
    """A prompt accepted in incarnation S2 whose start is on its way to the
    store after SwitchSession moved the lane back to S1 (so it begins in S1),
    and ``operation(S1)`` called while that start is held. Returns (S1, the
    prompt)."""
    first = hello(prompts)
    s1 = first.session_id
    sessions.ResetSession(spb.ResetSessionRequest(session_key=first.key), timeout=10)
    busy = start(prompts, text=words(10, "busy"), key=first.key)
    busy.wait_for("started")
    nxt = start(prompts, text="next", key=first.key)
    sessions.SwitchSession(spb.SwitchSessionRequest(session_key=first.key, target_session_id=s1), timeout=10)
    answer: list = []
    with writes_held(sc):  # the busy turn's end and the next one's start wait for the store
        wait_until(lambda: not get_queue(prompts, first.key).HasField("pending"), 10,
                   what="the next prompt to start")
        op = threading.Thread(target=lambda: answer.append(operation(s1)))
        op.start()
        time.sleep(0.5)  # it reaches the lane while the start is held
    op.join(10)
    assert answer, "the operation did not answer"
    assert busy.result(10).end == "completed"
    return s1, nxt


def test_rewrite_takes_back_a_turn_starting_in_the_incarnation_a_switch_moved_to(sc, stubs):
    """The turn's start follows the switch into S1, so RewriteTranscript(S1)
    must take it back: it ends CANCELLED and no reply lands in the rewritten
    transcript. It used to be compared by the incarnation it was accepted in
    (S2), ran on, and wrote a reply after the rewrite without its user message."""
    prompts, sessions = stubs
    s1, nxt = _starting_after_a_switch(sc, prompts, sessions, lambda sid: sessions.RewriteTranscript(
        spb.RewriteTranscriptRequest(session_id=sid, messages=[
            c.Message(role="user", content="summary please"), c.Message(role="assistant", content="summary")]),
        timeout=10))
    nxt.result(10)
    assert (nxt.end, nxt.reason) == ("failed", "CANCELLED"), nxt.kinds()
    assert nxt.last.session_id == s1
    assert said(sessions, s1) == [("user", "summary please"), ("assistant", "summary")]


def test_undo_takes_back_a_turn_starting_in_the_incarnation_a_switch_moved_to(sc, stubs):
    """RewindSession(S1, 1) during that start takes the turn back as the
    newest user turn; it used to take back its user message from the
    transcript and let it write its reply there."""
    prompts, sessions = stubs
    s1, nxt = _starting_after_a_switch(sc, prompts, sessions, lambda sid: rewind(sessions, sid))
    nxt.result(10)
    assert (nxt.end, nxt.reason) == ("failed", "CANCELLED"), nxt.kinds()
    assert said(sessions, s1) == [("user", "hello"), ("assistant", "hello")]


def test_rewrite_takes_back_a_prompt_whose_accept_starts_it(sc, stubs):
    """RewriteTranscript reaching a prompt whose accept (which also starts it,
    on the idle lane) has not committed: it ends CANCELLED and its reply never
    lands. It had no incarnation yet, so the rewrite passed it by; the accept
    wrote its user message, the rewrite replaced it, and the reply landed
    after the rewritten messages without it."""
    prompts, sessions = stubs
    first = hello(prompts)
    answer: list = []
    with writes_held(sc):  # the accept waits for the store while the rewrite arrives
        doomed = PromptRun(prompts, text="doomed", key=first.key)
        time.sleep(0.5)  # it reaches the lane before the rewrite does
        rewrite = threading.Thread(target=lambda: answer.append(sessions.RewriteTranscript(
            spb.RewriteTranscriptRequest(session_id=first.session_id, messages=[
                c.Message(role="user", content="summary please"), c.Message(role="assistant", content="summary")]),
            timeout=10)))
        rewrite.start()
        time.sleep(0.5)
    rewrite.join(10)
    assert answer, "RewriteTranscript did not answer"
    doomed.result(10)
    assert (doomed.end, doomed.reason) == ("failed", "CANCELLED"), doomed.kinds()
    assert said(sessions, first.session_id) == [("user", "summary please"), ("assistant", "summary")]

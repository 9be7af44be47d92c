"""Delivery modes on a busy session, through a real sidecar (issue 4, docs/semantics.md
"delivery"): REJECT_IF_BUSY, FOLLOW_UP burst collapse, QUEUE FIFO, INTERRUPT,
ROLLBACK, STEER; ResetSession / SuspendSession on a busy lane; the queue cap;
GetQueue. The busy turn is a slow echo (100 ms a word)."""

from __future__ import annotations

import os
import signal

import grpc
import pytest
from helpers.config import scripted, slow_echo, table
from helpers.ids import source, words
from helpers.logs import log_lines
from helpers.procs import worker_pid
from helpers.sessions import get_session, transcript
from helpers.streams import D, PromptRun, get_queue, start, watch
from helpers.waiting import wait_until
from sidecar_proc import Sidecar, retry_delay

from agent_sidecar.v1 import prompt_service_pb2 as ppb
from agent_sidecar.v1 import session_service_pb2 as spb

CONFIG = (slow_echo("main")
          + scripted("steer", [{"text": "first answer", "token_latency_ms": 500}, {"echo_input": True}])
          + scripted("steerslow", [{"text": "first answer", "token_latency_ms": 500},
                                   {"echo_input": True, "token_latency_ms": 1000}])
          + scripted("steerlong", [{"text": "a first answer that streams for a good while", "token_latency_ms": 500},
                                   {"echo_input": True}])
          + scripted("steerlast", [{"text": "first answer", "token_latency_ms": 500}, {"echo_input": True}],
                     max_iterations=1)
          + slow_echo("capped", queue_cap=2)
          + slow_echo("capone", queue_cap=1)
          # what the model received: every user message since its last answer
          + scripted("burst", [{"echo_input": True, "token_latency_ms": 100}])
          + scripted("burststeer", [{"echo_input": True, "token_latency_ms": 100}], max_iterations=1))


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    s = Sidecar(tmp_path_factory.mktemp("delivery") / "data", config=CONFIG, workers=2).start()
    yield s
    s.stop()


@pytest.fixture
def stubs(sc):
    return sc.prompts(), sc.sessions()


def busy(prompts, n_words: int = 20, profile: str = ""):
    """A session with a slow turn running (about n_words / 10 seconds)."""
    first = start(prompts, text=words(n_words, "busy"), src=source(), profile=profile)
    first.wait_for("started")
    return first


def placed(prompts, key: str, p: PromptRun) -> None:
    """Wait until the sidecar has placed ``p`` in its lane (listed in the
    lane's queue, or acknowledged): a prompt sent next then arrives after it.
    Two calls sent one after the other from two threads may arrive either way."""
    wait_until(lambda: p.frames or p.request_id in [q.request_id for q in get_queue(prompts, key).queued],
               timeout=15, what=f"{p.request_id} placed in its lane")


def test_reject_if_busy_is_agent_busy_with_retry_info(stubs):
    prompts, _ = stubs
    first = busy(prompts)
    rej = PromptRun(prompts, text="are you there", key=first.key, delivery=D.DELIVERY_MODE_REJECT_IF_BUSY)
    rej.result(10)
    assert rej.frames == [], rej.kinds()
    assert rej.error is not None and rej.error.code() == grpc.StatusCode.ABORTED
    assert rej.reason == "AGENT_BUSY"
    assert retry_delay(rej.error) is not None
    assert first.result().end == "completed"
    # idle again: REJECT_IF_BUSY simply runs
    ok = start(prompts, text="now", key=first.key, delivery=D.DELIVERY_MODE_REJECT_IF_BUSY).result()
    assert ok.end == "completed" and ok.final_text == "now"


def test_ten_follow_ups_collapse_to_the_last(stubs):
    prompts, sessions = stubs
    first = busy(prompts)
    fus = []
    for i in range(10):
        fus.append(start(prompts, text=f"follow {i}", key=first.key,
                       delivery=D.DELIVERY_MODE_FOLLOW_UP if i % 2 else 0))
        assert fus[-1].position == 1
    q = get_queue(prompts, first.key)
    assert q.pending.request_id == fus[-1].request_id and q.pending.text == "follow 9"
    assert list(q.queued) == []
    assert get_session(sessions, first.key).queue_depth == 1
    for i, fu in enumerate(fus[:-1]):
        fu.result(10)
        assert fu.end == "superseded", fu.kinds()
        assert fu.kinds() == ["accepted", "superseded"]
        assert fu.last.superseded.by_request_id == fus[i + 1].request_id
        assert fu.error is None
    assert first.result().end == "completed"
    last = fus[-1].result()
    assert last.end == "completed" and last.final_text == "follow 9"
    users = [m.content for m in transcript(sessions, first.session_id) if m.role == "user"]
    assert users == [words(20, "busy")] + [f"follow {i}" for i in range(10)], "nothing sent is dropped"


@pytest.mark.parametrize("mode", ["follow_up", "steer"])
def test_a_burst_of_three_is_one_turn_that_sees_all_three(sc, stubs, mode):
    """docs/semantics.md, FOLLOW_UP: a newer follow-up absorbs the pending one, which ends
    superseded by it; its text runs in the newer one's turn as its own user
    message, in the order sent. A STEER that falls back to FOLLOW_UP (here every
    call is the turn's last, max_iterations = 1) absorbs the same way."""
    prompts, sessions = stubs
    profile = "burst" if mode == "follow_up" else "burststeer"
    delivery = D.DELIVERY_MODE_FOLLOW_UP if mode == "follow_up" else D.DELIVERY_MODE_STEER
    first = busy(prompts, 20, profile=profile)
    first.wait_for("text_delta")  # its one model call is under way: a steer cannot join it
    burst = [start(prompts, text=f"part {i}", key=first.key, delivery=delivery) for i in range(3)]
    q = get_queue(prompts, first.key)  # the pending prompt is the newest; what it absorbed has ended
    assert q.pending.request_id == burst[-1].request_id and q.pending.text == "part 2"
    assert get_session(sessions, first.key).queue_depth == 1
    for older, newer in zip(burst, burst[1:]):
        older.result(10)
        assert older.kinds() == ["accepted", "superseded"] and older.error is None
        assert older.last.superseded.by_request_id == newer.request_id
    assert first.result(10).end == "completed"
    last = burst[-1].result(15)
    assert last.end == "completed", (last.kinds(), last.reason)
    assert last.final_text == "part 0\npart 1\npart 2", "the model saw all three, in order"
    msgs = [(m.role, m.content) for m in transcript(sessions, first.session_id)]
    assert msgs[2:] == [("user", "part 0"), ("user", "part 1"), ("user", "part 2"),
                        ("assistant", "part 0\npart 1\npart 2")], msgs
    after = start(prompts, text="and then", key=first.key, delivery=delivery).result(10)
    assert after.final_text == "and then"
    assert [m.content for m in transcript(sessions, first.session_id)][-2:] == ["and then"] * 2
    # the warm agent took all three messages in step with the store: never rebuilt (a
    # rebuild is invisible through the API by design: its log line is the oracle)
    assert [x for x in log_lines(sc, "agent rebuilt from store") if x.get("key") == first.key] == []


def test_twenty_queued_prompts_run_in_order(stubs):
    prompts, sessions = stubs
    first = busy(prompts, 25)
    queued = [start(prompts, text=f"q{i}", key=first.key, delivery=D.DELIVERY_MODE_QUEUE)
              for i in range(20)]
    assert [p.position for p in queued] == list(range(1, 21))
    q = get_queue(prompts, first.key)
    assert [x.request_id for x in q.queued] == [p.request_id for p in queued]
    assert all(x.delivery == D.DELIVERY_MODE_QUEUE for x in q.queued)
    assert not q.HasField("pending")
    assert first.result().end == "completed"
    ends = []
    for p in queued:
        p.result(30)
        assert p.end == "completed"
        assert p.final_text == f"q{queued.index(p)}"
        ends.append(p.last.at.ToNanoseconds())
    assert ends == sorted(ends)
    msgs = transcript(sessions, first.session_id)
    assert [m.content for m in msgs if m.role == "user"] == [words(25, "busy")] + [f"q{i}" for i in range(20)]
    assert [m.role for m in msgs] == ["user", "assistant"] * 21
    assert get_queue(prompts, first.key) == type(q)()


def test_a_queue_too_large_for_a_client_comes_with_its_longest_texts_cut(stubs):
    """30 queued prompts of 250 KB would be a 7.5 MB answer, past the 4 MiB a
    gRPC client reads by default: the long texts come cut to an equal share at a
    character boundary, marked, with their whole size; a short one stays whole.
    The running turn is long (~40 s, ended by the reset) so that none of the 30
    starts while they are sent, however slow the machine."""
    prompts, sessions = stubs
    first = busy(prompts, 400)
    long_text = "é" * 125_000  # 250,000 bytes: an odd share cuts inside a character
    queued = [start(prompts, text=long_text, key=first.key, delivery=D.DELIVERY_MODE_QUEUE)
              for _ in range(30)]
    fu = start(prompts, text="and a short one", key=first.key)
    q = get_queue(prompts, first.key)  # the test's client keeps gRPC's default receive limit
    assert q.ByteSize() < 3 * 1024 * 1024
    assert (q.pending.text, q.pending.text_truncated, q.pending.text_bytes) == ("and a short one", False, 15)
    assert [x.request_id for x in q.queued] == [p.request_id for p in queued]
    cut = {x.text for x in q.queued}
    assert len(cut) == 1 and all(x.text_truncated and x.text_bytes == 250_000 for x in q.queued)
    text = cut.pop()
    assert 50_000 < len(text) < 125_000 and long_text.startswith(text)
    sessions.ResetSession(spb.ResetSessionRequest(session_key=first.key), timeout=10)
    for p in queued + [fu]:
        assert p.result(10).end == "superseded"


def test_interrupt_cancels_and_keeps_what_it_wrote(stubs):
    prompts, sessions = stubs
    first = busy(prompts, 40)
    first.wait_for("text_delta")
    intr = start(prompts, text="stop that", key=first.key, delivery=D.DELIVERY_MODE_INTERRUPT)
    first.result(10)
    assert first.end == "failed" and first.last.failed.reason == "CANCELLED"
    assert first.error.code() == grpc.StatusCode.CANCELLED and first.reason == "CANCELLED"
    assert intr.result(10).end == "completed" and intr.final_text == "stop that"
    msgs = transcript(sessions, first.session_id)
    assert [m.content for m in msgs if m.role == "user"] == [words(40, "busy"), "stop that"]
    assert all(m.active for m in msgs)


def test_two_interrupts_sent_together_keep_both_texts(stubs):
    """Whichever of the two the sidecar saw start first, the first INTERRUPT's
    text reaches the transcript before the second's: it started and was
    cancelled (keeping its user message), or it had not started and the second
    took it over (superseded, its text run in the second's turn)."""
    prompts, sessions = stubs
    for _ in range(4):  # the race goes either way; every round must keep both
        first = busy(prompts, 40)
        first.wait_for("text_delta")
        a = PromptRun(prompts, text="interrupt A", key=first.key, delivery=D.DELIVERY_MODE_INTERRUPT)
        placed(prompts, first.key, a)
        b = PromptRun(prompts, text="interrupt B", key=first.key, delivery=D.DELIVERY_MODE_INTERRUPT)
        assert first.result(10).end == "failed" and first.reason == "CANCELLED"
        assert b.result(10).end == "completed", b.kinds()
        if a.result(10).end == "superseded":
            assert a.kinds() == ["accepted", "superseded"]
            assert a.last.superseded.by_request_id == b.request_id
        else:
            assert "started" in a.kinds() and a.reason == "CANCELLED", a.kinds()
        users = [m.content for m in transcript(sessions, first.session_id) if m.role == "user"]
        assert users == [words(40, "busy"), "interrupt A", "interrupt B"]


def test_a_rollback_replaces_the_rollback_waiting_ahead_of_it(stubs):
    """Two ROLLBACKs sent together leave only the second's turn, whichever way
    the race goes: the first started and was rolled back by the second, or it
    had not started and the second replaced it (it ends failed CANCELLED
    without running). Before, a first one still waiting behind the cancelled
    turn ran to completion and the second ran after it, keeping both."""
    prompts, sessions = stubs
    for _ in range(8):  # the race goes either way; every round must keep only the second
        first = busy(prompts, 40)
        first.wait_for("text_delta")
        a = PromptRun(prompts, text="rollback A", key=first.key, delivery=D.DELIVERY_MODE_ROLLBACK)
        placed(prompts, first.key, a)
        b = PromptRun(prompts, text="rollback B", key=first.key, delivery=D.DELIVERY_MODE_ROLLBACK)
        assert first.result(10).end == "failed" and first.reason == "CANCELLED"
        assert b.result(10).end == "completed", b.kinds()
        assert a.result(10).end == "failed" and a.reason == "CANCELLED", a.kinds()
        live = [(m.role, m.content) for m in transcript(sessions, first.session_id)]
        assert live == [("user", "rollback B"), ("assistant", "rollback B")], live


def test_rollback_hides_the_cancelled_turn(stubs):
    prompts, sessions = stubs
    first = busy(prompts, 40)
    first.wait_for("text_delta")
    rb = start(prompts, text="never mind", key=first.key, delivery=D.DELIVERY_MODE_ROLLBACK)
    first.result(10)
    assert first.end == "failed" and first.last.failed.reason == "CANCELLED"
    assert rb.result(10).end == "completed" and rb.final_text == "never mind"
    live = transcript(sessions, first.session_id)
    assert [(m.role, m.content) for m in live] == [("user", "never mind"), ("assistant", "never mind")]
    everything = transcript(sessions, first.session_id, include_rewound=True)
    hidden = [m for m in everything if not m.active]
    assert hidden and (hidden[0].role, hidden[0].content) == ("user", words(40, "busy"))
    assert all(m.role == "assistant" for m in hidden[1:])  # its partial output, if any was written
    assert max(m.seq for m in hidden) < min(m.seq for m in live)
    assert [m.seq for m in everything if m.active] == [m.seq for m in live]


def test_steer_reaches_the_next_model_call(stubs):
    prompts, sessions = stubs
    host = start(prompts, text="hello", src=source(), profile="steer")
    # Its first token proves the first model call is under way (the second
    # token is 500 ms off): the steer must wait for the next call. (After
    # only "started", the steer may reach the worker before the first call
    # begins, and rightly joins that one.)
    host.wait_for("text_delta")
    st = start(prompts, text="actually, bananas", key=host.key, delivery=D.DELIVERY_MODE_STEER)
    host.result(10)
    assert host.end == "completed", (host.kinds(), host.error)
    assert host.final_text == "actually, bananas"
    st.result(10)
    assert st.end == "completed" and st.final_text == "actually, bananas"
    # docs/api.md DELIVERY_MODE_STEER: the steered prompt never starts; its stream is
    # `accepted` (position 0) and then the host's terminal frame.
    assert st.kinds() == ["accepted", "completed"] and st.position == 0, st.kinds()
    msgs = transcript(sessions, host.session_id)
    assert [(m.role, m.content) for m in msgs] == [
        ("user", "hello"), ("assistant", "first answer"), ("user", "actually, bananas"),
        ("assistant", "actually, bananas")]


def test_cancelling_a_steer_stops_the_turn_that_took_its_text(stubs):
    """A joined steer's text is in the running turn already: Cancel by its
    request id stops that turn (both end failed CANCELLED). It used to end only
    the steer's own stream CANCELLED while the turn went on to answer it."""
    prompts, sessions = stubs
    host = start(prompts, text="hello", src=source(), profile="steerslow")
    host.wait_for("text_delta")
    st = start(prompts, text="actually, bananas", key=host.key, delivery=D.DELIVERY_MODE_STEER)
    assert st.position == 0
    assert prompts.Cancel(ppb.CancelRequest(request_id=st.request_id), timeout=10).cancelled
    assert host.result(20).end == "failed" and host.reason == "CANCELLED", host.kinds()
    assert st.result(10).kinds() == ["accepted", "failed"] and st.reason == "CANCELLED"
    assert "bananas" not in "".join(m.content for m in transcript(sessions, host.session_id)
                                    if m.role == "assistant")


def test_steer_during_the_last_allowed_model_call_becomes_a_follow_up(stubs):
    """docs/semantics.md: a turn past its last model call treats a steer as FOLLOW_UP. The
    host keeps its complete answer; the steer runs as the next turn."""
    prompts, sessions = stubs
    host = start(prompts, text="hello", src=source(), profile="steerlast")  # max_iterations = 1
    host.wait_for("text_delta")
    st = start(prompts, text="bananas", key=host.key, delivery=D.DELIVERY_MODE_STEER)
    host.result(10)
    assert host.end == "completed" and host.final_text == "first answer", (host.kinds(), host.reason)
    st.result(10)
    assert st.end == "completed", (st.kinds(), st.reason)
    assert "started" in st.kinds(), "it ran as a turn of its own"
    msgs = [(m.role, m.content) for m in transcript(sessions, host.session_id)]
    assert msgs[:3] == [("user", "hello"), ("assistant", "first answer"), ("user", "bananas")], msgs
    assert msgs[-1][0] == "assistant" and len(msgs) == 4, msgs


def test_a_steer_whose_caller_left_while_the_worker_took_it_in_is_not_taken_twice(tmp_path):
    """A STEER whose call ends (here its deadline) while the running turn's
    worker is taking its text in goes on without its caller: the retry a client
    sends with the same request id (it saw no frame) follows it. Before, the
    caller leaving dropped the prompt while the worker took the text anyway,
    and the retry steered it in a second time: the model read it twice."""
    with Sidecar(tmp_path / "data", config=CONFIG, workers=1) as one:
        prompts, sessions = one.prompts(), one.sessions()
        host = start(prompts, text="hello", src=source(), profile="steerlong")
        host.wait_for("text_delta")  # its first model call streams for 4 s, 500 ms a token
        stopped = worker_pid(one, 0)
        os.kill(stopped, signal.SIGSTOP)  # the steer waits for its answer
        try:
            left = PromptRun(prompts, text="steered text", key=host.key, delivery=D.DELIVERY_MODE_STEER,
                             timeout=1.5).result(15)
        finally:
            os.kill(stopped, signal.SIGCONT)  # within agent.steer_timeout_s: the worker takes it in
        assert left.frames == [] and left.code == grpc.StatusCode.DEADLINE_EXCEEDED, left.kinds()
        retry = PromptRun(prompts, text="steered text", key=host.key, delivery=D.DELIVERY_MODE_STEER,
                          request_id=left.request_id).result(30)
        assert host.result(30).end == "completed", host.kinds()
        assert retry.kinds() == ["accepted", "completed"], (retry.kinds(), retry.details)
        assert retry.final_text == host.final_text == "steered text"
        users = [m.content for m in transcript(sessions, host.session_id) if m.role == "user"]
        assert users == ["hello", "steered text"]


def test_a_steer_cancelled_while_it_waits_takes_no_pending_prompt_with_it(tmp_path):
    """A STEER cancelled while it waits for the running turn's worker (stopped
    here, so it falls back to FOLLOW_UP) is accepted and ends CANCELLED without
    running; the pending follow-up stays pending and runs. Before, the steer took
    the pending slot, absorbing that acknowledged prompt, and ended: the follow-up
    ended superseded by a turn that never ran, its text never seen."""
    config = CONFIG + table("agent", steer_timeout_s=2)
    with Sidecar(tmp_path / "data", config=config, workers=1) as one:
        prompts, sessions = one.prompts(), one.sessions()
        host = start(prompts, text="hello", src=source(), profile="steerlong")
        host.wait_for("text_delta")
        pending = start(prompts, text="pending follow-up", key=host.key)
        stopped = worker_pid(one, 0)
        os.kill(stopped, signal.SIGSTOP)
        try:
            st = PromptRun(prompts, text="steered text", key=host.key, delivery=D.DELIVERY_MODE_STEER)
            cancel = ppb.CancelRequest(request_id=st.request_id)
            wait_until(lambda: prompts.Cancel(cancel, timeout=10).cancelled, what="the steer cancelled as it waits")
            st.result(30)
        finally:
            os.kill(stopped, signal.SIGCONT)
        assert st.kinds() == ["accepted", "failed"] and st.reason == "CANCELLED", (st.kinds(), st.details)
        assert pending.result(30).end == "completed", pending.kinds()
        assert "started" in pending.kinds(), pending.kinds()
        assert host.result(30).end == "completed"
        users = [m.content for m in transcript(sessions, host.session_id) if m.role == "user"]
        assert users == ["hello", "pending follow-up"]


def test_steer_on_an_idle_session_is_a_normal_turn(stubs):
    prompts, _ = stubs
    p = start(prompts, text="hi there", src=source(), profile="steer", delivery=D.DELIVERY_MODE_STEER)
    assert p.position == 0
    p.result(10)
    assert p.kinds()[:2] == ["accepted", "started"]
    assert p.end == "completed" and p.final_text == "first answer"


def test_reset_drops_the_queue_and_cancels_the_running_turn(stubs):
    prompts, sessions = stubs
    first = busy(prompts, 40)
    queued = [start(prompts, text=f"q{i}", key=first.key, delivery=D.DELIVERY_MODE_QUEUE) for i in range(3)]
    fu = start(prompts, text="and also", key=first.key)
    assert len(get_queue(prompts, first.key).queued) == 3
    new = sessions.ResetSession(spb.ResetSessionRequest(session_key=first.key), timeout=10).session
    assert new.session_id != first.session_id
    first.result(10)
    assert first.end == "failed" and first.reason == "CANCELLED"
    for p in queued + [fu]:
        p.result(10)
        assert p.end == "superseded" and p.error is None, p.kinds()
    q = get_queue(prompts, first.key)
    assert not q.HasField("pending") and list(q.queued) == []
    after = start(prompts, text="fresh", key=first.key).result(10)
    assert after.end == "completed" and after.session_id == new.session_id


def test_suspend_cancels_the_running_turn(stubs):
    prompts, sessions = stubs
    first = busy(prompts, 40)
    fu = start(prompts, text="later", key=first.key)
    s = sessions.SuspendSession(spb.SuspendSessionRequest(session_key=first.key), timeout=10).session
    assert s.suspended
    first.result(10)
    assert first.end == "failed" and first.last.failed.reason == "CANCELLED"
    assert first.error.code() == grpc.StatusCode.CANCELLED
    fu.result(10)
    assert fu.end == "superseded"


def test_queue_cap_is_resource_exhausted(stubs):
    prompts, _ = stubs
    first = busy(prompts, 30, profile="capped")
    a = start(prompts, text="a", key=first.key, delivery=D.DELIVERY_MODE_QUEUE)
    b = start(prompts, text="b", key=first.key, delivery=D.DELIVERY_MODE_QUEUE)
    c = PromptRun(prompts, text="c", key=first.key, delivery=D.DELIVERY_MODE_QUEUE).result(10)
    assert c.frames == [] and c.error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert c.reason == "QUEUE_FULL"
    assert "profiles.capped.queue_cap" in c.error.details(), c.error.details()
    assert retry_delay(c.error) is not None
    q = get_queue(prompts, first.key)
    assert [x.text for x in q.queued] == ["a", "b"]
    for p in (first, a, b):
        assert p.result(15).end == "completed"


@pytest.mark.parametrize("mode", ["follow_up", "steer"])
def test_queue_cap_counts_only_what_deepens_the_queue(stubs, mode):
    prompts, _ = stubs
    # A steer must find the turn's first model call still streaming (else it
    # falls back to a follow-up): 3 s of it, the steer comes within
    # milliseconds; the turn ends once its second call has answered the steer.
    first = busy(prompts, 30, profile="capone")
    a = start(prompts, text="a", key=first.key)  # the pending slot: depth 1 = the cap
    delivery = D.DELIVERY_MODE_STEER if mode == "steer" else D.DELIVERY_MODE_FOLLOW_UP
    b = PromptRun(prompts, text="b", key=first.key, delivery=delivery)
    b.wait_for("accepted", 5)
    if mode == "follow_up":
        assert a.result(10).end == "superseded"
        assert b.result(15).final_text == "b"
    else:
        assert first.result(10).final_text == "b"  # the steer joined the running turn
        assert b.result(10).final_text == "b" and a.result(10).final_text == "a"


def test_lane_order_interrupt_then_follow_up_then_fifo(stubs):
    prompts, sessions = stubs
    first = busy(prompts, 40)
    q1 = start(prompts, text="queued one", key=first.key, delivery=D.DELIVERY_MODE_QUEUE)
    fu = start(prompts, text="follow up", key=first.key, delivery=D.DELIVERY_MODE_FOLLOW_UP)
    assert (q1.position, fu.position) == (1, 1)  # the follow-up slot runs before the FIFO
    q = get_queue(prompts, first.key)
    assert q.pending.request_id == fu.request_id and [x.request_id for x in q.queued] == [q1.request_id]
    assert get_session(sessions, first.key).queue_depth == 2
    intr = start(prompts, text="urgent", key=first.key, delivery=D.DELIVERY_MODE_INTERRUPT)
    assert intr.position == 1
    assert first.result(10).end == "failed"
    for p in (intr, fu, q1):
        assert p.result(15).end == "completed", p.kinds()
    users = [m.content for m in transcript(sessions, first.session_id) if m.role == "user"]
    assert users == [words(40, "busy"), "urgent", "follow up", "queued one"]


def test_get_queue_lists_interrupts_waiting_on_their_cancel_first_in_queued(tmp_path):
    """An INTERRUPT waits in the lane only until the turn it cancelled ends
    (here: its worker is stopped) and runs before the pending follow-up;
    GetQueue lists it at the head of ``queued`` and its position says so."""
    with Sidecar(tmp_path / "data", config=slow_echo("main"), workers=1) as one:
        prompts, sessions = one.prompts(), one.sessions()
        first = busy(prompts, 40)
        q1 = start(prompts, text="queued one", key=first.key, delivery=D.DELIVERY_MODE_QUEUE)
        fu = start(prompts, text="follow up", key=first.key)
        stopped = worker_pid(one, 0)
        os.kill(stopped, signal.SIGSTOP)
        try:
            intr = start(prompts, text="urgent", key=first.key, delivery=D.DELIVERY_MODE_INTERRUPT)
            q = get_queue(prompts, first.key)
        finally:
            os.kill(stopped, signal.SIGCONT)
        assert intr.position == 1
        assert q.pending.request_id == fu.request_id
        assert [x.request_id for x in q.queued] == [intr.request_id, q1.request_id]
        for p in (first, intr, fu, q1):
            p.result(30)
        users = [m.content for m in transcript(sessions, first.session_id) if m.role == "user"]
        assert users == [words(40, "busy"), "urgent", "follow up", "queued one"]


def test_cancel_a_queued_prompt_then_the_running_one(stubs):
    prompts, _ = stubs
    first = busy(prompts, 40)
    q1 = start(prompts, text="one", key=first.key, delivery=D.DELIVERY_MODE_QUEUE)
    q2 = start(prompts, text="two", key=first.key, delivery=D.DELIVERY_MODE_QUEUE)
    assert prompts.Cancel(ppb.CancelRequest(request_id=q1.request_id), timeout=10).cancelled
    q1.result(10)
    assert q1.kinds() == ["accepted", "failed"] and q1.reason == "CANCELLED"
    assert [x.request_id for x in get_queue(prompts, first.key).queued] == [q2.request_id]
    assert prompts.Cancel(ppb.CancelRequest(session_key=first.key), timeout=10).cancelled
    assert first.result(10).end == "failed" and first.reason == "CANCELLED"
    assert q2.result(10).end == "completed" and q2.final_text == "two"
    assert not prompts.Cancel(ppb.CancelRequest(session_key=first.key), timeout=10).cancelled


def test_a_prompt_whose_call_deadline_passes_while_it_waits_never_runs(stubs):
    """A Prompt call's deadline is an instant: a queued prompt whose caller
    gave up while it waited ends AGENT_TIMEOUT without running (it used to run
    later with the deadline's whole length, writing a reply nobody awaited);
    the prompt behind it runs as usual."""
    prompts, sessions = stubs
    first = busy(prompts, 20)
    late = PromptRun(prompts, text="anyone there", key=first.key, delivery=D.DELIVERY_MODE_QUEUE,
                     timeout=0.5)
    late.wait_for("accepted")
    after = start(prompts, text="still queued", key=first.key, delivery=D.DELIVERY_MODE_QUEUE)
    assert late.result(10).code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert first.result(30).end == "completed"
    assert after.result(30).end == "completed" and after.final_text == "still queued"
    replay = watch(prompts, request_id=late.request_id)
    assert replay.kinds() == ["accepted", "failed"], replay.kinds()
    assert replay.last.failed.reason == "AGENT_TIMEOUT" and replay.code == grpc.StatusCode.DEADLINE_EXCEEDED
    users = [m.content for m in transcript(sessions, first.session_id) if m.role == "user"]
    assert users == [words(20, "busy"), "still queued"]


def test_a_follow_up_that_absorbed_another_runs_past_its_own_call_deadline(stubs):
    """The absorbed prompt ended superseded, its caller told that its text
    runs in the absorber's turn: that turn runs even though the absorber's
    own call gave up while it waited (nothing a user sent is dropped)."""
    prompts, sessions = stubs
    first = busy(prompts, 20)
    older = start(prompts, text="older words", key=first.key)
    newer = PromptRun(prompts, text="newer words", key=first.key, timeout=0.5)
    newer.wait_for("accepted")
    assert older.result(10).end == "superseded"
    assert newer.result(10).code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert first.result(30).end == "completed"
    replay = watch(prompts, request_id=newer.request_id)
    assert replay.kinds()[-1] == "completed", replay.kinds()
    users = [m.content for m in transcript(sessions, first.session_id) if m.role == "user"]
    assert users == [words(20, "busy"), "older words", "newer words"]

"""Turns under races and limits, against a real sidecar subprocess: a STEER
that is cancelled, that arrives twice (a client retrying blindly), or whose
host ends while the steer waits on a respawning worker; a blind retry of a
prompt that was refused, or whose first call's deadline hit during the
accept; DeleteSession and ClearAllSessions while a turn runs; and
limits.max_frames_per_turn. Each turn ends exactly once, its lane goes idle,
and a deleted session leaves no rows behind."""

from __future__ import annotations

import os
import signal
import threading
import time

import grpc
import pytest
from helpers.config import profile, scripted, table
from helpers.ids import source, words
from helpers.procs import worker_pid
from helpers.sessions import create, get_session, transcript
from helpers.store import StoreView, writes_held
from helpers.streams import (
    QUEUE,
    TERMINAL,
    D,
    PromptRun,
    assert_well_formed,
    collect,
    get_queue,
    kind_of,
    prompt_req,
    start,
    watch,
)
from helpers.waiting import wait_until
from sidecar_proc import TOKEN, Sidecar

from agent_sidecar.api.session_service import CLEAR_ALL_CONFIRM
from agent_sidecar.v1 import common_pb2 as c
from agent_sidecar.v1 import prompt_service_pb2 as ppb
from agent_sidecar.v1 import session_service_pb2 as spb

MAX_FRAMES = 100  # limits.max_frames_per_turn here: every other turn stays far below it
STEER_WINDOW_S = 1.0  # agent.steer_timeout_s of the sidecar whose worker is stopped past it
# agent.steer_timeout_s of the module's sidecar: no steer here falls back by
# running out of time (a test would wait twice this); each one that falls
# back, the scheduler placed at once, knowing no worker could answer it.
STEER_NEVER_S = 600

PROFILES = (profile("main", "echo")
          + profile("slow", "echo", {"token_latency_ms": 200})
          # still streaming when the limit's cancel reaches the worker
          + profile("stream", "echo", {"token_latency_ms": 5})
          + scripted("host", [{"text": "first answer", "token_latency_ms": 500}, {"echo_input": True}])
          # a first model call still streaming well after its worker is stopped and resumed
          # (the scripted model sleeps before each token: about 1 s of it is left then)
          + scripted("longhost", [{"text": words(10), "token_latency_ms": 100}, {"echo_input": True}])
          + scripted("crash", [{"text": "x", "kill": "worker"}])
          + f"[sidecar.limits]\nmax_frames_per_turn = {MAX_FRAMES}\n"
          + "[stream]\ncoalesce_ms = 0\n")  # one frame per word: the limit is reached mid-stream
CONFIG = PROFILES + table("agent", steer_timeout_s=STEER_NEVER_S)

# Every table that holds rows of a session (what DeleteSession removes).


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    """One worker, so a crash profile's kill leaves the lane's worker respawning."""
    s = Sidecar(tmp_path_factory.mktemp("races") / "data", config=CONFIG, workers=1,
                tcp=True).start()
    yield s
    s.stop()


def _frames(p: PromptRun) -> list[tuple[int, str]]:
    return [(f.seq, kind_of(f)) for f in p.frames]


def _ends_once(p: PromptRun) -> None:
    """seq 1..n gapless, accepted first, one terminal frame and it is the last."""
    kinds = p.kinds()
    assert [f.seq for f in p.frames] == list(range(1, len(kinds) + 1)), _frames(p)
    assert kinds and kinds[0] == "accepted" and kinds[-1] in TERMINAL, _frames(p)
    assert sum(k in TERMINAL for k in kinds) == 1, _frames(p)


def _crash_the_worker(prompts) -> None:
    """A turn that SIGKILLs the only worker: the next turns meet it respawning."""
    boom = start(prompts, text="die", src=source(), profile="crash")
    boom.result(15)
    assert boom.reason == "WORKER_CRASHED", _frames(boom)


def _leftovers(sc, key: str, sid: str) -> dict[str, int]:
    """What the store still holds of a lane and its incarnation, by kind of row."""
    store = StoreView(sc)
    rows = {"routing": int(store.entry(key) is not None),
            "incarnations": int(store.session_key_of(sid) is not None),
            "frames": len(store.frames_after(session_key=key)),
            "prompts": len(store.requests_of(key)),
            "prompt_queue": sum(p.slot is not None for p in store.open_prompts()
                                if p.entry.session_key == key),
            "restart_counts": int(store.restart_count(key) > 0),
            "messages": len(store.transcript(sid, include_rewound=True)),
            "turn_state": store.turn_state_rows(sid)}
    return {t: n for t, n in rows.items() if n}


def _settle(sc) -> None:
    """A whole turn on another session: writes queued before it have committed."""
    p = PromptRun(sc.prompts(), text="barrier", src=source()).result(15)
    assert p.end == "completed", _frames(p)


def _steer_twins(prompts, key: str, text: str, request_id: str) -> list[PromptRun]:
    """Two STEER calls with one request id, sent at the same moment (a client retrying blindly)."""
    barrier = threading.Barrier(2)
    twins: list[PromptRun] = []

    def go():
        barrier.wait()
        twins.append(PromptRun(prompts, text=text, key=key, delivery=D.DELIVERY_MODE_STEER,
                               request_id=request_id))
    threads = [threading.Thread(target=go) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return twins


# -- STEER ------------------------------------------------------------------------------------

def test_cancelled_steer_ends_once(sc):
    """A cancelled steer ends once (failed CANCELLED): the Cancel stops the
    host, which took the steer's text in, and the host's end adds no second
    terminal frame to the steer."""
    prompts = sc.prompts()
    host = start(prompts, text="hello", src=source(), profile="host")
    host.wait_for("text_delta")
    st = start(prompts, text="bananas", key=host.key, delivery=D.DELIVERY_MODE_STEER)
    assert prompts.Cancel(ppb.CancelRequest(request_id=st.request_id), timeout=10).cancelled
    st.result(10)
    assert st.reason == "CANCELLED", (_frames(st), st.code)
    _ends_once(st)
    host.result(10)
    assert host.end == "failed" and host.reason == "CANCELLED", _frames(host)
    store = StoreView(sc)
    ends = [(f.seq, f.kind) for f in store.request_frames(st.request_id) if f.kind in TERMINAL]
    assert ends == [(st.last.seq, "failed")], f"terminal frames persisted for the steer: {ends}"
    row = store.ledger(st.request_id)
    ledger = (row.status, row.reason, row.last_seq)
    assert ledger == ("failed", "CANCELLED", st.last.seq), \
        f"the steer's ledger row rewritten after its end, or its last seq not recorded: {ledger}"
    replay = watch(prompts, request_id=st.request_id, after_seq=st.last.seq, timeout=5)
    assert replay.frames == [], f"frames after the steer's terminal: {replay.kinds()}"


def test_steer_twins_steer_once(sc):
    """Two concurrent STEER calls with one request id steer the host once and share one turn."""
    prompts, sessions = sc.prompts(), sc.sessions()
    for attempt in range(3):
        host = start(prompts, text="hello", src=source(), profile="host")
        host.wait_for("text_delta")
        twins = _steer_twins(prompts, host.key, "bananas", f"twin-steer-{attempt}-{host.key}")
        host.result(15)
        for t in twins:
            t.result(15)
            _ends_once(t)
        assert _frames(twins[0]) == _frames(twins[1]), "the twins saw different turns"
        msgs = [(m.role, m.content) for m in transcript(sessions, host.session_id)]
        n = msgs.count(("user", "bananas"))
        assert n == 1, f"attempt {attempt}: one request id, steered text in the transcript {n}x: {msgs}"


def test_a_steer_at_a_turn_still_waiting_for_its_respawning_worker_runs_after_it(sc):
    """The host's run waits for its worker slot to respawn: a steer then had
    no worker to reach (it was dropped unsent) and waited out its whole
    timeout before it fell back. Now it is placed as a follow-up at once and
    runs on its own, after the host."""
    prompts = sc.prompts()
    _crash_the_worker(prompts)
    host = start(prompts, text="hi", src=source())
    host.wait_for("started")
    st = PromptRun(prompts, text="steer me", key=host.key, delivery=D.DELIVERY_MODE_STEER)
    host.result(15)
    assert host.end == "completed", _frames(host)
    st.wait_for("accepted", 15)
    assert st.done.wait(20), f"the steer never ended: {_frames(st)}"
    _ends_once(st)
    assert st.end == "completed", (_frames(st), st.reason)
    assert st.final_text.split() == ["steer", "me"], \
        f"expected the steer to run as its own turn, got {st.final_text!r}"


def test_a_steer_whose_worker_dies_before_answering_runs_on_its_own(sc):
    """The host's worker is stopped (it cannot answer) when the steer is
    asked, then killed: the steer waited out its whole timeout for an answer
    no dead worker sends. Now the worker's death answers it no: it runs on its
    own once its host has ended WORKER_CRASHED, and its text runs once."""
    prompts = sc.prompts()
    host = start(prompts, text="go", src=source(), profile="longhost")
    host.wait_for("text_delta")
    stopped = worker_pid(sc, 0)
    os.kill(stopped, signal.SIGSTOP)
    try:
        admitted = sc.status().prompts_admitted
        st = PromptRun(prompts, text="steered once", key=host.key, delivery=D.DELIVERY_MODE_STEER)
        # admitted in the step that asks the worker: once counted, the steer waits for the answer
        wait_until(lambda: sc.status().prompts_admitted > admitted, timeout=15,
                   what="the steer to be asked")
    finally:
        os.kill(stopped, signal.SIGKILL)
    assert host.result(30).reason == "WORKER_CRASHED", _frames(host)
    assert st.result(30).end == "completed", (_frames(st), st.reason)
    _ends_once(st)
    users = [m.content for m in transcript(sc.sessions(), host.session_id) if m.role == "user"]
    assert users.count("steered once") == 1, users


def test_a_steer_its_worker_could_take_only_too_late_runs_once(tmp_path):
    """The host's worker is stopped past the time a steer may be taken in: the
    steer is placed as a follow-up, and the worker, running again, refuses it
    (it took it in, so its text ran twice: in the host's turn and as its own).

    A sidecar of its own, whose steer window (``agent.steer_timeout_s``) is
    short: the worker stays stopped until the steer is placed as the pending
    follow-up, which happens only once that window and as long again have
    passed since the asking, so the worker meets it past its window."""
    config = PROFILES + table("agent", steer_timeout_s=STEER_WINDOW_S)
    with Sidecar(tmp_path / "data", config=config, workers=1) as one:
        prompts = one.prompts()
        host = start(prompts, text="go", src=source(), profile="longhost")
        host.wait_for("text_delta")
        stopped = worker_pid(one, 0)
        os.kill(stopped, signal.SIGSTOP)
        try:
            st = PromptRun(prompts, text="steered once", key=host.key, delivery=D.DELIVERY_MODE_STEER)
            wait_until(lambda: get_queue(prompts, host.key).pending.request_id == st.request_id,
                       timeout=30, what="the unanswered steer placed as the pending follow-up")
        finally:
            os.kill(stopped, signal.SIGCONT)
        assert host.result(30).end == "completed", _frames(host)
        assert st.result(30).end == "completed", _frames(st)  # on its own, after the host
        users = [m.content for m in transcript(one.sessions(), host.session_id) if m.role == "user"]
        assert users == ["go", "steered once"]


def test_unanswered_steer_twins_leave_the_lane_usable(sc):
    """STEER twins at a turn still waiting for its respawning worker fall back to
    FOLLOW_UP (at once: no worker could answer them) and leave no stuck turn:
    later prompts run, the lane goes idle."""
    prompts = sc.prompts()
    _crash_the_worker(prompts)
    host = start(prompts, text=words(10), src=source(), profile="slow")  # ~2 s once running
    host.wait_for("started")
    twins = _steer_twins(prompts, host.key, "steer me", f"twin-followup-{host.key}")
    host.result(30)
    assert host.end == "completed", _frames(host)
    for t in twins:
        t.result(30)
        _ends_once(t)
    later = PromptRun(prompts, text="anyone there", key=host.key)
    later.result(15)
    assert later.kinds()[-1:] == ["completed"], f"the lane is stuck: later prompt got {_frames(later)}"
    wait_until(lambda: get_session(sc.sessions(), host.key).state == c.SESSION_STATE_IDLE,
               timeout=10, what="the session to go IDLE")
    again = PromptRun(prompts, text="busy?", key=host.key,
                      delivery=D.DELIVERY_MODE_REJECT_IF_BUSY).result(15)
    assert again.end == "completed", (_frames(again), again.code, again.reason)


# -- retries of one request id ---------------------------------------------------------------

def test_twin_of_a_refused_prompt_is_refused_too(sc):
    """Two concurrent calls with one request id for a missing session both end SESSION_NOT_FOUND at once."""
    prompts = sc.prompts()
    req = ppb.PromptRequest(request_id=f"refused-twin-{id(sc)}", text="hi",
                            session_key=f"agent:main:telegram:dm:nobody{id(sc)}")
    outs: list = []

    def call():
        outs.append(collect(prompts.Prompt(req, timeout=5)))
    threads = [threading.Thread(target=call) for _ in range(2)]
    with writes_held(sc):  # both calls arrive while the first one's accept is pending
        for t in threads:
            t.start()
        time.sleep(0.5)
    for t in threads:
        t.join()
    got = sorted((o.code.name, o.reason) for o in outs)
    assert got == [("NOT_FOUND", "SESSION_NOT_FOUND")] * 2, f"the twins ended {got}"
    assert not any(k in TERMINAL for o in outs for k in o.kinds()), [o.kinds() for o in outs]


def test_retry_after_a_deadline_during_the_accept_gets_the_whole_turn(sc):
    """A retry after a client deadline during the accept gets the whole turn; the session goes IDLE."""
    prompts, sessions = sc.prompts(), sc.sessions()
    req = ppb.PromptRequest(request_id=f"deadline-{id(sc)}", text="hello there", source=source())
    with writes_held(sc):  # the accept cannot commit before the deadline
        first = collect(prompts.Prompt(req, timeout=0.5))
    assert first.code == grpc.StatusCode.DEADLINE_EXCEEDED, (first.code, first.kinds())
    retry = collect(prompts.Prompt(req, timeout=15))
    assert retry.code == grpc.StatusCode.OK, (retry.code, retry.details)
    assert retry.kinds()[-1:] == ["completed"], \
        f"the retry ended {retry.code.name} without the turn's end: {retry.kinds()}"
    assert_well_formed(retry, "completed")
    assert retry.last.completed.final_text == "hello there", retry.kinds()
    key = retry.frames[0].session_key
    try:
        wait_until(lambda: get_session(sessions, key).state == c.SESSION_STATE_IDLE, timeout=10)
    except AssertionError:
        state = c.SessionState.Name(get_session(sessions, key).state)
        raise AssertionError(f"session {key} still {state} after its turn ended") from None


def test_a_turn_cancelled_while_its_start_commits_ends_before_the_next_one_starts(sc):
    """Cancel reaching a prompt on an idle lane whose accept (which starts it
    too) has not committed: the lane's next prompt starts only after that
    turn's end, so the lane never has two turns open at once, in its frames or
    its ledger. It used to end at once, before its accept had committed, and
    let the next prompt start: that one's start committed before the first
    one's end (a soak saw the two overlap by 5 ms)."""
    prompts = sc.prompts()
    key = create(sc.sessions())[0].session_key
    with writes_held(sc):  # the accept cannot commit while Cancel and the next prompt arrive
        first = PromptRun(prompts, prompt_req(text="first", session_key=key), timeout=30)
        wait_until(lambda: prompts.Cancel(ppb.CancelRequest(session_key=key), timeout=5).cancelled, 10,
                   what="the first prompt cancelled while its accept waits")
        second = PromptRun(prompts, prompt_req(text="second", session_key=key, delivery=QUEUE), timeout=30)
        time.sleep(0.5)  # the second call reaches the lane while the first's accept still waits
    first.result(30)
    assert second.result(30).end == "completed", (second.kinds(), second.details)
    assert (first.end, first.last.failed.reason) == ("failed", "CANCELLED"), first.kinds()
    ends = watch(prompts, request_id=first.request_id).frames[-1]
    starts = next(f for f in watch(prompts, request_id=second.request_id).frames if kind_of(f) == "started")
    assert ends.cursor < starts.cursor and ends.at.ToNanoseconds() <= starts.at.ToNanoseconds(), \
        (ends, starts)


# -- deleting a session while its turn runs ------------------------------------------------

def test_delete_session_during_a_turn_leaves_no_rows(sc):
    """DeleteSession while a turn streams ends the turn once and leaves no row of the session in any table."""
    prompts, sessions = sc.prompts(), sc.sessions()
    p = start(prompts, text=words(30), src=source(), profile="slow")
    p.wait_for("text_delta")
    key, sid = p.key, p.session_id
    assert sessions.DeleteSession(spb.DeleteSessionRequest(session_key=key), timeout=15).deleted
    p.result(10)
    _ends_once(p)
    _settle(sc)
    assert _leftovers(sc, key, sid) == {}, "rows of the deleted session came back"


def test_clear_all_during_a_turn_leaves_no_rows(sc):
    """ClearAllSessions (admin token) while a turn streams ends it once and leaves no row of its session."""
    prompts = sc.prompts()
    p = start(prompts, text=words(30), src=source(), profile="slow")
    p.wait_for("text_delta")
    key, sid = p.key, p.session_id
    admin = [("authorization", f"Bearer {TOKEN}")]
    r = sc.sessions(tcp=True).ClearAllSessions(spb.ClearAllSessionsRequest(confirm=CLEAR_ALL_CONFIRM),
                                               timeout=15, metadata=admin)
    assert r.sessions_deleted >= 1
    p.result(10)
    _ends_once(p)
    _settle(sc)
    assert _leftovers(sc, key, sid) == {}, "rows of the cleared session came back"


# -- limits -------------------------------------------------------------------------------------

@pytest.mark.parametrize("model", ["stream", "main"])  # still streaming at the cancel / already done
def test_a_turn_stops_at_max_frames_per_turn(sc, model):
    """A turn reaching limits.max_frames_per_turn ends failed RESOURCE_EXHAUSTED, seqs 1..n, n <= limit."""
    p = PromptRun(sc.prompts(), text=words(2 * MAX_FRAMES), src=source(), profile=model).result(30)
    kinds = p.kinds()
    assert len(kinds) <= MAX_FRAMES, f"{len(kinds)} frames in one turn (limit {MAX_FRAMES}), end {kinds[-1]}"
    assert [f.seq for f in p.frames] == list(range(1, len(kinds) + 1)), "seqs not gapless 1..n"
    assert kinds[-1] == "failed" and sum(k in TERMINAL for k in kinds) == 1, kinds[-3:]
    failed = p.last.failed
    assert failed.reason == "RESOURCE_EXHAUSTED", failed
    assert "limits.max_frames_per_turn" in failed.message, failed.message
    assert p.code == grpc.StatusCode.RESOURCE_EXHAUSTED and p.reason == "RESOURCE_EXHAUSTED", \
        (p.code, p.reason)

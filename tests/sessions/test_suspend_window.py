"""SuspendSession (/stop) ends only what it stops, through a real sidecar: the
running turn (failed CANCELLED) and the prompts accepted before it, also
those accepted before a SwitchSession moved the lane. A prompt whose accept commits after the suspend's job goes to
the next incarnation (seed 001 §2: suspended → a new id) and runs there. The
lane was dropped whole after the job, so such a prompt, acknowledged, ended
``superseded`` and was lost. The store's write lock is held while the calls
arrive, so the suspend's job is queued before the prompt's accept."""

from __future__ import annotations

import threading
import time

import pytest
from helpers.config import slow_echo
from helpers.ids import source, words
from helpers.sessions import transcript
from helpers.store import writes_held
from helpers.streams import QUEUE, PromptRun, start
from sidecar_proc import Sidecar

from agent_sidecar.v1 import session_service_pb2 as pb


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    s = Sidecar(tmp_path_factory.mktemp("suspend") / "data", config=slow_echo("main", 50)).start()
    yield s
    s.stop()


def test_a_prompt_accepted_after_the_suspend_runs_in_the_next_incarnation(sc):
    prompts, sessions = sc.prompts(), sc.sessions()
    src = source()
    busy = PromptRun(prompts, text=words(200), src=src)
    busy.wait_for("text_delta")
    answer: list = []
    stop = threading.Thread(target=lambda: answer.append(sessions.SuspendSession(
        pb.SuspendSessionRequest(session_key=busy.key), timeout=30).session))
    with writes_held(sc):  # no job commits while the two calls arrive
        stop.start()
        time.sleep(0.5)  # the suspend's job is queued before the prompt's accept
        after = PromptRun(prompts, text="after the stop", src=src)
        time.sleep(0.5)
    stop.join(30)
    assert answer and answer[0].suspended and answer[0].session_id == busy.session_id, answer
    assert busy.result(30).reason == "CANCELLED", busy.kinds()
    after.result(30)
    assert after.session_id != busy.session_id, "accepted after the suspend: a new incarnation"
    assert after.end == "completed" and after.final_text == "after the stop", (after.kinds(), after.last)
    s = sessions.GetSession(pb.GetSessionRequest(session_key=busy.key), timeout=10).session
    assert s.session_id == after.session_id and not s.suspended


def test_a_prompt_accepted_after_the_suspend_of_an_idle_lane_is_not_cancelled(sc):
    """The same on an idle lane: the prompt started at once in the next
    incarnation, and the drop cancelled it (failed CANCELLED)."""
    prompts, sessions = sc.prompts(), sc.sessions()
    src = source()
    first = PromptRun(prompts, text="hello", src=src).result(30)
    stop = threading.Thread(target=lambda: sessions.SuspendSession(
        pb.SuspendSessionRequest(session_key=first.key), timeout=30))
    with writes_held(sc):
        stop.start()
        time.sleep(0.5)  # the suspend's job is queued before the prompt's accept
        after = PromptRun(prompts, text="after the stop", src=src)
        time.sleep(0.5)
    stop.join(30)
    after.result(30)
    assert after.session_id != first.session_id
    assert after.end == "completed" and after.final_text == "after the stop", (after.kinds(), after.reason)


def test_a_stop_after_a_switch_ends_the_turns_accepted_before_it(sc):
    """Accepted in incarnation S2, a running turn and a queued prompt; then
    SwitchSession back to S1 and /stop. Both end: the running one CANCELLED,
    the queued one superseded. They were told apart by incarnation (S2 is not
    the one suspended), so the turn ran on and the queued prompt then ran in
    the suspended S1, writing its exchange there."""
    prompts, sessions = sc.prompts(), sc.sessions()
    first = PromptRun(prompts, text="hello", src=source()).result(30)
    s1 = first.session_id
    sessions.ResetSession(pb.ResetSessionRequest(session_key=first.key), timeout=10)
    busy = start(prompts, text=words(200), key=first.key)
    busy.wait_for("text_delta")
    queued = start(prompts, text="queued", key=first.key, delivery=QUEUE)
    sessions.SwitchSession(pb.SwitchSessionRequest(session_key=first.key, target_session_id=s1), timeout=10)
    stopped = sessions.SuspendSession(pb.SuspendSessionRequest(session_key=first.key), timeout=30).session
    assert stopped.session_id == s1 and stopped.suspended
    assert busy.result(30).reason == "CANCELLED", busy.kinds()
    assert queued.result(30).kinds() == ["accepted", "superseded"], queued.kinds()
    assert [m.content for m in transcript(sessions, s1)] == ["hello", "hello"]

"""A frame flush the store refuses for good (not a store fault, not its order,
not a fence: here a trigger on the frames table, a row the store will not
take), through a real sidecar: nothing of it committed and nobody waits for
it. The turns with activity in it end failed INTERNAL with a gapless stream,
nothing they wrote stays in the transcript, and the session goes on. It used
to be logged and forgotten: its frames never reached the streams, its
post-commit callbacks never ran, and the turn's Prompt call waited for ever."""

from __future__ import annotations

import os
import signal

import grpc
import pytest
from helpers.config import echo
from helpers.ids import source, words
from helpers.procs import worker_pid
from helpers.sessions import transcript
from helpers.store import frames_refused
from helpers.streams import PromptRun, assert_failed, kind_of, run, start, watch
from helpers.waiting import wait_until
from sidecar_proc import Sidecar

POISON = "poisoned"


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    s = Sidecar(tmp_path_factory.mktemp("lost") / "data", config=echo("main", 20), workers=1).start()
    yield s
    s.stop()


@pytest.mark.parametrize("refused", [f"%{POISON}%", f"%final_text%{POISON}%"], ids=["a_delta", "its_end"])
def test_a_turn_whose_frames_the_store_refuses_ends_internal_and_the_session_goes_on(sc, refused):
    """Refused: a text delta of the turn (it is running: it is cancelled), or
    its ``completed`` frame (its end was lost: it ends again, failed)."""
    prompts, sessions = sc.prompts(), sc.sessions()
    first = run(prompts, text="hello", src=source())
    assert first.end == "completed"
    with frames_refused(sc, refused):
        lost = PromptRun(prompts, text=f"a {POISON} reply", key=first.key).result(30)
    assert_failed(lost, "INTERNAL", grpc.StatusCode.INTERNAL)
    assert "this frame is refused" not in lost.details  # the database's words are the log's
    assert not any(POISON in str(f) for f in lost.frames)
    replay = watch(prompts, request_id=lost.request_id)
    assert [(f.seq, kind_of(f)) for f in replay.frames] == [(f.seq, kind_of(f)) for f in lost.frames]
    assert [(m.role, m.content) for m in transcript(sessions, first.session_id)] == [
        ("user", "hello"), ("assistant", "hello")]
    again = run(prompts, text="again", key=first.key)
    assert again.final_text == "again"
    assert [m.content for m in transcript(sessions, first.session_id)] == ["hello", "hello", "again", "again"]


def test_a_turn_whose_every_frame_the_store_refuses_ends_its_stream_and_is_not_sent_for_ever(sc):
    """The store refuses every frame (its end's too, sent again failed): the
    turn's stream ends INTERNAL with no terminal frame, instead of its end
    being sent again for ever (a flush a millisecond, each refused), and the
    session goes on once the store takes frames again."""
    prompts, sessions = sc.prompts(), sc.sessions()
    busy = start(prompts, text=words(30, "busy"), src=source())
    busy.wait_for("text_delta")
    with frames_refused(sc, "%"):
        busy.result(30)
    assert (busy.code, busy.reason) == (grpc.StatusCode.INTERNAL, "INTERNAL"), (busy.kinds(), busy.details)
    again = run(prompts, text="again", key=busy.key)
    assert again.final_text == "again", again.kinds()
    assert [m.content for m in transcript(sessions, busy.session_id)][-2:] == ["again", "again"]


def test_a_refused_row_of_one_session_fails_only_that_sessions_turn(sc):
    """Two sessions' turns end in one flush (their worker is killed: both
    turns' ``failed`` frames are published together) and the store refuses
    the row of one of them: that turn ends INTERNAL, the other ends as it
    would have, WORKER_CRASHED, its stream gapless. The whole flush used to
    be lost, and with it every turn that had an item in it."""
    prompts = sc.prompts()
    bad, good = (start(prompts, text=words(200, name), src=source()) for name in ("bad", "good"))
    bad.wait_for("text_delta")
    good.wait_for("text_delta")
    with frames_refused(sc, "%WORKER_CRASHED%", request_id=bad.request_id):
        os.kill(worker_pid(sc, 0), signal.SIGKILL)
        bad.result(30)
        good.result(30)
    assert_failed(bad, "INTERNAL", grpc.StatusCode.INTERNAL)
    assert (good.end, good.last.failed.reason, good.reason) == ("failed", "WORKER_CRASHED", "WORKER_CRASHED"), \
        (good.kinds(), good.details)
    for out in (bad, good):
        replay = watch(prompts, request_id=out.request_id)
        assert [(f.seq, kind_of(f)) for f in replay.frames] == [(f.seq, kind_of(f)) for f in out.frames]
        assert [f.seq for f in out.frames] == list(range(1, len(out.frames) + 1))
    wait_until(lambda: worker_pid(sc, 0) is not None, 30, what="a new worker in the slot")

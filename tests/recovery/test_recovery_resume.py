"""Which lanes a crash makes the bot speak in (issue 14, item 14; DECISIONS.md
"Recovery"), through real processes and a real kill -9: only a lane whose turn
was in flight gets a continue turn; a lane merely active in the last 120 s (one
written only through AppendMessages, one whose turn had completed) is marked
``resume_pending`` and keeps its id, but hears nothing. The continue note is
stored marked synthetic. ``recovery.auto_resume = "recent"`` resumes every
recent lane (hermes' rule), ``"off"`` none."""

from __future__ import annotations

from helpers.config import echo, table
from helpers.ids import source, words
from helpers.recovery import RESUME_PREFIX, restart
from helpers.sessions import get_session, transcript
from helpers.streams import PromptRun, kind_of, watch
from helpers.waiting import wait_until
from sidecar_proc import Sidecar

from agent_sidecar.v1 import common_pb2 as c
from agent_sidecar.v1 import session_service_pb2 as spb


def _lanes_then_kill9(sc) -> dict:
    """Three lanes active just before a kill -9: one written only through
    AppendMessages, one whose turn completed, one with a turn in flight."""
    sessions = sc.sessions()
    appended = sessions.GetOrCreateSession(spb.GetOrCreateSessionRequest(source=source()),
                                           timeout=10).session
    sessions.AppendMessages(spb.AppendMessagesRequest(session_id=appended.session_id, messages=[
        c.Message(role="user", content="noted by the adapter")]), timeout=10)
    done = PromptRun(sc.prompts(), text="all done", src=source()).result(20)
    assert done.end == "completed", done.kinds()
    busy = PromptRun(sc.prompts(), text=words(80), src=source(), profile="slow")
    busy.wait_for("text_delta")
    sc.kill9()
    return {"appended": (appended.session_key, appended.session_id),
            "completed": (done.key, done.session_id), "in_flight": (busy.key, busy.session_id)}


def _resumed(sc, sid: str) -> list:
    """The frames of the lane's first resume turn, to its end; [] if there is none."""
    w = watch(sc.prompts(), request_id=f"resume:{sid}:1", timeout=30)
    frames, reason = w.frames, w.reason
    assert frames or reason == "REQUEST_NOT_FOUND", reason
    return frames


def _assert_resumed_with_a_synthetic_note(sc, key: str, sid: str) -> None:
    frames = _resumed(sc, sid)
    assert [kind_of(f) for f in frames][-1] == "completed", [kind_of(f) for f in frames]
    messages = transcript(sc.sessions(), sid, include_rewound=True)
    notes = [m for m in messages if m.role == "user" and m.content.startswith(RESUME_PREFIX)]
    assert len(notes) == 1 and notes[0].synthetic, notes
    assert "do not repeat" in notes[0].content and "where things stand" in notes[0].content
    assert [m.seq for m in messages if m.synthetic] == [notes[0].seq], "only the note is synthetic"
    assert get_session(sc.sessions(), key).session_id == sid


def _assert_marked_and_silent(sc, key: str, sid: str, messages_before: int) -> None:
    s = get_session(sc.sessions(), key)
    assert s.resume_pending and s.session_id == sid, (s.resume_pending, s.resume_reason)
    assert _resumed(sc, sid) == []
    assert len(transcript(sc.sessions(), sid, include_rewound=True)) == messages_before


def test_only_the_lane_whose_turn_was_in_flight_is_resumed(tmp_path):
    sc = Sidecar(tmp_path / "data", config=echo("slow", 50)).start()
    try:
        lanes = _lanes_then_kill9(sc)
        restart(sc)  # the resume turns are submitted before "serving"
        _assert_resumed_with_a_synthetic_note(sc, *lanes["in_flight"])
        _assert_marked_and_silent(sc, *lanes["appended"], messages_before=1)
        _assert_marked_and_silent(sc, *lanes["completed"], messages_before=2)
    finally:
        sc.stop()


def test_auto_resume_recent_resumes_every_recent_lane(tmp_path):
    cfg = echo("slow", 50) + table("recovery", auto_resume="recent")
    sc = Sidecar(tmp_path / "data", config=cfg).start()
    try:
        lanes = _lanes_then_kill9(sc)
        restart(sc)
        for name in ("in_flight", "appended", "completed"):
            _assert_resumed_with_a_synthetic_note(sc, *lanes[name])
    finally:
        sc.stop()


def test_auto_resume_off_resumes_nothing(tmp_path):
    cfg = echo("slow", 50) + table("recovery", auto_resume="off")
    sc = Sidecar(tmp_path / "data", config=cfg).start()
    try:
        lanes = _lanes_then_kill9(sc)
        restart(sc)
        key, sid = lanes["in_flight"]
        s = get_session(sc.sessions(), key)
        assert s.resume_pending and s.resume_reason == "restart_interrupted", s
        assert _resumed(sc, sid) == []
        _assert_marked_and_silent(sc, *lanes["appended"], messages_before=1)
    finally:
        sc.stop()


def test_undo_during_an_auto_resume_turn_takes_back_the_users_turn(tmp_path):
    """RewindSession(n=1) while the continue turn runs: that turn is taken
    back (failed CANCELLED) but is no user turn, so the rewind goes on to the
    user message it was finishing. It counted as the user's turn: the rewind
    hid only the system's note, reported the note as ``target_text`` and left
    the user's message, which the next turn answered again."""
    sc = Sidecar(tmp_path / "data", config=echo("main", 1000)).start()  # the note: a minute
    try:
        busy = PromptRun(sc.prompts(), text="book the flight " + words(5), src=source())
        busy.wait_for("text_delta")
        sc.kill9()
        restart(sc)
        sid = busy.session_id
        wait_until(lambda: any(m.synthetic for m in transcript(sc.sessions(), sid)), 30,
                   what="the continue turn's note")
        r = sc.sessions().RewindSession(spb.RewindSessionRequest(session_id=sid, n=1), timeout=10)
        assert (r.turns_undone, r.target_text) == (1, "book the flight " + words(5)), r
        resumed = _resumed(sc, sid)
        assert kind_of(resumed[-1]) == "failed" and resumed[-1].failed.reason == "CANCELLED", resumed[-1]
        assert transcript(sc.sessions(), sid) == []
    finally:
        sc.stop()

"""A prompt that waits in its lane runs in the lane's incarnation as it is
when the prompt starts (a SwitchSession may move the lane meanwhile), and
every frame from its ``started`` on names that incarnation, the one its user
message and reply went to: on its stream and as the store replays it."""

from __future__ import annotations

from helpers.config import slow_echo
from helpers.ids import source, words
from helpers.sessions import transcript
from helpers.streams import QUEUE, PromptRun, kind_of, start, watch
from sidecar_proc import Sidecar

from agent_sidecar.v1 import session_service_pb2 as spb


def test_a_prompt_moved_by_a_switch_while_it_waited_names_where_it_ran(tmp_path):
    with Sidecar(tmp_path / "data", config=slow_echo("main"), workers=1) as sc:
        prompts, sessions = sc.prompts(), sc.sessions()
        src = source()
        earlier = PromptRun(prompts, text="earlier", src=src).result(30)
        sessions.GetOrCreateSession(spb.GetOrCreateSessionRequest(source=src, force_new=True), timeout=10)
        busy = start(prompts, text=words(20), src=src)
        busy.wait_for("started")
        queued = start(prompts, text="queued", key=busy.key, delivery=QUEUE)
        sessions.SwitchSession(spb.SwitchSessionRequest(
            session_key=busy.key, target_session_id=earlier.session_id), timeout=10)
        queued.result(30)
        assert queued.end == "completed", queued.kinds()
        replayed = watch(prompts, request_id=queued.request_id)
        for frames in (queued.frames, replayed.frames):
            assert frames[0].session_id == busy.session_id  # accepted where the lane was then
            ran = [(kind_of(f), f.session_id) for f in frames[1:]]
            assert ran == [(kind, earlier.session_id) for kind, _ in ran]
        assert [m.content for m in transcript(sessions, earlier.session_id)][-2:] == ["queued", "queued"]

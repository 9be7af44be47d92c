"""WatchActivity by session key or platform delivers every frame, in order:
a replay after a cursor goes past one page of persisted rows and on to the
live frames without a gap, and a live watcher gets each turn's accepted frame
as well as the frames committed with or after it. Real sidecar subprocess."""

from __future__ import annotations

import threading

import grpc
import pytest
from helpers.config import profile
from helpers.ids import source, uniq, words
from helpers.streams import TERMINAL, PromptRun, Watcher, collect, kind_of
from sidecar_proc import Sidecar

from agent_sidecar.api.prompt_service import REPLAY_PAGE  # rows per read of a WatchActivity replay
from agent_sidecar.v1 import prompt_service_pb2 as ppb


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    one_frame_a_word = "[stream]\ncoalesce_ms = 0\n\n"
    s = Sidecar(tmp_path_factory.mktemp("watch") / "data", config=one_frame_a_word + profile("main", "echo"),
                workers=2).start()
    yield s
    s.stop()


def test_watch_by_key_replays_past_one_page(sc):
    """A key watcher resuming after a cursor gets every later frame (over several pages) up to the terminal."""
    prompts = sc.prompts()
    p = PromptRun(prompts, text=words(4 * REPLAY_PAGE + 100), src=source()).result(60)
    assert p.end == "completed"
    expected = [(f.seq, kind_of(f)) for f in p.frames[1:]]
    assert len(expected) > 4 * REPLAY_PAGE
    rid = p.request_id
    out = collect(prompts.WatchActivity(ppb.WatchActivityRequest(
        session_key=p.key, after_cursor=p.frames[0].cursor), timeout=15),
        stop=lambda f: f.request_id == rid and kind_of(f) in TERMINAL)
    got = [(f.seq, kind_of(f)) for f in out.frames]
    assert got == expected, (f"got {len(got)} of {len(expected)} frames after the cursor, last {got[-1:]},"
                             f" stream ended {out.code.name}")
    cursors = [f.cursor for f in out.frames]
    assert cursors == sorted(set(cursors)), "cursors not strictly increasing"


def test_platform_watcher_gets_every_frame_of_every_turn(sc):
    """A live platform watcher gets each turn's frames exactly as its Prompt stream did, accepted included."""
    prompts = sc.prompts()
    platform = uniq("plat")
    w = Watcher(sc.prompts(), platform=platform)
    try:
        for _ in range(50):  # the watcher is subscribed once it sees a turn end
            warm = PromptRun(prompts, text="warm up", src=source(platform=platform)).result(10)
            try:
                w.frames_of(warm.request_id, timeout=0.5)
                break
            except AssertionError:
                continue
        else:
            raise AssertionError("the platform watcher never saw a turn")
        runs: list[PromptRun] = []
        lock = threading.Lock()

        def client():
            for _ in range(15):
                p = PromptRun(prompts, text="hello there friend", src=source(platform=platform))
                p.result(20)
                with lock:
                    runs.append(p)
        threads = [threading.Thread(target=client) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        bad = []
        for p in runs:
            assert p.code == grpc.StatusCode.OK and p.end == "completed", (p.kinds(), p.code)
            sent = [(f.seq, kind_of(f)) for f in p.frames]
            seen = [(f.seq, kind_of(f)) for f in w.frames_of(p.request_id, 10)]
            if seen != sent:
                bad.append((p.request_id, seen))
        assert not bad, f"{len(bad)} of {len(runs)} turns incomplete at the platform watcher, e.g. {bad[:2]}"
    finally:
        w.close()

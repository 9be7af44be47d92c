"""WatchActivity (resuming a dropped stream; by session key and platform),
idempotent prompts (a duplicate request id, concurrent and later), and sessions
spread over workers, each staying on its worker (issue 3). Real sidecar
subprocess, generated stubs."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from helpers.config import echo
from helpers.ids import uniq
from helpers.logs import log_lines
from helpers.procs import children, grpc_loaded
from helpers.sessions import get_session, transcript, turns
from helpers.streams import (
    Watcher,
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
from helpers.waiting import wait_until
from sidecar_proc import Sidecar

from agent_sidecar.turns.pool import rendezvous
from agent_sidecar.v1 import common_pb2 as c
from agent_sidecar.v1 import prompt_service_pb2 as ppb
from agent_sidecar.v1 import session_service_pb2 as spb

PROFILES = echo("main") + echo("slow", 40)
WORDS = " ".join(f"word{i}" for i in range(12))


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    s = Sidecar(tmp_path_factory.mktemp("watch") / "data", config=PROFILES, workers=2).start()
    yield s
    s.stop()


def ident(frames) -> list[tuple]:
    """What two deliveries of one frame must agree on."""
    return [(f.seq, kind_of(f), body_of(f), f.cursor, f.session_id, f.at.ToNanoseconds()) for f in frames]


# -- WatchActivity ------------------------------------------------------------------------


def test_watch_resumes_a_dropped_stream_without_gap_or_duplicate(sc):
    stub = sc.prompts()
    req = prompt_req(text=WORDS, profile="slow")
    seen = []
    first = collect(stub.Prompt(req, timeout=30), stop=lambda f: seen.append(f) or len(seen) == 3)
    assert first.kinds() == ["accepted", "started", "text_delta"]
    assert first.code == grpc.StatusCode.OK  # we hung up; no error of the server's

    rest = watch(stub, request_id=req.request_id, after_seq=3)
    seqs = [f.seq for f in rest.frames]
    assert seqs == list(range(4, 4 + len(rest.frames))), seqs
    assert rest.kinds()[-1] == "completed" and rest.code == grpc.StatusCode.OK
    assert "accepted" not in rest.kinds() and "started" not in rest.kinds()
    # together: the whole turn, exactly once; the dropped stream did not cancel it
    whole = first.frames + rest.frames
    assert [f.seq for f in whole] == list(range(1, len(whole) + 1))
    assert first.text() + rest.text() == WORDS
    assert rest.last.completed.final_text == WORDS
    full = watch(stub, request_id=req.request_id)
    assert_well_formed(full)
    assert ident(full.frames) == ident(whole)
    s = get_session(sc.sessions(), first.frames[0].session_key)
    assert s.turn_count == 1 and s.state == c.SESSION_STATE_IDLE


def test_watch_after_the_last_frame_of_a_finished_turn_is_empty(sc):
    out = run(sc.prompts(), prompt_req(text="short one"))
    n = out.last.seq
    tail = watch(sc.prompts(), request_id=out.frames[0].request_id, after_seq=n, timeout=5)
    assert tail.frames == [] and tail.code == grpc.StatusCode.OK, (tail.code, tail.details)


def _probe_until_live(sc, w: Watcher, key: str) -> None:
    """after_cursor=0 means live only: run tiny turns until the watch sees one."""
    def seen():
        run(sc.prompts(), prompt_req(text="probe", session_key=key))
        return any(f.session_key == key for f in w.frames)
    wait_until(seen, timeout=10, interval=0)


def _watched_session(sc) -> tuple:
    """A session made by one turn, and a watcher of its key that sees live frames."""
    first = run(sc.prompts(), prompt_req(text="make the session"))
    key = first.frames[0].session_key
    w = Watcher(sc.prompts(), session_key=key, after_cursor=0)
    try:
        _probe_until_live(sc, w, key)
    except BaseException:
        w.close()
        raise
    return first, key, w


def test_watch_by_session_key_sees_live_frames_of_a_later_turn(sc):
    stub = sc.prompts()
    first, key, w = _watched_session(sc)
    try:
        other = run(stub, prompt_req(text="someone else"))  # another session: not seen
        out = run(stub, prompt_req(text=WORDS, session_key=key))
        assert_well_formed(out)
        got = w.frames_of(out.frames[0].request_id)
        assert ident(got) == ident(out.frames)
        assert not any(f.request_id == other.frames[0].request_id for f in w.frames)
        assert all(f.session_key == key for f in w.frames)
        assert not any(f.request_id == first.frames[0].request_id for f in w.frames)  # live only
    finally:
        w.close()
    # a resume point: after the first turn's last cursor, every later frame of the key
    w2 = Watcher(stub, session_key=key, after_cursor=first.last.cursor)
    try:
        got = w2.frames_of(out.frames[0].request_id)
        assert ident(got) == ident(out.frames)
        cursors = [f.cursor for f in w2.frames]
        assert cursors == sorted(set(cursors)) and cursors[0] > first.last.cursor
    finally:
        w2.close()


def test_a_large_frame_is_the_same_on_its_stream_a_watcher_and_a_replay(sc):
    """A frame past 16 KB (a three-byte length prefix) arrives identical on
    the Prompt stream, on a watcher of its session key and in a replay by
    request: every stream sends the frame's one encoding."""
    stub = sc.prompts()
    _, key, w = _watched_session(sc)
    try:
        text = " ".join(f"wörd{i}" for i in range(3_000))  # ~20 KB; the echo says it back
        out = run(stub, prompt_req(text=text, session_key=key))
        assert_well_formed(out)
        assert out.last.completed.final_text == text and out.last.ByteSize() > 16_384
        got = w.frames_of(out.frames[0].request_id)
        assert ident(got) == ident(out.frames)
    finally:
        w.close()
    again = watch(stub, request_id=out.frames[0].request_id)
    assert ident(again.frames) == ident(out.frames)


def test_watch_by_platform(sc):
    stub = sc.prompts()
    platform = uniq("plat")
    src = c.SessionSource(platform=platform, chat_id=uniq("p"))
    first = run(stub, prompt_req(text="hello", source=src))
    assert_well_formed(first)
    w = Watcher(stub, platform=platform, after_cursor=0)
    try:
        _probe_until_live(sc, w, first.frames[0].session_key)
        other = run(stub, prompt_req(text="elsewhere"))  # telegram: not this platform
        out = run(stub, prompt_req(text="second chat", source=c.SessionSource(
            platform=platform, chat_id=uniq("p"))))
        got = w.frames_of(out.frames[0].request_id)
        assert ident(got) == ident(out.frames)
        assert not any(f.request_id == other.frames[0].request_id for f in w.frames)
    finally:
        w.close()


def test_watch_unknown_request_id_is_not_found(sc):
    out = watch(sc.prompts(), request_id=uniq("nope"), timeout=5)
    assert out.frames == []
    assert out.code == grpc.StatusCode.NOT_FOUND, (out.code, out.details)
    assert out.reason, "no ErrorInfo"


def test_watch_of_a_platform_name_no_platform_can_have_is_refused(sc):
    """No platform name holds ':' (source.platform refuses it): such a watch
    is INVALID_ARGUMENT naming the field, not a stream that waits forever."""
    out = collect(sc.prompts().WatchActivity(ppb.WatchActivityRequest(platform="tele:gram"), timeout=5))
    assert out.frames == []
    assert out.code == grpc.StatusCode.INVALID_ARGUMENT and out.field == "platform", (out.code, out.details)


@pytest.mark.parametrize("request_fields,field", [
    ({"platform": "telegram", "after_cursor": -1}, "after_cursor"),
    ({"session_key": "agent:main:telegram:dm:1", "after_cursor": -5}, "after_cursor"),
    ({"request_id": "r", "after_seq": -1}, "after_seq"),
    # the other kind's resume point would be ignored: the replay silently lost
    ({"platform": "telegram", "after_seq": 3}, "after_seq"),
    ({"session_key": "agent:main:telegram:dm:1", "after_seq": 3}, "after_seq"),
    ({"request_id": "r", "after_cursor": 5}, "after_cursor"),
])
def test_a_bad_resume_point_is_refused_naming_its_field(sc, request_fields, field):
    out = collect(sc.prompts().WatchActivity(ppb.WatchActivityRequest(**request_fields), timeout=5))
    assert out.frames == []
    assert out.code == grpc.StatusCode.INVALID_ARGUMENT and out.field == field, (out.code, out.details)


# -- idempotency ------------------------------------------------------------------------


def test_duplicate_request_id_concurrent_runs_one_turn(sc):
    stub = sc.prompts()
    req = prompt_req(text=WORDS, profile="slow")
    barrier, outs = threading.Barrier(3), [None] * 3

    def go(i):
        barrier.wait()
        outs[i] = run(stub, req)
    threads = [threading.Thread(target=go, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for out in outs:
        assert_well_formed(out)
        assert ident(out.frames) == ident(outs[0].frames)
    sid, key = outs[0].frames[0].session_id, outs[0].frames[0].session_key
    assert [m.role for m in transcript(sc.sessions(), sid)] == ["user", "assistant"]
    assert get_session(sc.sessions(), key).turn_count == 1
    # and later: the same frames again, still one turn
    again = run(stub, req)
    assert ident(again.frames) == ident(outs[0].frames)
    assert get_session(sc.sessions(), key).turn_count == 1


def test_duplicate_request_id_after_the_first_finished(sc):
    stub = sc.prompts()
    req = prompt_req(text="only once please")
    out = run(stub, req)
    assert_well_formed(out)
    key, sid = out.frames[0].session_key, out.frames[0].session_id
    for _ in range(2):
        again = run(stub, req)
        assert again.code == grpc.StatusCode.OK
        assert ident(again.frames) == ident(out.frames)
    # a retry with the same id but other text still does not start a turn
    other = run(stub, prompt_req(request_id=req.request_id, text="different", session_key=key))
    assert ident(other.frames) == ident(out.frames)
    assert [(m.role, m.content) for m in transcript(sc.sessions(), sid)] == [
        ("user", "only once please"), ("assistant", "only once please")]
    assert get_session(sc.sessions(), key).turn_count == 1


def test_duplicate_request_id_survives_a_restart(tmp_path):
    with Sidecar(tmp_path / "data", config=PROFILES, workers=1) as s:
        req = prompt_req(text="remember me")
        out = run(s.prompts(), req)
        assert_well_formed(out)
        s.stop()
        s.start()
        again = run(s.prompts(), req)
        assert ident(again.frames) == ident(out.frames)
        assert get_session(s.sessions(), out.frames[0].session_key).turn_count == 1
        assert len(transcript(s.sessions(), out.frames[0].session_id)) == 2


def test_a_request_id_past_the_dedup_window_starts_a_new_turn(tmp_path):
    """The window counts from the request's acceptance: the twin goes as soon as
    it is accepted (a loaded machine may take longer than a window to run the
    turn), the reuse once the window has passed since."""
    window = 2.0
    cfg = f"[sidecar]\ndedup_window_s = {window}\n" + PROFILES
    with Sidecar(tmp_path / "data", config=cfg, workers=1) as s:
        req = prompt_req(text="once")
        first = start(s.prompts(), req)
        accepted_at = first.wait_for("accepted").at.ToNanoseconds() / 1e9
        twin = run(s.prompts(), req)  # inside the window
        out = first.result()
        assert ident(twin.frames) == ident(out.frames)
        time.sleep(max(0.0, accepted_at + window + 0.2 - time.time()))
        later = run(s.prompts(), req)
        assert_well_formed(later)
        assert later.frames[0].at.ToNanoseconds() > out.last.at.ToNanoseconds()  # new frames
        assert get_session(s.sessions(), out.frames[0].session_key).turn_count == 2
        assert len(transcript(s.sessions(), out.frames[0].session_id)) == 4
        assert ident(watch(s.prompts(), request_id=req.request_id).frames) == ident(later.frames)


def test_a_fractional_dedup_window_is_accepted(tmp_path):
    Sidecar(tmp_path / "data", config="[sidecar]\ndedup_window_s = 1.5\n", workers=1).start(10).stop()


def test_cursors_never_go_back_after_frames_are_deleted(tmp_path):
    with Sidecar(tmp_path / "data", config=PROFILES, workers=1) as s:
        platform = uniq("cur")
        first = run(s.prompts(), prompt_req(text="first", source=c.SessionSource(
            platform=platform, chat_id="a")))
        resume_at = first.last.cursor
        s.sessions().DeleteSession(spb.DeleteSessionRequest(
            session_key=first.frames[0].session_key), timeout=10)
        second = run(s.prompts(), prompt_req(text="second", source=c.SessionSource(
            platform=platform, chat_id="b")))
        assert_well_formed(second)
        assert second.frames[0].cursor > resume_at, ([f.cursor for f in second.frames], resume_at)
        w = Watcher(s.prompts(), platform=platform, after_cursor=resume_at)
        try:
            assert ident(w.frames_of(second.frames[0].request_id, timeout=3)) == ident(second.frames)
        finally:
            w.close()


def test_the_resume_point_before_a_new_stores_first_frame_is_not_live_only(tmp_path):
    """A stream ended for not reading is told to resume after the cursor before
    the first frame it was due; after_cursor = 0 means "live only", so the very
    first frame a store writes is not cursor 1, and resuming before it replays it."""
    with Sidecar(tmp_path / "data", config=PROFILES, workers=1) as s:
        platform = uniq("first")
        first = run(s.prompts(), prompt_req(text="the first words", source=c.SessionSource(
            platform=platform, chat_id="a")))
        assert_well_formed(first)
        resume_at = first.frames[0].cursor - 1
        assert resume_at > 0, [f.cursor for f in first.frames]
        w = Watcher(s.prompts(), platform=platform, after_cursor=resume_at)
        try:
            assert ident(w.frames_of(first.frames[0].request_id, timeout=3)) == ident(first.frames)
        finally:
            w.close()


def test_duplicate_of_a_failed_turn_replays_its_failure(sc):
    stub = sc.prompts()
    req = prompt_req(text=WORDS, profile="slow")
    answers = []

    def on_frame(f):
        if kind_of(f) == "started":
            answers.append(stub.Cancel(ppb.CancelRequest(request_id=f.request_id), timeout=10))
        return False
    out = collect(stub.Prompt(req, timeout=30), stop=on_frame)
    assert answers[0].cancelled
    assert_failed(out, "CANCELLED", grpc.StatusCode.CANCELLED)
    again = run(stub, req)
    assert_failed(again, "CANCELLED", grpc.StatusCode.CANCELLED)
    assert ident(again.frames) == ident(out.frames)


# -- workers ------------------------------------------------------------------------------


def test_workers_are_spawned_children_without_grpc(sc):
    workers = wait_until(lambda: (lambda ch: ch if len(ch) == 2 else None)(
        {n: p for n, p in children(sc).items() if n.startswith("sidecar-work-")}), what="two workers")
    assert sorted(workers) == ["sidecar-work-0", "sidecar-work-1"]
    assert not any(grpc_loaded(pid) for pid in workers.values())
    pids = set(workers.values())
    assert len(pids) == 2 and sc.proc.pid not in pids
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            assert int(f.read().rsplit(")", 1)[1].split()[1]) == sc.proc.pid  # ppid
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            assert b"grpc" not in f.read()


def test_sessions_spread_over_workers_and_stay_on_theirs(sc):
    """Each session is seeded with history, so its first turn on a worker has
    to rebuild the agent from the store (logged with the worker's index); the
    second turn must hit that worker's warm agent: no second rebuild."""
    stub, sessions = sc.prompts(), sc.sessions()
    keys = []
    for _ in range(20):
        s = sessions.SeedSession(spb.SeedSessionRequest(
            source=c.SessionSource(platform="telegram", chat_id=uniq("w")),
            messages=turns("earlier question", "earlier answer")), timeout=10).session
        keys.append(s.session_key)
    for turn in (1, 2):
        for key in keys:
            assert_well_formed(run(stub, prompt_req(text=f"turn {turn}", session_key=key)))
    rebuilt: dict[str, list[int]] = {k: [] for k in keys}
    # Where an agent is rebuilt is invisible through the API by design (the warm cache
    # only saves work), so the rebuild's log line is what this test checks.
    for ln in log_lines(sc):
        if ln.get("msg") == "agent rebuilt from store" and ln.get("key") in rebuilt:
            rebuilt[ln["key"]].append(ln["worker"])
    for key in keys:
        assert rebuilt[key] == [rendezvous(key, 2)], (key, rebuilt[key])
        assert get_session(sc.sessions(), key).turn_count == 2
    assert {rendezvous(k, 2) for k in keys} == {0, 1}


def test_a_silent_turn_sends_keepalives_that_are_not_persisted(tmp_path):
    """docs/semantics.md: a long silent turn sends keepalives. They repeat the last seq and
    never reach the store (a replay has none)."""
    from sidecar_proc import Sidecar
    cfg = ('[sidecar]\nkeepalive_s = 0.2\n'
           '[profiles.quiet]\nmodel = "scripted"\n'
           'model_options = { steps = [ { sleep_ms = 1200, text = "done" } ] }\n')
    sc = Sidecar(tmp_path / "data", config=cfg).start()
    try:
        req = ppb.PromptRequest(request_id="quiet-1", text="hi", profile="quiet",
                                source=c.SessionSource(platform="t", chat_id="quiet"))
        live = [(r.frame.seq, r.frame.WhichOneof("event")) for r in sc.prompts().Prompt(req, timeout=30)]
        keepalives = [seq for seq, kind in live if kind == "keepalive"]
        assert len(keepalives) >= 3, live
        assert all(seq == 2 for seq in keepalives), live  # the last seq before them: started
        replay = [r.frame.WhichOneof("event") for r in
                  sc.prompts().WatchActivity(ppb.WatchActivityRequest(request_id="quiet-1"), timeout=30)]
        assert "keepalive" not in replay and replay[-1] == "completed", replay
    finally:
        sc.stop()

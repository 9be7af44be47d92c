"""Recovery through real processes and real signals (issue 5, seed 001 §7,
DECISIONS.md "Recovery"): SIGTERM with turns in flight (drain in time → marker,
nothing marked; drain timeout → marker still written, `shutdown_timeout` and auto-resume), startup after
`kill -9` (recent sessions marked, suspended ones not, interrupted turns failed
with `restart_interrupted`, queued prompts run once in order), the stuck-loop
escalation, dangling tool calls, and retention of frames and ledger rows."""

from __future__ import annotations

import contextlib
import json
import os
import signal

import grpc
import pytest
from helpers.config import echo, scripted, table
from helpers.ids import source, words
from helpers.procs import worker_pid
from helpers.recovery import RESUMED_MS, health, marker, restart
from helpers.sessions import get_session, transcript
from helpers.store import StoreView, raw_sql
from helpers.streams import D, PromptRun, Stream, Watcher, kind_of, run, watch
from helpers.tools import ToolHost
from helpers.waiting import wait_until
from sidecar_proc import Sidecar

from agent_sidecar.v1 import prompt_service_pb2 as ppb
from agent_sidecar.v1 import session_service_pb2 as spb

QUEUE = D.Value("DELIVERY_MODE_QUEUE")


def test_sigterm_drain_in_time_writes_marker_and_marks_nothing(tmp_path):
    sc = Sidecar(tmp_path / "data", config=echo("slow", 100)).start()
    try:
        # A platform watch open across the stop: it sees the drained turns end,
        # then ends with the sidecar's own status, not gRPC's cancel of the call.
        watching = Stream(sc.prompts().WatchActivity(ppb.WatchActivityRequest(platform="telegram"), timeout=60))
        runs = [PromptRun(sc.prompts(), text=words(15, f"d{i}"), src=source(), profile="slow")
                for i in range(3)]
        for r in runs:
            r.wait_for("started")
        sc.proc.send_signal(15)
        wait_until(lambda: health(sc.target, 0.5) == "NOT_SERVING", 5, 0.01,
                   "health NOT_SERVING while draining")
        late = PromptRun(sc.prompts(), text="too late", src=source(), profile="slow", timeout=10)
        late.done.wait(10)
        assert late.code == grpc.StatusCode.UNAVAILABLE, (late.code, late.kinds())
        assert sc.proc.poll() is None, "still draining when the late prompt was refused"
        assert sc.proc.wait(30) == 0, sc.log()
        for r in runs:
            r.done.wait(5)
            assert r.kinds()[-1] == "completed", (r.kinds(), r.error)
        assert marker(sc), "drain finished in time: .clean_shutdown must be written"
        watching.result(10)
        assert {f.request_id for f in watching.frames if kind_of(f) == "completed"} >= {r.request_id for r in runs}
        assert (watching.code, watching.reason) == (grpc.StatusCode.UNAVAILABLE, "UNAVAILABLE"), watching.details
        store = StoreView(sc)
        assert [e.session_key for e in store.entries() if e.running or e.resume_pending] == []
        keys = [r.key for r in runs]
        restart(sc)  # its restore has marked and submitted all it was to
        assert not marker(sc), "the marker is consumed at startup"
        for key in keys:
            s = get_session(sc.sessions(), key)
            assert not s.resume_pending and not s.suspended, (key, s.resume_reason)
        assert store.request_ids("resume:") == []
        assert store.restart_counts() == 0
    finally:
        sc.stop()


@pytest.mark.parametrize("group", [False, True], ids=["to_the_sidecar", "to_its_process_group"])
def test_sighup_drains_and_stops_as_sigterm_does(tmp_path, group):
    """A closed terminal or an operator's ``kill -HUP``: its default action
    killed the sidecar mid-turn (exit status 129, the turn cut off, no
    marker). It stops cleanly now, the turn in flight drained. A terminal's
    hangup reaches the whole process group, the store writer and workers
    too: killed by the signal's default action, they used to end the drain
    (the turn cut off, exit 1, no marker)."""
    sc = Sidecar(tmp_path / "data", config=echo("slow", 100), workers=1,
                 wrapper=["setsid"] if group else None).start()  # its own process group, as under a terminal
    try:
        run = PromptRun(sc.prompts(), text=words(15), src=source(), profile="slow")
        run.wait_for("started")
        if group:
            os.killpg(sc.proc.pid, signal.SIGHUP)
        else:
            sc.proc.send_signal(signal.SIGHUP)
        assert sc.proc.wait(30) == 0, sc.log()
        run.done.wait(5)
        assert run.kinds()[-1] == "completed", (run.kinds(), run.error)
        assert marker(sc), "a clean stop writes the marker"
    finally:
        sc.stop()


def test_clean_restart_with_queued_prompt_runs_it_without_resume(tmp_path):
    sc = Sidecar(tmp_path / "data", config=echo("slow", 100), workers=1).start()
    try:
        run = PromptRun(sc.prompts(), text=words(10), src=source(), profile="slow")
        run.wait_for("started")
        queued = PromptRun(sc.prompts(), text="stays queued", key=run.key, delivery=QUEUE)
        queued.wait_for("accepted")
        assert sc.stop() == 0 and marker(sc)
        assert run.kinds()[-1] == "completed"
        # Its call ends saying the sidecar stops (it was cut with no ErrorInfo).
        assert (queued.result(10).code, queued.reason) == (grpc.StatusCode.UNAVAILABLE, "UNAVAILABLE"), (
            queued.code, queued.details)
        store = StoreView(sc)
        assert store.status(queued.request_id) == "queued"
        restart(sc)
        w = watch(sc.prompts(), request_id=queued.request_id, timeout=20)
        frames, reason = w.frames, w.reason
        assert [kind_of(f) for f in frames][-1] == "completed", ([kind_of(f) for f in frames], reason)
        assert [kind_of(f) for f in frames].count("started") == 1 and store.user_rows(queued.request_id) == 1
        s = get_session(sc.sessions(), run.key)  # marked at the restore, before the queued prompt ran
        assert not s.resume_pending and s.last_resume_marked_at.seconds == 0, s.resume_reason
        assert store.resume_turns(run.session_id) == [], "nothing was interrupted: no resume turn"
    finally:
        sc.stop()


def test_a_queued_prompt_whose_profile_left_the_config_runs_with_mains_after_the_restart(tmp_path):
    """Acknowledged, it runs rather than being dropped: with ``main``'s model
    (echo here, where its own profile answered a fixed text), while a new
    prompt naming the profile is refused (docs/semantics.md, Recovery)."""
    gone = scripted("gone", [{"text": "one two three four five six", "token_latency_ms": 300}])
    sc = Sidecar(tmp_path / "data", config=echo("main") + gone, workers=1).start()
    try:
        running = PromptRun(sc.prompts(), text="first", src=source(), profile="gone")
        running.wait_for("started")
        queued = PromptRun(sc.prompts(), text="stays queued", key=running.key, delivery=QUEUE)
        queued.wait_for("accepted")
        assert sc.stop() == 0
        assert running.result(10).end == "completed" and running.final_text == "one two three four five six"
        sc.config_text = echo("main")
        restart(sc)
        w = watch(sc.prompts(), request_id=queued.request_id, timeout=20)
        assert w.kinds()[-1] == "completed" and w.frames[-1].completed.final_text == "stays queued", w.kinds()
        refused = run(sc.prompts(), text="new", key=running.key, profile="gone")
        assert (refused.code, refused.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"), (
            refused.code, refused.details)
    finally:
        sc.stop()


def test_sigterm_drain_timeout_marks_shutdown_timeout_and_resumes(tmp_path):
    cfg = table("sidecar", drain_timeout=1) + echo("slow", RESUMED_MS)
    sc = Sidecar(tmp_path / "data", config=cfg).start()
    try:
        src = source(platform="discord")
        long = PromptRun(sc.prompts(), text=words(150), src=src, profile="slow")  # 6 s: past the drain
        long.wait_for("text_delta")
        key, sid = long.key, long.session_id
        assert sc.stop() == 0, sc.log()
        assert marker(sc), "a graceful stop writes .clean_shutdown even when its drain timed out"
        store = StoreView(sc)
        row = store.entry(key)
        assert (row.resume_pending, row.resume_reason) == (True, "shutdown_timeout"), row
        cursor = store.last_cursor("discord")
        restart(sc)
        watcher = Watcher(sc.prompts(), platform="discord", after_cursor=cursor)
        try:
            rid = f"resume:{sid}:1"
            w = watch(sc.prompts(), request_id=rid, timeout=30)
            frames, reason = w.frames, w.reason
            kinds = [kind_of(f) for f in frames]
            assert kinds[0] == "accepted" and kinds[-1] == "completed", (kinds, reason)
            assert "shutdown_timeout" in frames[-1].completed.final_text
            assert [e.request_id for e in store.resume_turns(sid)] == [rid]
            s = wait_until(lambda: (lambda s: s if not s.resume_pending else None)(get_session(sc.sessions(), key)),
                           10, what="resume_pending cleared after the resume turn completed")
            assert s.resume_reason == "" and s.session_id == sid
            # the interrupted turn itself is closed, once
            w = watch(sc.prompts(), request_id=long.request_id, timeout=20)
            frames, reason = w.frames, w.reason
            assert [kind_of(f) for f in frames].count("failed") == 1 and kind_of(frames[-1]) == "failed"
            assert [kind_of(f) for f in frames].count("started") == 1 and store.user_rows(long.request_id) == 1
            # an adapter watching its platform from its last cursor gets the resume turn
            wait_until(lambda: any(f.request_id == rid and kind_of(f) == "completed" for f in watcher.frames),
                       10, what="the resume turn's frames through WatchActivity(platform)")
            assert watcher.request_ids("resume:") == [rid]
            got = [kind_of(f) for f in watcher.frames if f.request_id == rid]
            assert got[0] == "accepted" and got[1] == "started" and got.count("completed") == 1, got
        finally:
            watcher.close()
    finally:
        sc.stop()


def test_drain_timeout_turn_ends_with_a_recovery_reason(tmp_path):
    sc = Sidecar(tmp_path / "data", config=table("sidecar", drain_timeout=1) + echo("slow", 100)).start()
    try:
        long = PromptRun(sc.prompts(), text=words(60), src=source(), profile="slow")
        long.wait_for("text_delta")
        assert sc.stop() == 0
        e = StoreView(sc).ledger(long.request_id)
        row = (e.status, e.reason)
        assert row in (("running", None), ("failed", "shutdown_timeout"),
                       ("failed", "restart_interrupted")), row
        restart(sc)
        frames = watch(sc.prompts(), request_id=long.request_id, timeout=20).frames
        assert frames[-1].failed.reason in ("shutdown_timeout", "restart_interrupted"), \
            frames[-1].failed.reason
    finally:
        sc.stop()


def test_startup_after_kill9_marks_fails_and_runs_queue(tmp_path):
    cfg = echo("slow", RESUMED_MS) + echo("idle", 150)
    sc = Sidecar(tmp_path / "data", config=cfg).start()
    try:
        recent = PromptRun(sc.prompts(), text="hello there", src=source(), profile="idle")
        recent.done.wait(10)
        gone = PromptRun(sc.prompts(), text="hi", src=source(), profile="idle")
        gone.done.wait(10)
        sc.sessions().SuspendSession(spb.SuspendSessionRequest(session_key=gone.key), timeout=10)
        busy = PromptRun(sc.prompts(), text=words(100), src=source(), profile="slow")
        busy.wait_for("text_delta")
        queued = []
        for i in range(4):  # one after another: the queue's order is the order of acceptance
            queued.append(PromptRun(sc.prompts(), text=f"queued number {i}", key=busy.key, delivery=QUEUE))
            queued[-1].wait_for("accepted")
        sc.kill9()
        store = StoreView(sc)
        assert store.entry(busy.key).running
        restart(sc)
        # a recently active idle session is marked (it keeps its id) but not resumed:
        # its turn had completed, nothing was interrupted (DECISIONS.md "Recovery")
        s = get_session(sc.sessions(), recent.key)
        assert s.resume_pending and s.resume_reason == "restart_interrupted", s
        assert s.session_id == recent.session_id and s.last_resume_marked_at.seconds > 0
        assert store.resume_turns(recent.session_id) == []
        # the suspended one is not
        s = get_session(sc.sessions(), gone.key)
        assert s.suspended and not s.resume_pending, (s.suspended, s.resume_pending, s.resume_reason)
        assert store.resume_turns(gone.session_id) == []
        # the interrupted turn failed with restart_interrupted
        w = watch(sc.prompts(), request_id=busy.request_id, timeout=20)
        frames, reason = w.frames, w.reason
        assert kind_of(frames[-1]) == "failed" and frames[-1].failed.reason == "restart_interrupted", \
            ([kind_of(f) for f in frames], reason)
        assert reason == "restart_interrupted"
        # the queue ran after the restart, in order, exactly once
        cursors = []
        for q in queued:
            w = watch(sc.prompts(), request_id=q.request_id, timeout=30)
            frames, reason = w.frames, w.reason
            kinds = [kind_of(f) for f in frames]
            assert kinds.count("started") == 1 and kinds[-1] == "completed", (q.request_id, kinds, reason)
            assert frames[-1].completed.final_text == f"queued number {len(cursors)}"
            cursors.append(frames[-1].cursor)
            assert store.user_rows(q.request_id) == 1
        assert cursors == sorted(cursors), cursors
        msgs = [m.content for m in transcript(sc.sessions(), busy.session_id, include_rewound=True) if m.role == "user"]
        assert [m for m in msgs if m.startswith("queued")] == [f"queued number {i}" for i in range(4)]
        resumes = store.resume_turns(busy.session_id)
        assert len(resumes) == 1 and "restart_interrupted" in resumes[0].text, resumes
    finally:
        sc.stop()


def test_prompt_acknowledged_survives_kill9(tmp_path):
    """Kill -9 the instant the `accepted` frame arrives. On an idle lane the
    accept job commits the turn's start in the same transaction, so the store
    never holds an acknowledged-but-unstarted turn for it. After the restart the
    turn has exactly one terminal frame: `completed` when the echo's end had
    committed before the kill landed, else failed `restart_interrupted` (then
    resumed); its user message is in the transcript exactly once. Which of the
    two is read after the restart: the store writer dies of its parent-death
    signal a moment after the parent, so a read right after the kill may miss
    a commit that then lands."""
    sc = Sidecar(tmp_path / "data", config=echo("main"), workers=1).start()
    try:
        src = source()
        warm = PromptRun(sc.prompts(), text="warm up", src=src)
        warm.done.wait(10)
        rid = "acked-then-killed"
        call = sc.prompts().Prompt(ppb.PromptRequest(request_id=rid, text="please remember me",
                                                     source=src), timeout=10)
        for resp in call:  # kill the instant the acknowledgement arrives
            if kind_of(resp.frame) == "accepted":
                sc.proc.send_signal(signal.SIGKILL)
                break
        sc.kill9()
        store = StoreView(sc)
        assert store.ledger(rid).started_at is not None, "acknowledged on an idle lane means started"
        assert store.user_rows(rid) == 1
        restart(sc)
        wait_until(lambda: store.open_prompts() == [], 15, what="every turn ended after the restart")
        kinds = store.kinds(rid)
        ends = [k for k in kinds if k in ("completed", "failed", "superseded")]
        assert len(ends) == 1 and kinds[-1] == ends[0], kinds
        ended = store.ledger(rid)
        assert ended.status == ends[0], (ended.status, kinds)
        if ends[0] == "failed":
            w = watch(sc.prompts(), request_id=rid, timeout=20)
            assert w.reason == "restart_interrupted", [kind_of(f) for f in w.frames]
        rows = transcript(sc.sessions(), warm.session_id, include_rewound=True)
        users = [m.content for m in rows if m.role == "user"]
        assert users.count("please remember me") == 1, users
        assert store.user_rows(rid) == 1
    finally:
        sc.stop()


def test_stuck_loop_is_suspended_on_third_restart(tmp_path):
    cfg = scripted("boom", [{"text": "going down", "kill": "sidecar", "repeat": True}])
    sc = Sidecar(tmp_path / "data", config=cfg, workers=1).start()
    try:
        first = PromptRun(sc.prompts(), text="crash please", src=source(), profile="boom")
        assert sc.proc.wait(20) == -9, "the scripted step must SIGKILL the sidecar"
        key, sid = first.frames[0].session_key, first.frames[0].session_id
        store = StoreView(sc)
        for n in (1, 2):
            try:  # restart n: the auto-resume turn kills it again, maybe before we see SERVING
                sc.start()
            except RuntimeError:
                pass
            assert sc.proc.wait(20) == -9, f"restart {n}: the resume turn should have killed it"
            assert [e.request_id for e in store.resume_turns(sid)] == [f"resume:{sid}:{i}" for i in range(1, n + 1)]
            assert store.restart_count(key) == n
        restart(sc)  # restart 3: suspended, not resumed (its restore submitted no turn)
        s = get_session(sc.sessions(), key)
        assert s.suspended and not s.resume_pending, (s.suspended, s.resume_pending, s.resume_reason)
        # No third resume turn in the ledger: nothing is left to run that kills it.
        assert [e.request_id for e in store.resume_turns(sid)] == [f"resume:{sid}:1", f"resume:{sid}:2"]
        assert sc.proc.poll() is None, "the sidecar must stay up once the loop is suspended"
        assert health(sc.target) == "SERVING"
        assert [(e.status, e.reason) for e in map(store.ledger, store.request_ids("resume:"))] == \
            [("failed", "restart_interrupted")] * 2
    finally:
        sc.stop()


def test_dangling_tool_call_gets_synthetic_result(tmp_path):
    steps = [{"tool_calls": [{"name": "test.wait", "arguments": {}}]},
             {"text_from_last_tool_result": True}]
    sc = Sidecar(tmp_path / "data", config=scripted("tw", steps, tools=["test.*"]), workers=1).start()
    try:
        host = ToolHost(sc.tools(), "test", [("test.wait", "test.wait", {"type": "object"})]).wait_registered()
        p = PromptRun(sc.prompts(), text="wait for it", src=source(), profile="tw")
        call = p.wait_for("tool_call").tool_call
        assert host.on_invocation.wait(10)
        sc.kill9()
        host.cancel()
        restart(sc)
        rows = StoreView(sc).turn_rows(p.request_id)
        assert [r.role for r in rows] == ["user", "assistant", "tool"], rows
        msgs = transcript(sc.sessions(), p.session_id, include_rewound=True)
        assert [m.role for m in msgs[:3]] == ["user", "assistant", "tool"]
        assert [c["id"] for c in json.loads(msgs[1].tool_calls_json)] == [call.call_id]
        assert msgs[2].tool_call_id == call.call_id and msgs[2].tool_name == "test.wait"
        assert "error" in json.loads(msgs[2].content), msgs[2].content
        w = watch(sc.prompts(), request_id=p.request_id, timeout=20)
        frames, reason = w.frames, w.reason
        assert frames[-1].failed.reason == "restart_interrupted", reason
        # the next turn (the auto-resume) sees a valid history and completes
        rid = f"resume:{p.session_id}:1"
        w = watch(sc.prompts(), request_id=rid, timeout=30)
        frames, reason = w.frames, w.reason
        assert kind_of(frames[-1]) == "completed", ([kind_of(f) for f in frames], reason)
        msgs = transcript(sc.sessions(), p.session_id, include_rewound=True)
        for i, m in enumerate(msgs):  # every tool call answered, right after it
            if m.role == "assistant" and m.tool_calls_json:
                ids = [c["id"] for c in json.loads(m.tool_calls_json)]
                following = msgs[i + 1:i + 1 + len(ids)]
                assert [f.role for f in following] == ["tool"] * len(ids), [(x.role, x.content) for x in msgs]
                assert sorted(f.tool_call_id for f in following) == sorted(ids)
        assert msgs[-1].role == "assistant" and msgs[-1].content
    finally:
        sc.stop()


def pruned(store, key, ids) -> bool:
    """No ledger row and no frame of these requests is left (their lane's other frames may be)."""
    return (all(store.ledger(r) is None for r in ids)
            and not [f for f in store.frames_after(session_key=key) if f.request_id in ids])


def test_retention_with_fractional_days(tmp_path):
    cfg = table("sidecar", retention_days=0.00001, dedup_window_s=0.5, housekeeping_interval_s=0.5) + echo("main")
    sc = Sidecar(tmp_path / "data", config=cfg).start()
    try:
        src = source()
        rids = []
        for i in range(3):
            rids.append(PromptRun(sc.prompts(), text=f"turn {i}", src=src))
            rids[-1].done.wait(10)
        ids = tuple(p.request_id for p in rids)
        sid, key = rids[0].session_id, rids[0].key
        store = StoreView(sc)
        before = store.transcript(sid, include_rewound=True)
        assert len(before) == 6
        wait_until(lambda: pruned(store, key, ids), 8, 0.2, "old frames and ledger rows pruned")
        assert store.transcript(sid, include_rewound=True) == before
    finally:
        sc.stop()


def test_retention_prunes_old_frames_and_ledger_not_transcripts(tmp_path):
    """Default retention (7 days) against rows backdated 8 days while the sidecar is
    stopped; the housekeeping timer prunes them, never a transcript row."""
    sc = Sidecar(tmp_path / "data", config=table("sidecar", housekeeping_interval_s=1)).start()
    try:
        src = source()
        old = []
        for i in range(3):
            old.append(PromptRun(sc.prompts(), text=f"old turn {i}", src=src))
            old[-1].done.wait(10)
            assert old[-1].kinds()[-1] == "completed"
        sid, key = old[0].session_id, old[0].key
        assert sc.stop() == 0
        ids = tuple(p.request_id for p in old)
        age = 8 * 86400
        # Setup, not an oracle: no API makes rows old, so they are backdated in the
        # stopped sidecar's store; what retention then did is read through the interface.
        with raw_sql(sc) as conn:
            conn.execute("UPDATE frames SET at = at - ? WHERE request_id IN (?, ?, ?)", (age, *ids))
            conn.execute("UPDATE prompts SET created_at = created_at - ?, finished_at = finished_at - ?"
                         " WHERE request_id IN (?, ?, ?)", (age, age, *ids))
            conn.execute("UPDATE messages SET created_at = created_at - ? WHERE session_id = ?", (age, sid))
        store = StoreView(sc)
        before = store.transcript(sid, include_rewound=True)
        assert len(before) == 6
        restart(sc)
        new = PromptRun(sc.prompts(), text="new turn", src=src)
        new.done.wait(10)
        wait_until(lambda: pruned(store, key, ids), 10, 0.2, "frames and ledger rows older than the retention pruned")
        assert store.transcript(sid, include_rewound=True)[:6] == before
        assert [m.content for m in transcript(sc.sessions(), sid, include_rewound=True) if m.role == "user"] == \
            ["old turn 0", "old turn 1", "old turn 2", "new turn"]
        assert store.status(new.request_id) == "completed"
        assert len(watch(sc.prompts(), request_id=new.request_id).frames) >= 4
        assert get_session(sc.sessions(), key).turn_count == 4
    finally:
        sc.stop()


def test_a_user_interrupt_waiting_at_a_crash_runs_as_the_users_and_no_continue_turn_takes_it(tmp_path):
    """A turn is running (its worker stopped), the user's INTERRUPT for it is
    acknowledged, the sidecar is killed. After the restart the continue turn,
    an INTERRUPT itself, took the user's prompt over: it ended superseded by
    the continue turn, and its text was stored as the system's (synthetic).
    Now the user's prompt runs as it was sent, and there is no continue turn:
    the user had asked the cut-off turn to stop."""
    sc = Sidecar(tmp_path / "data", config=echo("main", 100), workers=1).start()
    try:
        running = PromptRun(sc.prompts(), text=words(200), src=source("discord"))
        running.wait_for("text_delta")
        stopped = worker_pid(sc, 0)
        os.kill(stopped, signal.SIGSTOP)
        interrupt = PromptRun(sc.prompts(), text="stop and read this", key=running.key,
                              delivery=ppb.DELIVERY_MODE_INTERRUPT)
        interrupt.wait_for("accepted")
        sc.kill9()
        with contextlib.suppress(ProcessLookupError):
            os.kill(stopped, signal.SIGKILL)
        restart(sc)
        out = watch(sc.prompts(), request_id=interrupt.request_id, timeout=30)
        assert out.kinds()[-1] == "completed", out.kinds()
        mine = [m for m in transcript(sc.sessions(), running.session_id)
                if m.role == "user" and m.content == "stop and read this"]
        assert [m.synthetic for m in mine] == [False]  # the user's, as sent (the echo's reply aside)
        assert StoreView(sc).resume_turns(running.session_id) == []
    finally:
        sc.stop()


"""Recovery decisions at their edges (seed 001 §7, DECISIONS.md "Recovery"),
through real processes, SIGTERM and kill -9: the clean-shutdown marker after a
drain that timed out, the stuck-loop counter counting only consecutive
restarts with the lane in flight, a suspended lane's waiting prompts, the
auto-resume freshness window, resume request ids after retention, a steer
whose host was interrupted, and a follow-up burst acknowledged just before the kill."""

from __future__ import annotations

import signal
import time

from helpers.config import echo, scripted, table
from helpers.ids import source, words
from helpers.recovery import RESUMED_MS, health, marker, restart
from helpers.sessions import get_session, transcript
from helpers.store import StoreView, local_store
from helpers.streams import D, PromptRun, get_queue, kind_of, watch
from helpers.tools import ToolHost
from helpers.waiting import wait_until
from sidecar_proc import Sidecar

from agent_sidecar.store.records import LedgerEntry
from agent_sidecar.v1 import session_service_pb2 as spb

QUEUE = D.Value("DELIVERY_MODE_QUEUE")
NO_AUTO_RESUME = "[agent]\ngateway_auto_continue_freshness = 0.001\n\n"


def crash_mid_turn(sc, src) -> PromptRun:
    """kill -9 with a turn of this source's lane running."""
    run = PromptRun(sc.prompts(), text=words(80), src=src)
    run.wait_for("started")
    sc.kill9()
    return run


def restart_count(sc, key: str) -> int:
    return StoreView(sc).restart_count(key)


def lane(sc, key: str):
    return get_session(sc.sessions(), key)


def test_drain_timeout_still_writes_the_marker_and_leaves_idle_lanes_alone(tmp_path):
    """A graceful stop whose drain timed out is still graceful: the marker is
    written, the cut-off lane is marked shutdown_timeout, and a lane whose turn
    had completed is neither marked nor resumed at the next start."""
    sc = Sidecar(tmp_path / "data", config=echo("main", RESUMED_MS) + table("sidecar", drain_timeout=1),
                 workers=1).start()
    try:
        idle = PromptRun(sc.prompts(), text="hi", src=source()).result(30)
        assert idle.end == "completed", idle.kinds()
        busy = PromptRun(sc.prompts(), text=words(100), src=source())  # 5 s: past the 1 s drain
        busy.wait_for("started")
        assert sc.stop() == 0, sc.log()
        assert marker(sc), "a graceful stop writes .clean_shutdown, drained in time or not"
        restart(sc)
        b = lane(sc, busy.key)
        assert (b.resume_pending, b.resume_reason) == (True, "shutdown_timeout"), b
        i = lane(sc, idle.key)
        assert (i.resume_pending, i.resume_reason) == (False, ""), i
        assert StoreView(sc).resume_turns(idle.session_id) == []
        frames = watch(sc.prompts(), request_id=f"resume:{busy.session_id}:1", timeout=30).frames
        assert kind_of(frames[-1]) == "completed", [kind_of(f) for f in frames]
    finally:
        sc.stop()


def test_a_second_stop_signal_cuts_the_drain_short_and_the_turn_is_resumed(tmp_path):
    """An operator's second Ctrl-C (or SIGTERM) during a long drain: the
    sidecar stops now, not after the turn or the drain timeout (600 s here;
    the turn would take 100 s), and the turn it cut off ends as a drain
    timeout ends it, its lane resumed at the next start."""
    sc = Sidecar(tmp_path / "data", config=echo("main", RESUMED_MS) + table("sidecar", drain_timeout=600),
                 workers=1).start()
    try:
        busy = PromptRun(sc.prompts(), text=words(2000), src=source())
        busy.wait_for("text_delta")
        sc.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: health(sc.target, 0.5) == "NOT_SERVING", what="the drain begun")
        assert sc.proc.poll() is None, "still draining the 100 s turn"
        sc.proc.send_signal(signal.SIGINT)
        assert sc.proc.wait(60) == 0, sc.log()
        assert marker(sc), "a cut drain is still a graceful stop"
        restart(sc)
        b = lane(sc, busy.key)
        assert (b.resume_pending, b.resume_reason) == (True, "shutdown_timeout"), b
        frames = watch(sc.prompts(), request_id=busy.request_id, timeout=20).frames
        assert frames[-1].failed.reason == "shutdown_timeout", [kind_of(f) for f in frames]
        frames = watch(sc.prompts(), request_id=f"resume:{busy.session_id}:1", timeout=30).frames
        assert kind_of(frames[-1]) == "completed", [kind_of(f) for f in frames]
    finally:
        sc.stop()


def test_stuck_loop_counts_only_consecutive_in_flight_restarts(tmp_path):
    """In flight, then a restart with the lane idle, then in flight twice: two
    consecutive, not three, so the lane is not suspended. (Auto-resume is off,
    so no completed resume turn clears the count in between.)"""
    sc = Sidecar(tmp_path / "data", config=echo("main", 200) + NO_AUTO_RESUME, workers=1).start()
    try:
        src = source()
        key = crash_mid_turn(sc, src).key
        restart(sc)
        assert restart_count(sc, key) == 1
        sc.stop()  # a restart at which the lane was idle
        restart(sc)
        assert restart_count(sc, key) == 0, "an idle restart ends the run of consecutive ones"
        for n in (1, 2):
            crash_mid_turn(sc, src)
            restart(sc)
            assert restart_count(sc, key) == n
        assert not lane(sc, key).suspended
        crash_mid_turn(sc, src)
        restart(sc)
        assert lane(sc, key).suspended, "the third consecutive one suspends"
    finally:
        sc.stop()


def test_reset_starts_the_stuck_loop_count_again(tmp_path):
    sc = Sidecar(tmp_path / "data", config=echo("main", 200) + NO_AUTO_RESUME, workers=1).start()
    try:
        src = source()
        for n in (1, 2):
            key = crash_mid_turn(sc, src).key
            restart(sc)
            assert restart_count(sc, key) == n
        sc.sessions().ResetSession(spb.ResetSessionRequest(session_key=key), timeout=10)
        assert restart_count(sc, key) == 0, "/new starts a conversation with no restarts against it"
        crash_mid_turn(sc, src)
        restart(sc)
        assert restart_count(sc, key) == 1 and not lane(sc, key).suspended
    finally:
        sc.stop()


def test_stuck_loop_suspension_supersedes_the_lanes_waiting_prompts(tmp_path):
    """As SuspendSession does: a prompt queued on a lane the restart suspends
    ends superseded; it never runs on the abandoned incarnation."""
    sc = Sidecar(tmp_path / "data", config=echo("main", 200) + NO_AUTO_RESUME, workers=1).start()
    try:
        src = source()
        for _ in range(2):
            run = crash_mid_turn(sc, src)
            restart(sc)
        old_sid, key = run.session_id, run.key
        third = PromptRun(sc.prompts(), text=words(80), key=key)
        third.wait_for("started")
        queued = PromptRun(sc.prompts(), text="queued behind", key=key, delivery=QUEUE)
        queued.wait_for("accepted")
        sc.kill9()
        restart(sc)
        assert lane(sc, key).suspended
        frames = watch(sc.prompts(), request_id=queued.request_id, timeout=20).frames
        assert [kind_of(f) for f in frames] == ["accepted", "superseded"], [kind_of(f) for f in frames]
        assert [f.seq for f in frames] == [1, 2]
        store = StoreView(sc)
        assert store.status(queued.request_id) == "superseded"
        waiting = get_queue(sc.prompts(), key)
        assert not waiting.HasField("pending") and list(waiting.queued) == [], waiting
        assert store.open_prompts() == []
        old = transcript(sc.sessions(), old_sid, include_rewound=True)
        assert [m.content for m in old].count("queued behind") == 0
    finally:
        sc.stop()


def test_synthetic_tool_results_do_not_make_a_stale_lane_fresh(tmp_path):
    """Two lanes in flight at a kill -9, the restart after the freshness
    window: neither resumes, though one had a dangling tool call whose
    synthetic result is written at startup."""
    steps = [{"tool_calls": [{"name": "test.wait", "arguments": {}}]},
             {"text_from_last_tool_result": True}]
    cfg = (scripted("tw", steps, tools=["test.*"]) + echo("main", 200)
           + "[agent]\ngateway_auto_continue_freshness = 2.0\n\n")
    sc = Sidecar(tmp_path / "data", config=cfg, workers=1).start()
    try:
        host = ToolHost(sc.tools(), "test", [("test.wait", "test.wait", {"type": "object"})]).wait_registered()
        a = PromptRun(sc.prompts(), text="wait for it", src=source(), profile="tw")
        a.wait_for("tool_call")
        assert host.on_invocation.wait(10)
        b = PromptRun(sc.prompts(), text=words(80), src=source())
        b.wait_for("started")
        sc.kill9()
        host.cancel()
        time.sleep(3)  # past the 2 s freshness window
        restart(sc)
        store = StoreView(sc)
        assert store.resume_turns(a.session_id) == [] and store.resume_turns(b.session_id) == []
        roles = [m.role for m in transcript(sc.sessions(), a.session_id, include_rewound=True)]
        assert roles.count("tool") == 1, "the dangling call got its synthetic result"
    finally:
        sc.stop()


def test_resume_request_id_follows_the_highest_one_left(tmp_path):
    """Retention dropped resume:{sid}:1 and kept :2: the next resume turn is :3
    (a count would hand out :2 again, and dedup would swallow the turn)."""
    sc = Sidecar(tmp_path / "data", config=echo("main", RESUMED_MS), workers=1).start()
    try:
        run = crash_mid_turn(sc, source())
        sid, key = run.session_id, run.key
        with local_store(sc) as s:  # what retention left: :2 (the stopped sidecar's store)
            assert s.job(lambda uow: uow.ledger.insert(LedgerEntry(
                request_id=f"resume:{sid}:2", session_key=key, session_id=sid, platform="telegram",
                status="completed", delivery=2, text="continue", created_at=time.time())))
        restart(sc)
        frames = watch(sc.prompts(), request_id=f"resume:{sid}:3", timeout=30).frames
        assert frames and kind_of(frames[-1]) == "completed", [kind_of(f) for f in frames]
        wait_until(lambda: not lane(sc, key).resume_pending, 10, what="resume_pending cleared")
    finally:
        sc.stop()


def test_a_steer_ends_with_its_interrupted_host_and_never_reruns(tmp_path):
    """kill -9 while a steer has joined the running turn: at the restart the
    steer ends failed with its host; it does not run again as a turn of its own."""
    cfg = scripted("main", [{"text": "first answer", "token_latency_ms": 500}, {"echo_input": True}])
    sc = Sidecar(tmp_path / "data", config=cfg, workers=1).start()
    try:
        host = PromptRun(sc.prompts(), text="hello", src=source())
        host.wait_for("text_delta")
        steer = PromptRun(sc.prompts(), text="actually, bananas", key=host.key,
                          delivery=D.Value("DELIVERY_MODE_STEER"))
        steer.wait_for("accepted")
        sc.kill9()
        restart(sc)
        w = watch(sc.prompts(), request_id=steer.request_id, timeout=20)
        frames, reason = w.frames, w.reason
        assert [kind_of(f) for f in frames] == ["accepted", "failed"], [kind_of(f) for f in frames]
        assert reason == "restart_interrupted", reason
        resumed = watch(sc.prompts(), request_id=f"resume:{host.session_id}:1", timeout=30)
        assert resumed.kinds()[-1] == "completed", resumed.kinds()  # the lane ran on; the steer did not
        assert watch(sc.prompts(), request_id=steer.request_id).count("started") == 0
        msgs = transcript(sc.sessions(), host.session_id, include_rewound=True)
        assert [m.content for m in msgs].count("actually, bananas") <= 1
    finally:
        sc.stop()


def test_an_acknowledged_burst_runs_once_in_order_after_a_kill9(tmp_path):
    """Three follow-ups on a busy lane, kill -9 right after the third is
    acknowledged: its accept recorded the two texts it absorbed and closed their
    ledger rows in one transaction, so after the restart one turn runs all three,
    in order, exactly once, and the older two stay superseded by the next."""
    cfg = scripted("main", [{"echo_input": True, "token_latency_ms": 100}]) + NO_AUTO_RESUME
    sc = Sidecar(tmp_path / "data", config=cfg, workers=1).start()
    try:
        busy = PromptRun(sc.prompts(), text=words(40), src=source())
        busy.wait_for("started")
        burst = []
        for i in range(3):
            burst.append(PromptRun(sc.prompts(), text=f"part {i}", key=busy.key))
            burst[-1].wait_for("accepted")
        sc.kill9()
        restart(sc)
        last = burst[-1].request_id
        w = watch(sc.prompts(), request_id=last, timeout=30)
        frames, reason = w.frames, w.reason
        kinds = [kind_of(f) for f in frames]
        assert kinds.count("started") == 1 and kinds[-1] == "completed", (kinds, reason)
        # what the model saw since its last answer: the interrupted prompt, then all three
        assert frames[-1].completed.final_text == words(40) + "\npart 0\npart 1\npart 2"
        for older, newer in zip(burst, burst[1:]):
            frames = watch(sc.prompts(), request_id=older.request_id, timeout=20).frames
            assert [kind_of(f) for f in frames] == ["accepted", "superseded"], [kind_of(f) for f in frames]
            assert frames[-1].superseded.by_request_id == newer.request_id
        rows = transcript(sc.sessions(), busy.session_id, include_rewound=True)
        users = [m.content for m in rows if m.role == "user"]
        assert users == [words(40), "part 0", "part 1", "part 2"], users
    finally:
        sc.stop()

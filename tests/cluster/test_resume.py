"""Auto-resume in a cluster (issue 16, DECISIONS.md "Recovery"): a lane taken
from a node that died gets what one sidecar's next start after a crash gives
it. After a clean stop: a node stopped with SIGTERM whose drain timed out on
a running turn marks that lane ``resume_pending`` (``shutdown_timeout``); the lane then
gets its continue turn exactly once, by the recovery rules, on another node
(or on the node itself, restarted alone), as one sidecar's next start gives it.

Real sidecars on one real PostgreSQL database, asserted through gRPC and the
store's typed reads; and, store level, the cluster jobs on the backend's own
unit of work: a lane cut off is taken over once per holder that went away,
never again and again by the reapers when nothing is due.
"""

from __future__ import annotations

import os
import signal
import time
from types import SimpleNamespace

import pytest
from helpers.cluster import Cluster
from helpers.config import echo, table
from helpers.ids import source, uniq, words
from helpers.procs import worker_pid
from helpers.recovery import RESUME_PREFIX, restart
from helpers.sessions import get_session, transcript
from helpers.store import StoreView, local_store
from helpers.streams import QUEUE, PromptRun, kind_of, watch
from helpers.waiting import wait_until

from agent_sidecar.cluster import jobs
from agent_sidecar.recovery.startup import INTERRUPTED, STUCK_LOOP_RESTARTS
from agent_sidecar.sessions import lifecycle as life
from agent_sidecar.sessions.source import SessionSource
from agent_sidecar.store.records import RoutingPatch
from agent_sidecar.turns import jobs as turn_jobs

CUT_OFF = echo("main") + echo("slow", 20) + table("sidecar", drain_timeout=0.5)
# A lease the node keeps through the test machine's load: at the default 2 s
# a node starved of CPU for about a second (two cores shared with other test
# runs) loses its trust in the lease, and its turn ends LANE_MOVED as it must.
# For a test about something else than leases that is noise, not a finding.
STEADY_TTL = 8.0


def _cut_off_by_the_drain(node) -> PromptRun:
    """A slow turn running on ``node``, then ``node`` stopped cleanly with a
    drain too short for it."""
    long = PromptRun(node.prompts(), text=words(400), src=source("discord"), profile="slow")
    long.wait_for("text_delta")
    assert node.stop() == 0, node.log()[-3000:]
    return long


def _assert_resumed_once(node, long: PromptRun) -> None:
    """The lane got one continue turn (run to its end), the cut-off turn is
    closed, and once the lane is let go nothing more runs on it."""
    store = StoreView(node)
    key, sid = long.key, long.session_id
    rid = f"resume:{sid}:1"
    wait_until(lambda: store.status(rid) == "completed", 30, 0.1, f"{rid} run to its end")
    frames = watch(node.prompts(), request_id=rid, timeout=20).frames
    assert [kind_of(f) for f in frames][:2] == ["accepted", "started"] and kind_of(frames[-1]) == "completed"
    assert "shutdown_timeout" in frames[-1].completed.final_text
    assert store.ledger(long.request_id).status == "failed"
    # Free afterwards: its holder let it go once idle; a lane let go is nobody's orphan.
    wait_until(lambda: store.lease_holder(key) is None, 30, 0.2, "the resumed lane let go")
    assert [e.request_id for e in store.resume_turns(sid)] == [rid]
    notes = [m for m in transcript(node.sessions(), sid)
             if m.role == "user" and m.content.startswith(RESUME_PREFIX)]
    assert len(notes) == 1, notes
    assert not get_session(node.sessions(), key).resume_pending  # the completed turn consumed the mark


def test_a_turn_cut_off_by_a_clean_stop_is_resumed_once_on_another_node(tmp_path, cluster_dsn):
    with Cluster(tmp_path, cluster_dsn, n=2, config=CUT_OFF) as cl:
        a, b = cl["a"], cl["b"]
        long = _cut_off_by_the_drain(a)
        _assert_resumed_once(b, long)
        again = PromptRun(b.prompts(), text="still there?", key=long.key, background=False)
        assert again.kinds()[-1] == "completed", (again.kinds(), again.details)


def test_a_node_restarted_alone_resumes_the_turn_its_drain_cut_off(tmp_path, cluster_dsn):
    with Cluster(tmp_path, cluster_dsn, n=1, config=CUT_OFF) as cl:
        a = cl["a"]
        long = _cut_off_by_the_drain(a)
        restart(a)
        _assert_resumed_once(a, long)


def test_a_lane_let_go_idle_after_its_worker_died_gets_no_continue_turn_when_taken_again(tmp_path, cluster_dsn):
    """A dead worker ends its turn failed and marks the lane (worker_crashed);
    its node lets the lane go once idle. Taken again by the user's next
    prompt, it ran a continue turn first (the prompt waited behind it, at
    queue position 1), which one sidecar gives only after a restart."""
    with Cluster(tmp_path, cluster_dsn, n=1, config=CUT_OFF, lease_ttl_s=STEADY_TTL) as cl:
        a = cl["a"]
        store = StoreView(a)
        long = PromptRun(a.prompts(), text=words(400), src=source("discord"), profile="slow")
        long.wait_for("text_delta")
        os.kill(worker_pid(a, 0), signal.SIGKILL)
        assert long.result(30).end == "failed" and long.reason == "WORKER_CRASHED", long.kinds()[-1:]
        assert store.entry(long.key).resume_reason == "worker_crashed"
        wait_until(lambda: store.lease_holder(long.key) is None, 30, 0.2, "the lane let go, idle")
        again = PromptRun(a.prompts(), text="hello again", key=long.key, background=False)
        assert again.end == "completed", again.kinds()
        assert again.frames[0].accepted.queue_position == 0
        assert store.resume_turns(long.session_id) == []


def test_auto_resume_off_runs_no_continue_turn_after_a_clean_stop(tmp_path, cluster_dsn):
    cfg = CUT_OFF + table("recovery", auto_resume="off")
    with Cluster(tmp_path, cluster_dsn, n=1, config=cfg) as cl:
        a = cl["a"]
        long = _cut_off_by_the_drain(a)
        restart(a)  # its restore (before it serves) took the lane back, found nothing due, let it go
        store = StoreView(a)
        assert store.resume_turns(long.session_id) == []
        assert store.lease_holder(long.key) is None
        entry = store.entry(long.key)
        assert (entry.resume_pending, entry.resume_reason) == (True, "shutdown_timeout")  # the mark stays


def test_auto_resume_off_the_other_node_takes_the_lane_and_lets_it_go(tmp_path, cluster_dsn):
    cfg = CUT_OFF + table("recovery", auto_resume="off")
    with Cluster(tmp_path, cluster_dsn, n=2, config=cfg) as cl:
        a, b = cl["a"], cl["b"]
        long = _cut_off_by_the_drain(a)
        store = StoreView(b)
        # a left the lane to run out; b's reaper takes it, finds nothing due, lets it go.
        wait_until(lambda: long.key not in store.lanes_held_by("a") + store.lanes_held_by("b"), 30, 0.2,
                   "the lane taken over and let go")
        assert store.resume_turns(long.session_id) == [] and store.lease_holder(long.key) is None


def test_recent_mode_a_lane_merely_active_on_a_node_that_died_gets_its_continue_turn_on_the_next(
        tmp_path, cluster_dsn):
    # auto_resume = "recent" (hermes' rule): as one sidecar's start after a
    # crash resumes every lane active in the recent window, the node that
    # takes such a lane from a node that died gives it its continue turn.
    cfg = echo("main") + table("recovery", auto_resume="recent")
    with Cluster(tmp_path, cluster_dsn, n=2, config=cfg) as cl:
        a, b = cl["a"], cl["b"]
        done = PromptRun(a.prompts(), text="hello", src=source("telegram"), background=False)
        assert done.kinds()[-1] == "completed", done.kinds()
        a.kill9()  # within a TTL of the turn: a has not let the idle lane go

        def next_prompt_ran() -> bool:  # refused UNAVAILABLE until a's lease runs out
            return PromptRun(b.prompts(), text="still there?", key=done.key, background=False).kinds()[-1:] == [
                "completed"]
        wait_until(next_prompt_ran, 30, 0.2, "the next prompt run on b")
        frames = watch(b.prompts(), request_id=f"resume:{done.session_id}:1", timeout=20).frames
        assert frames and kind_of(frames[-1]) == "completed", frames


# -- store level: an orphan once per holder that went away ---------------------------------------

@pytest.mark.parametrize("mode, reason, idle_s, due", [
    ("interrupted", "shutdown_timeout", 0, True),
    ("recent", INTERRUPTED, 0, True),
    ("off", "shutdown_timeout", 0, False),
    ("interrupted", "shutdown_timeout", 7200, False),  # stale: active last outside the freshness window
    ("interrupted", INTERRUPTED, 0, False),  # merely active: marked, never resumed
])
def test_a_lane_cut_off_is_an_orphan_once_per_holder_that_went_away(cluster_dsn, mode, reason, idle_s, due):
    how = jobs.Restoring(3600, mode)
    ttl = 60.0
    with local_store(SimpleNamespace(store_dsn=cluster_dsn)) as s:
        def as_node(node: str, fn, *args):
            s.uow.node_id = node
            return s.job(fn, *args)

        key = f"agent:main:telegram:dm:{uniq()}"
        s.job(life.get_or_create, key, SessionSource("telegram", chat_id=key), "main")
        grant = as_node("a", jobs.take_lane, key, "addr-a", ttl, how).lease
        s.job(life.mark_resume_pending, key, reason)
        if idle_s:
            s.job(lambda uow: uow.routing.patch(key, RoutingPatch(updated_at=time.time() - idle_s)))
        as_node("a", jobs.leave, [(key, grant.epoch)])  # a clean stop: this lane left to run out

        assert as_node("b", lambda uow: uow.leases.orphaned()) == [key]
        takes = as_node("b", jobs.take_orphans, "addr-b", ttl, how)
        if not due:  # taken, nothing to do, let go at once: nobody's orphan any more
            assert takes == []
            assert as_node("c", lambda uow: uow.leases.orphaned()) == []
            assert as_node("c", jobs.take_orphans, "addr-c", ttl, how) == []
            return
        assert [t.lease.session_key for t in takes] == [key]
        plan = takes[0].plan
        assert [(r.session_key, r.reason) for r in plan.resume] == [(key, reason)]
        epoch = takes[0].lease.epoch
        # b holds it (its continue turn runs there): nobody else's to take.
        assert as_node("c", jobs.take_orphans, "addr-c", ttl, how) == []
        # b dies with the mark still up (its continue turn failed): the lane is an orphan once more.
        as_node("b", lambda uow: uow.leases.expire(key, "b", epoch))
        again = as_node("c", jobs.take_orphans, "addr-c", ttl, how)
        assert [t.lease.session_key for t in again] == [key]
        # c lets it go (idle): not an orphan any more, whatever its mark says.
        as_node("c", jobs.release, [(key, again[0].lease.epoch)])
        assert as_node("a", lambda uow: uow.leases.orphaned()) == []


def test_a_stuck_loops_suspension_at_a_takeover_is_told_apart_from_a_suspend_session(cluster_dsn):
    """What a node stalled through its lane's takeover ends its turn with
    (cluster/verdict.py): CANCELLED for a SuspendSession (/stop) made
    meanwhile, as on one sidecar; LANE_MOVED when the stuck-loop guard
    suspended the lane as it was taken over (the lane was in flight at three
    takeovers in a row), even once the lane has been taken again since."""
    how = jobs.Restoring(3600, "off")
    with local_store(SimpleNamespace(store_dsn=cluster_dsn)) as s:
        def as_node(node: str, fn, *args):
            s.uow.node_id = node
            return s.job(fn, *args)

        def told_stopped(rid: str) -> bool:
            return rid in s.read("stopped_requests", [rid], STUCK_LOOP_RESTARTS)

        def cut_off(key: str, takeovers: int) -> str:
            """A turn running on the lane at each of ``takeovers`` takeovers (its
            holder gone each time, node n<i> by n<i+1>); the last one's request id."""
            src = SessionSource("telegram", chat_id=key)
            s.job(life.get_or_create, key, src, "main")
            epoch = as_node("n0", jobs.take_lane, key, "addr", 60.0, how).lease.epoch
            for n in range(takeovers):
                rid = uniq("cut")
                prompt = turn_jobs.PromptRecord(rid, key, "telegram", "main", 2, "hi", {}, time.time())
                as_node(f"n{n}", turn_jobs.accept,
                        turn_jobs.AcceptRequest(prompt, src, 300.0, None, 0, True, {key: epoch}))
                as_node(f"n{n}", lambda uow, node, held: uow.leases.expire(key, node, held), f"n{n}", epoch)
                epoch = as_node(f"n{n + 1}", jobs.take_lane, key, "addr", 60.0, how).lease.epoch
            return rid

        stopped_key, stuck_key = (f"agent:main:telegram:dm:{uniq()}" for _ in range(2))
        stopped = cut_off(stopped_key, 1)
        s.job(life.suspend, stopped_key)
        assert told_stopped(stopped)

        stuck = cut_off(stuck_key, STUCK_LOOP_RESTARTS)
        assert s.read("entry", stuck_key).suspended and not told_stopped(stuck)
        last = f"n{STUCK_LOOP_RESTARTS}"
        as_node(last, jobs.release, [(stuck_key, s.read("lease_holder", stuck_key).epoch)])
        as_node("again", jobs.take_lane, stuck_key, "addr", 60.0, how)  # nothing in flight this time
        assert s.read("entry", stuck_key).suspended and not told_stopped(stuck)


def test_work_a_sidecar_left_running_alone_on_the_database_is_taken_over_when_it_joins_a_cluster(
        tmp_path, cluster_dsn):
    """A sidecar ran alone on the database (no ``advertise``: it takes no
    leases) and crashed with a turn running and a prompt queued; it comes back
    as a node of a cluster. Those lanes have no lease row, so no node ever took
    them over: the turn stayed running and the acknowledged prompt queued until
    the lane's next prompt. A node's reaper now takes them over as a dead
    holder's: the turn closed ``restart_interrupted``, the prompt run once."""
    from sidecar_proc import Sidecar
    src = source("telegram")
    store_env = {"AGENT_SIDECAR_STORE__BACKEND": "postgres", "AGENT_SIDECAR_STORE__DSN": cluster_dsn}
    alone = Sidecar(tmp_path / "alone", config=echo("main", 100), env=store_env, dsn=cluster_dsn).start()
    running = PromptRun(alone.prompts(), text=words(40), src=src, request_id=uniq("run"))
    running.wait_for("text_delta")
    queued = PromptRun(alone.prompts(), text="after", src=src, request_id=uniq("queued"),
                       delivery=QUEUE)
    queued.wait_for("accepted")
    alone.kill9()
    with Cluster(tmp_path / "cl", cluster_dsn, n=2, config=echo("main"), lease_ttl_s=2.0) as cl:
        cut = watch(cl[0].prompts(), request_id=running.request_id, timeout=60).frames
        assert kind_of(cut[-1]) == "failed" and cut[-1].failed.reason == "restart_interrupted", cut[-1]
        ran = watch(cl[1].prompts(), request_id=queued.request_id, timeout=60).frames
        assert kind_of(ran[-1]) == "completed" and [kind_of(f) for f in ran].count("started") == 1, ran

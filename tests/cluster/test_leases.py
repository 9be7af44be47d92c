"""Several sidecars on one PostgreSQL database: each lane run by one node at a
time, calls forwarded to the lane's holder, a dead or stalled node's lanes
taken over at lease expiry with the restart's recovery, its late writes
refused by the epoch fence (issue 16; docs/cluster.md).

Real sidecar processes on one real PostgreSQL (tests/helpers/cluster.py);
assertions through gRPC: frames by request id and transcripts (from any node:
one database), and what each node's GetStatus counts of its leases. That the
fence itself refuses a stale epoch's write, whichever node sends it, is
tested at the store (test_fence.py): from outside, which of a woken node's
renewal or its next write notices the lost lease first is a race.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import grpc
import pytest
from helpers.cli import cli
from helpers.cluster import Cluster, Node
from helpers.config import echo, table
from helpers.ids import rid, source
from helpers.logs import log_lines
from helpers.procs import children
from helpers.recovery import RESUMED_MS
from helpers.sessions import transcript
from helpers.store import StoreView
from helpers.streams import QUEUE, TERMINAL, PromptRun, kind_of, start, watch
from helpers.waiting import wait_until
from sidecar_proc import error_info

from agent_sidecar.v1 import prompt_service_pb2 as ppb
from agent_sidecar.v1 import session_service_pb2 as spb

TTL = 3.0  # short, for the tests that wait for a lease to run out
CALM_TTL = 15.0  # for the others: no takeover from a node merely slowed by a busy machine
FOLLOW_UP = ppb.DeliveryMode.Value("DELIVERY_MODE_FOLLOW_UP")


@pytest.fixture
def nodes(tmp_path, cluster_dsn):
    """``nodes(n, config, ttl=...)``: a started cluster of ``n`` nodes on this test's database."""
    made: list[Cluster] = []

    def make(n: int, config: str = "", ttl: float = TTL) -> Cluster:
        made.append(Cluster(tmp_path, cluster_dsn, n, config, lease_ttl_s=ttl, workers=2).start())
        return made[-1]
    yield make
    for cl in made:
        cl.stop()


def _frames(node: Node, request_id: str) -> list:
    """A request's stored frames, read from ``node`` (any node: one database)."""
    return watch(node.prompts(), request_id=request_id, timeout=20).frames


def _trace(cl: Cluster, needles: tuple[str, ...], last: int = 200) -> str:
    """Every node's log lines naming any of ``needles`` (a request id, a
    lane's chat id), for a failure's message: the run's directory with the
    whole logs may be gone by the time anyone looks."""
    lines = [f"{n.node_id}: {line}" for n in cl.nodes for line in n.log().splitlines()
             if any(x in line for x in needles)]
    return "\n".join(lines[-last:])


def _wait_ended(cl: Cluster, reader: Node, request_id: str, lane) -> list[str]:
    """The kinds of a request's frames once it has ended, read from ``reader``;
    when it does not end, the failure says what each node logged of it and of
    its lane (``_trace``)."""
    def ended() -> bool:
        return any(kind_of(f) in TERMINAL for f in _frames(reader, request_id))
    try:
        wait_until(ended, timeout=30, what=f"{request_id} ended")
    except AssertionError:
        kinds = [kind_of(f) for f in _frames(reader, request_id)]
        raise AssertionError(f"{request_id} did not end (frames {kinds})\n"
                             f"{_trace(cl, (request_id, lane.chat_id))}") from None
    return [kind_of(f) for f in _frames(reader, request_id)]


def _interval(frames) -> tuple[float, float]:
    at = {kind_of(f): f.at.ToNanoseconds() / 1e9 for f in frames}
    return at["started"], next(f.at.ToNanoseconds() / 1e9 for f in frames if kind_of(f) in TERMINAL)


def test_one_lane_prompted_on_every_node_runs_one_turn_at_a_time_in_order(nodes):
    ns = nodes(3, echo(latency_ms=20), ttl=CALM_TTL)
    src = source("telegram")
    runs = [start(ns[i % 3].prompts(), ppb.PromptRequest(
        request_id=rid(f"q{i}"), text=f"turn number {i}", source=src, delivery=QUEUE)) for i in range(6)]
    for r in runs:
        r.result(60)
        assert r.kinds()[-1] == "completed", (r.kinds(), r.details)
        assert r.kinds().count("started") == 1
    intervals = sorted(_interval(r.frames) for r in runs)
    for (_, end), (begin, _) in zip(intervals, intervals[1:]):
        assert end <= begin, intervals  # never two turns of the lane at once, on any node
    # QUEUE order: turns start in the order their prompts were accepted.
    by_start = sorted(runs, key=lambda r: _interval(r.frames)[0])
    assert [r.request_id for r in by_start] == [r.request_id for r in runs]
    # One node holds the lane (it idles for less than a TTL yet); its status says so.
    holders = [n for n in ns if n.status().cluster.lanes_held == 1]
    assert len(holders) == 1 and all(n.status().cluster.lanes_held == 0 for n in ns if n not in holders)
    shown = cli("status", "--target", holders[0].target)
    assert shown.returncode == 0 and "lanes held 1 · taken over 0 · leases lost 0" in shown.stdout, shown


def test_follow_ups_sent_to_different_nodes_absorb_into_one_turn(nodes):
    ns = nodes(3, echo(latency_ms=60), ttl=CALM_TTL)
    src = source("telegram")
    first = start(ns[0].prompts(), ppb.PromptRequest(request_id=rid("busy"), text="a long " * 20,
                                                     source=src))
    first.wait_for("started")
    follow = [start(ns[i].prompts(), ppb.PromptRequest(request_id=rid(f"f{i}"), text=f"also {i}",
                                                       source=src, delivery=FOLLOW_UP))
              for i in (1, 2, 0)]
    for r in [first, *follow]:
        r.result(60)
    assert first.kinds()[-1] == "completed"
    # docs/semantics.md FOLLOW_UP: each newer follow-up absorbs the pending one; the last runs them all.
    assert [r.kinds()[-1] for r in follow] == ["superseded", "superseded", "completed"]
    users = [m.content for m in transcript(ns[1].sessions(), first.frames[0].session_id) if m.role == "user"]
    assert users[1:] == ["also 1", "also 2", "also 0"], users  # nothing sent is dropped, in order


def test_kill9_of_a_node_under_load_loses_nothing_and_runs_nothing_twice(nodes):
    ns = nodes(3, echo(latency_ms=15))
    lanes = [source("telegram") for _ in range(6)]
    acked: dict[str, tuple] = {}
    lock = threading.Lock()
    stop = threading.Event()
    survivors = list(ns)[:2]

    def client(lane_no: int) -> None:
        rng = random.Random(lane_no)
        while not stop.is_set():
            request_id = rid(f"l{lane_no}")
            for _attempt in range(20):  # retries go to a live node, same request id
                target = rng.choice(list(ns) if not stop.is_set() else survivors)
                if target.proc.poll() is not None:
                    target = rng.choice(survivors)
                run = PromptRun(target.prompts(), ppb.PromptRequest(
                    request_id=request_id, text="words " * 10, source=lanes[lane_no], delivery=QUEUE),
                    timeout=30, background=False)
                if "accepted" in run.kinds():
                    with lock:
                        acked[request_id] = lanes[lane_no]
                if run.kinds() and run.kinds()[-1] in TERMINAL:
                    break
                time.sleep(0.2)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(6)]
    for t in threads:
        t.start()
    wait_until(lambda: len(acked) >= 12, timeout=60, what="load before the kill")
    ns[2].kill9()
    time.sleep(3 * TTL)  # load goes on across the takeover
    stop.set()
    for t in threads:
        t.join(60)
    reader = survivors[0]

    for request_id, lane in acked.items():
        _wait_ended(ns, reader, request_id, lane)
    per_lane: dict[str, list] = {}
    for request_id, _lane in acked.items():
        frames = _frames(reader, request_id)
        kinds = [kind_of(f) for f in frames]
        assert sum(k in TERMINAL for k in kinds) == 1, (request_id, kinds)
        assert kinds.count("started") <= 1, (request_id, kinds)  # never ran twice
        assert [f.seq for f in frames] == list(range(1, len(frames) + 1))
        if "started" in kinds:
            per_lane.setdefault(frames[0].session_key, []).append(_interval(frames))
    for key, intervals in per_lane.items():
        intervals.sort()
        for (_, end), (begin, _) in zip(intervals, intervals[1:]):
            assert end <= begin, (key, intervals)
    for n in survivors:  # one warning for the dead holder, not one per call forwarded to it
        assert len([r for r in log_lines(n, "lane holder unreachable") if r["level"] == "warning"]) <= 1


def test_a_stalled_holder_is_fenced_after_its_lane_is_taken_over(nodes):
    # auto_resume off: b runs no continue turn, so whatever the lane holds
    # after the takeover is b's closing and nothing else.
    a, b = nodes(2, echo(latency_ms=150) + table("recovery", auto_resume="off"))
    src = source("telegram")
    turn = start(a.prompts(), ppb.PromptRequest(request_id=rid("stall"), text="slow " * 40, source=src))
    turn.wait_for("text_delta")
    a.pause()  # the parent stalls; its workers stream on into the pipe
    try:
        # b's reaper takes the lane once a's lease runs out, and closes a's turn
        # as a restart would.
        wait_until(lambda: kind_of(_frames(b, turn.request_id)[-1]) in TERMINAL, timeout=10 * TTL,
                   what="the takeover closing the stalled turn")
        closed = _frames(b, turn.request_id)
        held = transcript(b.sessions(), closed[0].session_id, include_rewound=True)
    finally:
        a.resume(children=False)
    assert closed[-1].failed.reason == "restart_interrupted", closed[-1]
    # The take's commit makes the closing readable; b counts the take when
    # the commit's answer reaches its loop, a moment later.
    wait_until(lambda: b.status().cluster.lanes_taken_over == 1, timeout=5, what="b counting the takeover")
    # a wakes up with its worker's frames waiting: whichever comes first, its
    # renewal finding the lease gone or the store fencing its flush, it stops
    # running the lane, writing nothing more.
    wait_until(lambda: a.status().cluster.leases_lost == 1, timeout=10, what="a dropping the lane")
    # Nothing of a's after the takeover: the request's frames are as b closed
    # them, the transcript as it was then.
    assert [(f.seq, kind_of(f)) for f in _frames(b, turn.request_id)] == \
        [(f.seq, kind_of(f)) for f in closed]
    assert transcript(b.sessions(), closed[0].session_id, include_rewound=True) == held
    # The lane works again, on either node.
    again = PromptRun(a.prompts(), ppb.PromptRequest(request_id=rid("after"), text="hi", source=src),
                      background=False)
    assert again.kinds()[-1] == "completed", (again.kinds(), again.details)


def test_the_holders_refusal_of_a_forwarded_prompt_reaches_the_caller_as_it_is(nodes):
    a, b = nodes(2, echo(latency_ms=100), ttl=CALM_TTL)
    src = source("telegram")
    busy = start(a.prompts(), ppb.PromptRequest(request_id=rid("busy"), text="slow " * 20, source=src))
    busy.wait_for("started")
    rejected = PromptRun(b.prompts(), ppb.PromptRequest(
        request_id=rid("rej"), text="now?", source=src,
        delivery=ppb.DeliveryMode.Value("DELIVERY_MODE_REJECT_IF_BUSY")), background=False)
    assert rejected.code == grpc.StatusCode.ABORTED, (rejected.code, rejected.details)
    assert rejected.reason == "AGENT_BUSY"  # the holder's ErrorInfo, relayed


def test_a_twin_sent_to_another_node_gets_the_original_turns_frames(nodes):
    a, b = nodes(2, echo(latency_ms=5), ttl=CALM_TTL)
    req = ppb.PromptRequest(request_id=rid("twin"), text="only once please", source=source("telegram"))
    original = PromptRun(a.prompts(), req, background=False)
    twin = PromptRun(b.prompts(), req, background=False)
    assert original.kinds()[-1] == "completed"
    assert [(f.seq, kind_of(f), f.cursor) for f in twin.frames] == \
        [(f.seq, kind_of(f), f.cursor) for f in original.frames]
    assert [kind_of(f) for f in _frames(b, req.request_id)].count("started") == 1


def test_one_request_id_sent_at_once_for_two_sessions_runs_one_and_refuses_the_other(nodes):
    """A request id belongs to the session it was accepted for (turns/dedup.py): sent
    at once for two sessions, one call runs its turn and the other is INVALID_ARGUMENT.
    Before, a node that took the second one's lease meanwhile saw the first placed and
    streamed it the first one's turn: another session's frames and text."""
    (node,) = nodes(1, echo(), ttl=CALM_TTL)
    for i in range(10):
        shared = rid("shared")
        both = [PromptRun(node.prompts(), text=f"{who} {i}", src=source(), request_id=shared)
                for who in ("one", "two")]
        ran = [p for p in (p.result(30) for p in both) if p.frames]
        assert len(ran) == 1, [(p.kinds(), p.key) for p in both if p.frames]
        refused = next(p for p in both if p is not ran[0])
        assert (refused.reason, refused.field) == ("INVALID_ARGUMENT", "request_id"), refused.details
        assert ran[0].final_text in (f"one {i}", f"two {i}")


def test_a_restarted_node_takes_its_lanes_back_and_runs_what_was_queued(nodes):
    # The queued prompt runs after the lane's resume turn (its ~60-word note
    # echoed at this pace); the cut-off turn would take 4.5 s.
    a, b = nodes(2, echo(latency_ms=RESUMED_MS), ttl=CALM_TTL)
    src = source("telegram")
    running = start(a.prompts(), ppb.PromptRequest(request_id=rid("run"), text="slow " * 90, source=src))
    running.wait_for("text_delta")
    queued = start(b.prompts(), ppb.PromptRequest(request_id=rid("queued"), text="next", source=src,
                                                  delivery=QUEUE))  # forwarded to a, the holder
    a.kill9()
    a.restart()  # well inside the lease: a's own lanes come back to it at once

    def ended(request_id: str):
        frames = _frames(b, request_id)
        return frames if frames and kind_of(frames[-1]) in TERMINAL else None
    closed = wait_until(lambda: ended(running.request_id), timeout=CALM_TTL * 0.7, what="the cut-off turn closed",
                        interval=0.2)
    assert closed[-1].failed.reason == "restart_interrupted"
    ran = wait_until(lambda: ended(queued.request_id), timeout=CALM_TTL * 0.7, what="the queued prompt run",
                     interval=0.2)
    assert [kind_of(f) for f in ran].count("started") == 1 and kind_of(ran[-1]) == "completed"


def test_a_prompt_taking_a_lane_this_nodes_reaper_is_taking_runs_the_lane_once(nodes):
    # b's reaper and a new prompt on b both take a dead a's lane: the reaper's
    # job reaches b's writer first, the prompt's right behind it. The lane
    # must be taken once, its queued prompt adopted once.
    cl = nodes(2, echo(latency_ms=30), ttl=6.0)
    a, b = cl
    src = source("telegram")
    cut = start(a.prompts(), ppb.PromptRequest(request_id=rid("cut"), text="slow " * 100, source=src))
    queued = start(a.prompts(), ppb.PromptRequest(request_id=rid("queued"), text="queued", source=src,
                                                  delivery=QUEUE))
    writer, store = children(b)["sidecar-writer"], StoreView(b)
    a.kill9()
    # b's writer stops just before a's lease runs out: the reaper's take that
    # waits in it is sent late enough for b to trust the lease it gets (a
    # node trusts a lease from when it asked), however long the stop.
    wait_until(lambda: store.lease_holder(cut.key).seconds_left < 0.5, timeout=30, what="a's lease nearly out")
    os.kill(writer, signal.SIGSTOP)
    try:
        # b holds no lease, so its keeper's one job is the reaper's take.
        wait_until(lambda: b.status().store.writer_backlog >= 1 and store.lease_holder(cut.key) is None,
                   timeout=30, what="the reaper's take waiting in b's writer, a's lease run out")
        after = PromptRun(b.prompts(), ppb.PromptRequest(request_id=rid("after"), text="after", source=src,
                                                         delivery=QUEUE), timeout=60)
        wait_until(lambda: b.status().store.writer_backlog >= 2, timeout=30, what="the prompt's take behind it")
    finally:
        os.kill(writer, signal.SIGCONT)
    after.result(60)
    assert after.kinds()[-1] == "completed", (after.kinds(), after.details)
    for request_id in (cut.request_id, queued.request_id):
        kinds = _wait_ended(cl, b, request_id, src)
        assert sum(k in TERMINAL for k in kinds) == 1 and kinds.count("started") <= 1, (request_id, kinds)
    assert kind_of(_frames(b, queued.request_id)[-1]) == "completed", _frames(b, queued.request_id)[-1]
    status = b.status().cluster
    assert (status.lanes_taken_over, status.fenced_writes, status.leases_lost) == (1, 0, 0), status


def test_a_prompt_whose_lane_is_lost_as_its_accept_commits_ends_lane_moved_and_its_retry_follows_it(nodes):
    # a's writer stops with a's lease renewal in it, then the prompt's accept
    # behind it. When it goes on, the renewal's answer comes too late to be
    # trusted (a node trusts a lease from when it asked): a drops the lane,
    # and the accept, committed under the epoch a still held in the store,
    # answers a turn no longer a's to run.
    (a,) = nodes(1, echo(latency_ms=20))
    src = source("telegram")
    assert PromptRun(a.prompts(), text="hello", src=src, background=False).kinds()[-1] == "completed"
    writer = children(a)["sidecar-writer"]
    os.kill(writer, signal.SIGSTOP)
    try:
        wait_until(lambda: a.status().store.writer_backlog >= 1, timeout=30, what="the renewal in a's writer")
        stopped = time.monotonic()
        req = ppb.PromptRequest(request_id=rid("lost"), text="during", source=src, delivery=QUEUE)
        during = PromptRun(a.prompts(), req, timeout=60)
        wait_until(lambda: a.status().store.writer_backlog >= 2 and time.monotonic() > stopped + TTL,
                   timeout=30, what="the accept behind it, the renewal's answer too late")
    finally:
        os.kill(writer, signal.SIGCONT)
    during.result(60)
    assert (during.code, during.reason) == (grpc.StatusCode.UNAVAILABLE, "LANE_MOVED"), (during.code, during.details)
    # The retry follows the turn. On the idle lane its accept started it in
    # the same commit, so the lane's next holder (a again) closes it as cut
    # off, as a restart would, and the lane's continue turn answers it.
    retry = PromptRun(a.prompts(), req, timeout=60, background=False)
    assert retry.kinds() == ["accepted", "started", "failed"], (retry.kinds(), retry.details)
    assert retry.last.failed.reason == "restart_interrupted"
    # (Accepted a moment after the closing commits: the restore's job closes, then its continue turn is placed.)
    resume = f"resume:{retry.session_id}:1"
    wait_until(lambda: [kind_of(f) for f in _frames(a, resume)][-1:] == ["completed"], timeout=30,
               what=f"{resume} completed")


def test_a_node_whose_store_stalls_stops_its_lanes_turns_when_their_lease_is_no_longer_trusted(nodes):
    # a's writer stops during a turn: the keeper's renewal waits in it, its
    # answer never comes. The turn must stop when a's trust in the lease runs
    # out (before the lease can run out in the database and another node start
    # the lane), not when the writer goes on: a worker that went on running
    # the model and its tool calls would run beside the lane's next holder.
    (a,) = nodes(1, echo(latency_ms=40))
    turn = PromptRun(a.prompts(), text="slow " * 400, src=source("telegram"), timeout=60)
    turn.wait_for("text_delta")
    writer = children(a)["sidecar-writer"]
    os.kill(writer, signal.SIGSTOP)
    try:
        wait_until(lambda: a.status().cluster.leases_lost == 1, timeout=TTL * 3,
                   what="the lane given up while the writer is stopped")
        turn.result(TTL * 3)
        assert (turn.code, turn.reason) == (grpc.StatusCode.UNAVAILABLE, "LANE_MOVED"), (turn.code, turn.details)
    finally:
        os.kill(writer, signal.SIGCONT)


def test_a_rewind_whose_lane_moves_before_its_job_commits_is_refused_and_rewinds_nothing(nodes):
    # a holds the lane; a RewindSession on a queues its job, and a's writer
    # stops with the job in it. a's lease runs out and b takes the lane with a
    # prompt. When a's writer goes on, the rewind must not commit under b's
    # lane (it would take b's turn back): it is refused LANE_MOVED, whose
    # retry goes to b.
    a, b = nodes(2, echo(latency_ms=5))
    src = source("telegram")
    first = PromptRun(a.prompts(), text="one", src=src, background=False)
    assert first.kinds()[-1] == "completed", first.kinds()
    writer, store = children(a)["sidecar-writer"], StoreView(b)
    os.kill(writer, signal.SIGSTOP)
    try:
        rewind = a.sessions().RewindSession.future(
            spb.RewindSessionRequest(session_id=first.session_id, n=1), timeout=60)
        wait_until(lambda: a.status().store.writer_backlog >= 2, timeout=30, what="the rewind's job in a's writer")
        wait_until(lambda: store.lease_holder(first.key) is None, timeout=TTL * 3, what="a's lease run out")
        taken = PromptRun(b.prompts(), text="two", src=src, background=False)
        assert taken.kinds()[-1] == "completed", (taken.kinds(), taken.details)
    finally:
        os.kill(writer, signal.SIGCONT)
    err = rewind.exception(30)
    assert err is not None and (err.code(), error_info(err)[0]) == (grpc.StatusCode.UNAVAILABLE, "LANE_MOVED"), err
    assert [m.content for m in transcript(b.sessions(), first.session_id)] == ["one", "one", "two", "two"]


def test_calls_forwarded_to_a_stalled_holder_end_lane_moved_and_the_retry_runs_where_the_lane_went(nodes):
    # a holds the lane; b forwards to it over a channel already open. a's
    # process stalls (SIGSTOP: its kernel still keeps the TCP connection up),
    # its lease runs out and b takes the lane over. The calls b forwarded to a
    # must not wait for their callers' deadlines.
    a, b = nodes(2, echo(latency_ms=50))
    src = source("telegram")
    assert PromptRun(a.prompts(), text="hello", src=src, background=False).kinds()[-1] == "completed"
    relayed = start(b.prompts(), ppb.PromptRequest(request_id=rid("relayed"), text="slow " * 200, source=src))
    relayed.wait_for("text_delta")
    a.pause()
    try:
        req = ppb.PromptRequest(request_id=rid("fwd"), text="after", source=src, delivery=QUEUE)
        forwarded = PromptRun(b.prompts(), req, timeout=60, background=False)
        assert (forwarded.code, forwarded.reason) == (grpc.StatusCode.UNAVAILABLE, "LANE_MOVED"), (
            forwarded.code, forwarded.details)
        relayed.result(60)
        assert (relayed.code, relayed.reason) == (grpc.StatusCode.UNAVAILABLE, "LANE_MOVED"), (
            relayed.code, relayed.details)

        def retried() -> bool:  # on b once the lane is b's: the retry places the prompt anew
            run = PromptRun(b.prompts(), req, timeout=60, background=False)
            return run.kinds()[-1:] == ["completed"]
        wait_until(retried, timeout=60, interval=0.5, what="the retry run on b")
    finally:
        a.resume()

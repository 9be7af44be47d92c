"""WatchActivity across a cluster (issue 16): watchers on node A get the frames
of turns run on node B, and on A itself, exactly once each, in cursor order,
through the cluster tail (cluster/tail.py: LISTEN/NOTIFY to wake, the frame
cursor to catch up); they resume after A restarts; a watch by request id, and
a twin Prompt, on A follow a turn running on B to its terminal frame. Two real
sidecars on one real PostgreSQL database."""

from __future__ import annotations

import grpc
import psycopg
import pytest
from helpers.cluster import Cluster
from helpers.config import echo
from helpers.ids import source, uniq, words
from helpers.streams import QUEUE, PromptRun, Watcher, assert_well_formed, body_of, kind_of, prompt_req, run, watch
from helpers.waiting import wait_until

from agent_sidecar.store.postgres.store import follower_name

PROFILES = echo("main") + echo("slow", 15)


@pytest.fixture(scope="module")
def cl(tmp_path_factory, cluster_databases):
    """One cluster for the module: each test uses sessions of its own."""
    with Cluster(tmp_path_factory.mktemp("cluster"), cluster_databases(), n=2, config=PROFILES) as c:
        yield c


def ident(frames) -> list[tuple]:
    """What two deliveries of one frame must agree on."""
    return [(f.request_id, f.seq, kind_of(f), body_of(f), f.cursor, f.session_id, f.at.ToNanoseconds())
            for f in frames]


def assert_in_cursor_order_once(frames) -> None:
    cursors = [f.cursor for f in frames]
    assert cursors == sorted(set(cursors)), "a frame twice, or out of cursor order"


def test_watchers_on_one_node_see_every_frame_of_turns_run_on_any_node(cl):
    a, b = cl["a"], cl["b"]
    platform = uniq("plat")
    first = run(b.prompts(), prompt_req(text="make the session", source=source(platform), profile="slow"))
    key, since = first.key, first.last.cursor
    # Resuming after a cursor: what committed before the watch was live is replayed,
    # the rest comes live; turns go on on B meanwhile, so both halves carry frames.
    on_b = [PromptRun(b.prompts(), text=words(25, f"t{i}"), key=key, delivery=QUEUE) for i in range(3)]
    by_key = Watcher(a.prompts(), session_key=key, after_cursor=since)
    by_platform = Watcher(a.prompts(), platform=platform, after_cursor=since)
    try:
        elsewhere_on_b = run(b.prompts(), prompt_req(text="another chat", source=source(platform)))
        # a's own turns streaming at once with b's: one order for both, the store's
        on_a = [PromptRun(a.prompts(), prompt_req(text=words(25, f"a{i}"), source=source(platform),
                                                  profile="slow")) for i in range(2)]
        other_platform = run(b.prompts(), prompt_req(text="not this platform"))
        for p in on_b + on_a:
            assert_well_formed(p.result(60))
        for w, expected in ((by_key, on_b), (by_platform, on_b + on_a + [elsewhere_on_b])):
            for p in expected:
                assert ident(w.frames_of(p.request_id, timeout=20)) == ident(p.frames), p.request_id
            assert_in_cursor_order_once(w.frames)
            assert {f.request_id for f in w.frames} == {p.request_id for p in expected}
        assert {f.session_key for f in by_key.frames} == {key}
        assert other_platform.request_id not in {f.request_id for f in by_platform.frames}
    finally:
        by_key.close()
        by_platform.close()


def test_a_watch_resumes_from_its_cursor_after_its_node_restarts(cl):
    a, b = cl["a"], cl["b"]
    first = run(b.prompts(), prompt_req(text="make the session", source=source(), profile="slow"))
    key = first.key
    w = Watcher(a.prompts(), session_key=key, after_cursor=first.last.cursor)
    long = PromptRun(b.prompts(), text=words(80), key=key, profile="slow")  # still running when a stops
    wait_until(lambda: sum(f.request_id == long.request_id for f in w.frames) >= 3, 20,
               what="the first frames on a")
    a.stop()  # the watch's stream ends with its node; the turn on b goes on
    w.close()
    seen = list(w.frames)
    later = run(b.prompts(), prompt_req(text=words(5, "later"), session_key=key))
    a.restart()
    rest = Watcher(a.prompts(), session_key=key, after_cursor=seen[-1].cursor)
    try:
        assert_well_formed(long.result(60))
        rest.frames_of(long.request_id, timeout=20)
        rest.frames_of(later.request_id, timeout=20)
        whole = seen + rest.frames
        assert_in_cursor_order_once(whole)
        assert ident([f for f in whole if f.request_id == long.request_id]) == ident(long.frames)
        assert ident([f for f in rest.frames if f.request_id == later.request_id]) == ident(later.frames)
    finally:
        rest.close()


def test_a_watch_misses_nothing_when_its_node_loses_the_listening_connection(cl):
    """The tail follows again (and catches up by cursor) after its LISTEN
    connection is cut: the watch on a still gets every frame of b's turn."""
    a, b = cl["a"], cl["b"]
    first = run(b.prompts(), prompt_req(text="make the session", source=source(), profile="slow"))
    w = Watcher(a.prompts(), session_key=first.key, after_cursor=first.last.cursor)
    try:
        long = PromptRun(b.prompts(), text=words(60), key=first.key)
        wait_until(lambda: sum(f.request_id == long.request_id for f in w.frames) >= 3, 20,
                   what="the first frames on a")
        with psycopg.connect(cl.dsn, autocommit=True) as conn:
            cut = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                               " WHERE application_name = %s AND datname = current_database()",
                               (follower_name("a"),)).fetchone()[0]
        assert cut == 1
        assert_well_formed(long.result(60))
        assert ident(w.frames_of(long.request_id, timeout=20)) == ident(long.frames)
        assert_in_cursor_order_once(w.frames)
    finally:
        w.close()


def test_a_watch_by_request_and_a_twin_on_one_node_follow_a_turn_running_on_another(cl):
    a, b = cl["a"], cl["b"]
    req = prompt_req(text=words(100), profile="slow")
    original = PromptRun(b.prompts(), req)
    original.wait_for("text_delta")  # running on b, its first frames stored
    twin = PromptRun(a.prompts(), req)  # the same request id and session, on a
    watched = watch(a.prompts(), request_id=req.request_id, timeout=60)
    assert_well_formed(original.result(60))
    twin.result(60)
    for out in (watched, twin):
        assert out.code == grpc.StatusCode.OK, (out.code, out.details)
        assert ident(out.frames) == ident(original.frames)
    unknown = watch(a.prompts(), request_id=uniq("nope"), timeout=10)
    assert unknown.code == grpc.StatusCode.NOT_FOUND and unknown.frames == []


def test_a_watch_by_request_of_a_turn_queued_on_another_node_waits_for_it(cl):
    """A request still queued on b when a's watch starts (only its ``accepted``
    frame stored): the watch goes on to its end."""
    a, b = cl["a"], cl["b"]
    src = source()
    running = PromptRun(b.prompts(), text=words(40), src=src, profile="slow")
    running.wait_for("started")
    queued = PromptRun(b.prompts(), prompt_req(text=words(5, "q"), source=src, profile="slow",
                                               delivery=QUEUE))
    queued.wait_for("accepted")
    watched = watch(a.prompts(), request_id=queued.request_id, timeout=60)
    assert_well_formed(queued.result(60))
    assert ident(watched.frames) == ident(queued.frames)

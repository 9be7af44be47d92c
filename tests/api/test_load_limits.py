"""Load limits through a real sidecar (issue 14, items 4 and 5): a stream whose
client stops reading is ended with STREAM_TOO_SLOW once its buffer bound is
passed, without holding up anyone else, and resumes from the store with no
gap, while one that keeps reading reads past a burst from the store, never
cut; admission control refuses prompts past the sidecar-wide caps on prompts
and bytes in flight, large requests past the cap on their bytes in flight,
and a session's queue past its default cap, with RESOURCE_EXHAUSTED +
ErrorInfo + RetryInfo, writing nothing; a low soft limit on open files does
not lock clients out.

A "stalled" client is a real gRPC channel with a small HTTP/2 window (no BDP
probing, 1 KB lookahead) whose call is simply not read: flow control fills
and the sidecar's write of the next frame waits, as with a hung adapter."""

from __future__ import annotations

import os
import re
import signal
import socket
import time

import grpc
import pytest
from helpers import procs
from helpers.config import slow_echo
from helpers.ids import rid, uniq, words
from helpers.metrics import metrics_config, scrape
from helpers.sessions import assert_serving, create, get_session, msg, rpc_error, transcript
from helpers.streams import D, PromptRun, Stream, collect, kind_of, run, start, watch
from helpers.waiting import wait_until
from sidecar_proc import Sidecar, error_metadata, free_port, retry_delay

from agent_sidecar.turns.subscriber import STALL_S
from agent_sidecar.v1 import common_pb2 as c
from agent_sidecar.v1 import prompt_service_pb2 as ppb
from agent_sidecar.v1 import prompt_service_pb2_grpc
from agent_sidecar.v1 import session_service_pb2 as spb

BUFFER_FRAMES = 50
MAX_PROMPTS = 3
MAX_BYTES = 5000
CONFIG = (f"[sidecar.limits]\nstream_buffer_frames = {BUFFER_FRAMES}\n"
          f"max_prompts_in_flight = {MAX_PROMPTS}\nmax_prompt_bytes_in_flight = {MAX_BYTES}\n\n"
          + slow_echo("main", latency_ms=0) + slow_echo("trickle", latency_ms=8)
          + slow_echo("slow", latency_ms=100)
          + "[stream]\ncoalesce_ms = 0\n")  # one frame per word: the bounds count frames
SMALL_WINDOW = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024)]


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    s = Sidecar(tmp_path_factory.mktemp("limits") / "data", config=CONFIG, workers=2).start()
    yield s
    s.stop()


@pytest.fixture
def stalled(sc):
    """A PromptService stub on a channel whose calls we leave unread."""
    ch = grpc.insecure_channel(sc.target, options=SMALL_WINDOW)
    yield prompt_service_pb2_grpc.PromptServiceStub(ch)
    ch.close()


def resume_point(call, details: str, name: str) -> int:
    """Where an ended stream resumes: in its ErrorInfo's metadata, and the same in its message."""
    m = re.search(rf"WatchActivity\(.*{name}=(\d+)\)", details)
    assert m, details
    assert error_metadata(call)[name] == m.group(1), (error_metadata(call), details)
    return int(m.group(1))


# -- slow consumers ----------------------------------------------------------------------------


def test_a_watcher_that_stops_reading_is_ended_and_resumes_without_gap(sc, stalled):
    """A never-reading WatchActivity(platform) is ended STREAM_TOO_SLOW naming its cursor while
    another client's prompts complete; resuming from that cursor misses nothing."""
    prompts, platform = sc.prompts(), uniq("plat")
    first = start(prompts, text="before the watch", src=c.SessionSource(platform=platform, chat_id=uniq()))
    begin = first.result(15).last.cursor
    call = stalled.WatchActivity(ppb.WatchActivityRequest(platform=platform, after_cursor=begin), timeout=60)
    # each turn's frames fit the bound, so its own (reading) Prompt stream keeps up
    turns = [PromptRun(prompts, text=words(20), src=c.SessionSource(platform=platform, chat_id=uniq()))
             .result(30) for _ in range(12)]
    assert [t.end for t in turns] == ["completed"] * 12, [t.kinds()[-1:] for t in turns]
    published = sorted(f.cursor for t in turns for f in t.frames)
    assert len(published) > 4 * BUFFER_FRAMES
    time.sleep(STALL_S + 0.5)  # the stream's write has waited past STALL_S: its client stopped reading

    got = collect(call, stop=lambda f: f.cursor == published[-1])  # before the bound: it reads all
    assert got.code == grpc.StatusCode.RESOURCE_EXHAUSTED, (got.code, got.details, len(got.frames))
    assert got.reason == "STREAM_TOO_SLOW", got.reason
    assert retry_delay(call) is not None
    cursor = resume_point(call, got.details, "after_cursor")
    sent = [f.cursor for f in got.frames]
    assert sent == published[:len(sent)], "the stream skipped a frame before it was ended"
    assert cursor == (sent[-1] if sent else begin), (cursor, sent[-1:])
    assert len(sent) < len(published)

    rest = collect(prompts.WatchActivity(ppb.WatchActivityRequest(platform=platform, after_cursor=cursor),
                                         timeout=30), stop=lambda f: f.cursor == published[-1])
    assert sent + [f.cursor for f in rest.frames] == published, "the resumed watch has a gap or a repeat"


def test_reading_clients_that_a_burst_outruns_read_on_from_the_store(sc):
    """Echo without latency, a frame a word: a turn's frames commit many times
    BUFFER_FRAMES at once. Its own Prompt stream and a platform watcher, both
    read at once, get every frame in order and end with the turn, never
    STREAM_TOO_SLOW (they were once cut after a few frames)."""
    prompts, platform = sc.prompts(), uniq("plat")
    big = rid()
    watcher = Stream(prompts.WatchActivity(ppb.WatchActivityRequest(platform=platform), timeout=60),
                     stop=lambda f: f.request_id == big and kind_of(f) == "completed")
    first = run(prompts, text="before", src=c.SessionSource(platform=platform, chat_id=uniq()))
    wait_until(lambda: any(f.request_id == first.request_id for f in watcher.frames),
               what="the watcher's first frame")  # it is subscribed
    turn = run(prompts, text=words(3000), src=c.SessionSource(platform=platform, chat_id=uniq()),
               request_id=big, timeout=60)
    assert turn.code == grpc.StatusCode.OK and turn.end == "completed", (turn.code, turn.reason, turn.details)
    assert [f.seq for f in turn.frames] == list(range(1, len(turn.frames) + 1))
    assert len(turn.frames) > 3000
    watcher.result(30)
    assert watcher.error is None or watcher.code == grpc.StatusCode.CANCELLED, (watcher.code, watcher.reason)
    assert [f.cursor for f in watcher.frames if f.request_id == big] == [f.cursor for f in turn.frames]


def test_a_prompt_stream_whose_client_stops_reading_resumes_by_request_id(sc, stalled):
    """A Prompt call left unread is ended STREAM_TOO_SLOW naming its seq; the turn itself
    completes, and WatchActivity(request_id, after_seq) gives the rest."""
    prompts = sc.prompts()
    # trickled, so a reader that keeps reading never falls BUFFER_FRAMES behind
    req = ppb.PromptRequest(request_id=uniq("r"), text=words(250), profile="trickle",
                            source=c.SessionSource(platform="telegram", chat_id=uniq()))
    call = stalled.Prompt(req, timeout=60)
    def known():  # another reader: once the prompt is accepted, the whole turn
        out = watch(prompts, request_id=req.request_id)
        return out if out.reason != "REQUEST_NOT_FOUND" else None
    whole = wait_until(known, timeout=15)
    assert whole.kinds()[-1:] == ["completed"] and whole.code == grpc.StatusCode.OK, \
        (whole.kinds()[-2:], whole.code, whole.reason, whole.details)
    assert len(whole.frames) > 4 * BUFFER_FRAMES
    time.sleep(STALL_S + 0.5)  # the stream's write has waited past STALL_S: its client stopped reading

    got = collect(call)
    assert got.code == grpc.StatusCode.RESOURCE_EXHAUSTED, (got.code, got.details, len(got.frames))
    assert got.reason == "STREAM_TOO_SLOW"
    assert retry_delay(call) is not None
    after = resume_point(call, got.details, "after_seq")
    assert [f.seq for f in got.frames] == list(range(1, after + 1))
    rest = watch(prompts, request_id=req.request_id, after_seq=after)
    assert [f.seq for f in got.frames + rest.frames] == [f.seq for f in whole.frames]
    assert rest.kinds()[-1] == "completed"


def test_replays_left_unread_hold_a_page_each_not_the_whole_turn(tmp_path):
    """WatchActivity(request_id) of a finished 6,000-frame turn, by 20 clients
    that read one frame and then nothing: each replay holds one page of the
    turn while its write waits (it once held the whole turn, ~5 MB a reader).
    A reader that goes on gets every frame, in order, across the pages, by
    request id and by session key after a cursor."""
    s = Sidecar(tmp_path / "data", config=slow_echo("main", latency_ms=0) + "[stream]\ncoalesce_ms = 0\n",
                workers=1).start()
    channels = []
    try:
        prompts = s.prompts()
        turn = PromptRun(prompts, text=words(6000), src=c.SessionSource(platform="telegram", chat_id=uniq()))
        assert turn.result(60).end == "completed" and len(turn.frames) > 6000
        before = procs.rss_bytes(s.proc.pid)
        calls = []
        for _ in range(20):
            ch = grpc.insecure_channel(s.target, options=SMALL_WINDOW)
            channels.append(ch)
            call = prompt_service_pb2_grpc.PromptServiceStub(ch).WatchActivity(
                ppb.WatchActivityRequest(request_id=turn.request_id), timeout=60)
            assert next(call).frame.seq == 1  # its replay began: it has read what it holds
            calls.append(call)
        grown = procs.rss_bytes(s.proc.pid) - before
        assert grown < 24 << 20, f"20 unread replays grew the sidecar by {grown / 2**20:.0f} MB"
        whole = watch(prompts, request_id=turn.request_id, timeout=30)
        assert [f.seq for f in whole.frames] == [f.seq for f in turn.frames]
        later = watch(prompts, request_id=turn.request_id, after_seq=3000, timeout=30)
        assert [f.seq for f in later.frames] == [f.seq for f in turn.frames][3000:]
        cursors = [f.cursor for f in turn.frames]  # the same turn by its key, after a cursor, across pages
        by_key = collect(prompts.WatchActivity(ppb.WatchActivityRequest(  # (after_cursor 0 is "live only")
            session_key=turn.key, after_cursor=cursors[0]), timeout=30), stop=lambda f: f.cursor == cursors[-1])
        assert [f.cursor for f in by_key.frames if f.cursor] == cursors[1:]
        for call in calls:
            call.cancel()
    finally:
        for ch in channels:
            ch.close()
        s.stop()


# -- admission ---------------------------------------------------------------------------------


def _refused(p: PromptRun, reason: str) -> None:
    p.result(10)
    assert p.frames == [], p.kinds()
    assert p.code == grpc.StatusCode.RESOURCE_EXHAUSTED, (p.code, p.error and p.error.details())
    assert p.reason == reason, p.reason
    assert retry_delay(p.error) is not None


def _nothing_written(sc, p: PromptRun) -> None:
    out = watch(sc.prompts(), request_id=p.request_id, timeout=10)
    assert out.reason == "REQUEST_NOT_FOUND", (out.code, out.reason)


def test_prompts_past_max_prompts_in_flight_are_overloaded_and_leave_no_trace(sc):
    """With max_prompts_in_flight running, one more is OVERLOADED + RetryInfo, writes no session
    and no ledger row, and the same request id runs once there is room."""
    prompts, sessions = sc.prompts(), sc.sessions()
    chats = [uniq() for _ in range(MAX_PROMPTS)]
    busy = [start(prompts, text=words(15), src=c.SessionSource(platform="telegram", chat_id=chat),
                profile="slow") for chat in chats]
    src = c.SessionSource(platform="telegram", chat_id=uniq())
    over = PromptRun(prompts, text="one too many", src=src)
    _refused(over, "OVERLOADED")
    assert "limits.max_prompts_in_flight" in over.error.details()
    _nothing_written(sc, over)
    key = busy[0].key.replace(chats[0], src.chat_id)  # the session it would have made
    with pytest.raises(grpc.RpcError) as e:
        sessions.GetSession(spb.GetSessionRequest(session_key=key), timeout=10)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    for b in busy:
        assert b.result(15).end == "completed"
    again = PromptRun(prompts, text="one too many", src=src, request_id=over.request_id).result(15)
    assert again.end == "completed" and again.final_text == "one too many"


def test_prompt_bytes_in_flight_are_capped_and_a_large_prompt_is_not_starved(sc):
    """While the prompts in flight hold max_prompt_bytes_in_flight or more, a new prompt is
    OVERLOADED; below it, even a prompt larger than the cap on its own is admitted."""
    prompts = sc.prompts()
    held = start(prompts, text=words(20, "x" * 140), profile="slow",  # ~3 KB, ~2 s
               src=c.SessionSource(platform="telegram", chat_id=uniq()))
    large = start(prompts, text=words(10, "y" * 600), profile="slow",  # ~6 KB > the cap, ~1 s
                src=c.SessionSource(platform="telegram", chat_id=uniq()))
    src = c.SessionSource(platform="telegram", chat_id=uniq())
    over = PromptRun(prompts, text="small", src=src)
    _refused(over, "OVERLOADED")
    assert "limits.max_prompt_bytes_in_flight" in over.error.details()
    _nothing_written(sc, over)
    assert held.result(15).end == "completed" and large.result(15).end == "completed"
    again = PromptRun(prompts, text="small", src=src, request_id=over.request_id).result(15)
    assert again.end == "completed"


def test_a_session_queue_is_capped_by_default(tmp_path):
    """Without queue_cap in the profile, a session's queue takes 32 prompts; the 33rd is QUEUE_FULL."""
    with Sidecar(tmp_path / "data", config=slow_echo("main", latency_ms=100), workers=1) as s:
        prompts = s.prompts()
        first = start(prompts, text=words(40), src=c.SessionSource(platform="telegram", chat_id=uniq()))
        first.wait_for("started")
        queued = [start(prompts, text=f"q{i}", key=first.key, delivery=D.DELIVERY_MODE_QUEUE) for i in range(32)]
        assert [q.position for q in queued] == list(range(1, 33))
        full = PromptRun(prompts, text="q32", key=first.key, delivery=D.DELIVERY_MODE_QUEUE)
        _refused(full, "QUEUE_FULL")
        assert "profiles.main.queue_cap = 32" in full.error.details()
        s.sessions().ResetSession(spb.ResetSessionRequest(session_key=first.key), timeout=10)
        assert all(q.result(10).end == "superseded" for q in queued)


# -- large requests in flight ------------------------------------------------------------------

LARGE_CAP = 1024 * 1024  # limits.max_request_bytes_in_flight: one large request at a time
GAUGE = "agent_sidecar_large_requests_bytes"


def _large_messages() -> list[c.Message]:
    return [msg("user", f"{i} " + "y" * 200_000) for i in range(8)]  # ~1.6 MB: a large request


@pytest.fixture(params=["unix only", "with tcp"])
def held_up(tmp_path, request):
    """A sidecar with a 1 MiB cap on large requests in flight and /metrics,
    and a way to hold its store writer (SIGSTOP), so that a write's call
    stays in flight until ``resume()``. With a TCP listener as well, every
    call's request is read by the boundary itself, after authentication
    (api/boundary.py), not by gRPC: both paths take the budget."""
    port = free_port()
    config = (f"[sidecar.limits]\nmax_request_bytes_in_flight = {LARGE_CAP}\n\n" + metrics_config(port)
              + slow_echo("slow", latency_ms=100))
    with Sidecar(tmp_path / "data", config=config, workers=1, tcp=request.param == "with tcp") as s:
        writer = wait_until(lambda: procs.children(s).get("sidecar-writer"), what="the store writer")
        stopped = []

        def stop_writer() -> None:
            os.kill(writer, signal.SIGSTOP)
            stopped.append(writer)

        def resume() -> None:
            while stopped:
                os.kill(stopped.pop(), signal.SIGCONT)
        try:
            yield s, port, stop_writer, resume
        finally:
            resume()


def test_a_large_request_past_the_bytes_in_flight_cap_is_overloaded_and_writes_nothing(held_up):
    """While one large request is being handled (its commit held up), another is OVERLOADED
    with RetryInfo before it is parsed, and writes nothing; reads still answer; once the first
    has answered, the refused one goes through as sent."""
    s, port, stop_writer, resume = held_up
    sessions = s.sessions()
    (a, _), (b, _) = create(sessions), create(sessions)
    stop_writer()
    first = sessions.AppendMessages.future(
        spb.AppendMessagesRequest(session_id=a.session_id, messages=_large_messages()), timeout=60)
    wait_until(lambda: scrape(port).value(GAUGE) > LARGE_CAP, what="the first large request in flight")
    with rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "OVERLOADED") as e:
        sessions.AppendMessages(spb.AppendMessagesRequest(session_id=b.session_id,
                                                          messages=_large_messages()), timeout=10)
    assert "limits.max_request_bytes_in_flight" in e.value.details()
    assert retry_delay(e.value) is not None
    assert get_session(sessions, a.session_key).session_id == a.session_id  # small requests are not counted
    resume()
    assert first.result(60).last_seq > 0
    wait_until(lambda: scrape(port).value(GAUGE) == 0, what="the first request's bytes given back")
    assert transcript(sessions, b.session_id) == []
    sessions.AppendMessages(spb.AppendMessagesRequest(session_id=b.session_id, messages=_large_messages()),
                            timeout=60)
    assert [m.content for m in transcript(sessions, b.session_id)] == [m.content for m in _large_messages()]


def test_a_large_prompt_counts_until_it_is_accepted_not_for_its_whole_turn(held_up):
    """A Prompt's request is held while its turn streams, but once its accepted frame is out its
    bytes count against max_prompt_bytes_in_flight (admission) instead: a large request after
    it is admitted while the turn still runs."""
    s, port, _, _ = held_up
    prompts, sessions = s.prompts(), s.sessions()
    other, _ = create(sessions)
    req = ppb.PromptRequest(request_id=rid(), text=words(100), profile="slow", source=c.SessionSource(
        platform="telegram", chat_id=uniq()), attachments=[ppb.Attachment(name="a.bin", data=b"z" * 1_500_000)])
    turn = start(prompts, req)  # ~10 s of text at 100 ms a word
    wait_until(lambda: scrape(port).value(GAUGE) == 0, what="the prompt's bytes given back once accepted")
    appended = sessions.AppendMessages(
        spb.AppendMessagesRequest(session_id=other.session_id, messages=_large_messages()), timeout=60)
    assert appended.last_seq > 0 and not turn.done.is_set()  # the turn still runs
    prompts.Cancel(ppb.CancelRequest(session_key=turn.key), timeout=10)
    assert turn.result(30).end == "failed"


# -- connections -------------------------------------------------------------------------------

def test_started_with_a_low_soft_open_files_limit_it_still_takes_new_clients_past_it(tmp_path):
    """Started as a service manager often starts it (256 open files soft, more hard), the
    sidecar raises its own soft limit to the hard one: 400 connections held open by one client
    do not lock a new client out (before, gRPC stopped accepting at 256)."""
    with Sidecar(tmp_path / "data", workers=1, wrapper=["prlimit", "--nofile=256:4096", "--"]) as s:
        held = []
        try:
            for _ in range(400):
                conn = socket.socket(socket.AF_UNIX)
                held.append(conn)
                conn.connect(str(s.socket_path))
            assert_serving(s)  # a new channel: health, then a session created
        finally:
            for conn in held:
                conn.close()

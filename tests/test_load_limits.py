"""Load limits through a real sidecar (issue 14, item 4): a stream whose
client stops reading is ended with STREAM_TOO_SLOW once its buffer bound is
passed, without holding up anyone else, and resumes from the store with no
gap.

A "stalled" client is a real gRPC channel with a small HTTP/2 window (no BDP
probing, 1 KB lookahead) whose call is simply not read: flow control fills
and the sidecar's write of the next frame waits, as with a hung adapter."""

from __future__ import annotations

import re

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from agent_sidecar.v1 import common_pb2 as c
from agent_sidecar.v1 import prompt_service_pb2 as ppb
from helpers_busy import PromptRun, run, slow_echo, words
from helpers_sessions import uniq
from helpers_turns import collect, wait_until, watch
from sidecar_proc import Sidecar

BUFFER_FRAMES = 40
CONFIG = (f"[sidecar.limits]\nstream_buffer_frames = {BUFFER_FRAMES}\n\n"
          + slow_echo("main", latency_ms=0) + slow_echo("trickle", latency_ms=3))
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
    from agent_sidecar.v1 import prompt_service_pb2_grpc
    yield prompt_service_pb2_grpc.PromptServiceStub(ch)
    ch.close()


def retry_info(err: grpc.RpcError):
    st = rpc_status.from_call(err)
    for d in st.details if st else ():
        if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            d.Unpack(info)
            return info
    return None


def resume_point(details: str, name: str) -> int:
    m = re.search(rf"WatchActivity\(.*{name}=(\d+)\)", details)
    assert m, details
    return int(m.group(1))


# -- slow consumers ----------------------------------------------------------------------------


def test_a_watcher_that_stops_reading_is_ended_and_resumes_without_gap(sc, stalled):
    """A never-reading WatchActivity(platform) is ended STREAM_TOO_SLOW naming its cursor while
    another client's prompts complete; resuming from that cursor misses nothing."""
    prompts, platform = sc.prompts(), uniq("plat")
    first = run(prompts, text="before the watch", src=c.SessionSource(platform=platform, chat_id=uniq()))
    start = first.result(15).terminal.cursor
    call = stalled.WatchActivity(ppb.WatchActivityRequest(platform=platform, after_cursor=start), timeout=60)
    # each turn's frames fit the bound, so its own (reading) Prompt stream keeps up
    turns = [PromptRun(prompts, text=words(20), src=c.SessionSource(platform=platform, chat_id=uniq()))
             .result(30) for _ in range(12)]
    assert [t.end for t in turns] == ["completed"] * 12, [t.kinds()[-1:] for t in turns]
    published = sorted(f.cursor for t in turns for f in t.frames)
    assert len(published) > 4 * BUFFER_FRAMES

    got = collect(call, stop=lambda f: f.cursor == published[-1])  # before the bound: it reads all
    assert got.code == grpc.StatusCode.RESOURCE_EXHAUSTED, (got.code, got.details, len(got.raw))
    assert got.reason == "STREAM_TOO_SLOW", got.reason
    assert retry_info(call) is not None
    cursor = resume_point(got.details, "after_cursor")
    sent = [f.cursor for f in got.raw]
    assert sent == published[:len(sent)], "the stream skipped a frame before it was ended"
    assert cursor == (sent[-1] if sent else start), (cursor, sent[-1:])
    assert len(sent) < len(published)

    rest = collect(prompts.WatchActivity(ppb.WatchActivityRequest(platform=platform, after_cursor=cursor),
                                         timeout=30), stop=lambda f: f.cursor == published[-1])
    assert sent + [f.cursor for f in rest.raw] == published, "the resumed watch has a gap or a repeat"


def test_a_prompt_stream_whose_client_stops_reading_resumes_by_request_id(sc, stalled):
    """A Prompt call left unread is ended STREAM_TOO_SLOW naming its seq; the turn itself
    completes, and WatchActivity(request_id, after_seq) gives the rest."""
    prompts = sc.prompts()
    req = ppb.PromptRequest(request_id=uniq("r"), text=words(200), profile="trickle",
                            source=c.SessionSource(platform="telegram", chat_id=uniq()))
    call = stalled.Prompt(req, timeout=60)
    def known():  # another reader: once the prompt is accepted, the whole turn
        out = watch(prompts, request_id=req.request_id)
        return out if out.reason != "REQUEST_NOT_FOUND" else None
    whole = wait_until(known, timeout=15)
    assert whole.kinds[-1] == "completed" and whole.code == grpc.StatusCode.OK, whole.kinds[-2:]
    assert len(whole.raw) > 4 * BUFFER_FRAMES

    got = collect(call)
    assert got.code == grpc.StatusCode.RESOURCE_EXHAUSTED, (got.code, got.details, len(got.raw))
    assert got.reason == "STREAM_TOO_SLOW"
    assert retry_info(call) is not None
    after = resume_point(got.details, "after_seq")
    assert [f.seq for f in got.raw] == list(range(1, after + 1))
    rest = watch(prompts, request_id=req.request_id, after_seq=after)
    assert [f.seq for f in got.raw + rest.raw] == [f.seq for f in whole.raw]
    assert rest.kinds[-1] == "completed"

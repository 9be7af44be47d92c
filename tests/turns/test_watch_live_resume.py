"""A live watch (WatchActivity by platform or session key, after_cursor = 0)
tells its client where it starts: its first message, sent at once, is a
keepalive carrying the cursor of the newest frame before it (after a restart
too). A client dropped before any frame resumes from that cursor and misses
nothing committed while it was away; before, it could only resume "live"
again. docs/semantics.md, "Resuming a stream, watching a platform"."""

from __future__ import annotations

from helpers.config import echo
from helpers.ids import uniq
from helpers.streams import Watcher, kind_of, prompt_req, run
from sidecar_proc import Sidecar

from agent_sidecar.v1 import common_pb2 as c
from agent_sidecar.v1 import prompt_service_pb2 as ppb


def first_message(stub, **kw):
    """The first frame a live watch sends (it must come at once, not after keepalive_s)."""
    call = stub.WatchActivity(ppb.WatchActivityRequest(**kw), timeout=5)
    try:
        return next(iter(call)).frame
    finally:
        call.cancel()


def test_a_live_watch_starts_with_its_resume_point_and_resuming_from_it_misses_nothing(tmp_path):
    with Sidecar(tmp_path / "data", config=echo("main")) as s:
        stub = s.prompts()
        platform = uniq("live")
        before = run(stub, prompt_req(text="before the watch"))  # another platform
        head = first_message(stub, platform=platform)
        assert kind_of(head) == "keepalive" and head.cursor == before.frames[-1].cursor, head
        # The watch is gone (a dropped connection); a turn of its platform runs meanwhile.
        missed = run(stub, prompt_req(text="while away", source=c.SessionSource(platform=platform, chat_id="a")))
        w = Watcher(stub, platform=platform, after_cursor=head.cursor)
        try:
            got = w.frames_of(missed.frames[0].request_id, timeout=5)
            assert [(f.seq, f.cursor) for f in got] == [(f.seq, f.cursor) for f in missed.frames]
        finally:
            w.close()
        key = missed.frames[0].session_key
        assert first_message(stub, session_key=key).cursor == missed.frames[-1].cursor

    # A restarted sidecar knows its newest frame before handing any out.
    with Sidecar(tmp_path / "data", config=echo("main")) as s:
        head = first_message(s.prompts(), platform=platform)
        assert kind_of(head) == "keepalive" and head.cursor == missed.frames[-1].cursor, head

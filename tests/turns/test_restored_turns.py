"""Turns the startup restore brings back after a kill -9 (a queued prompt, the
auto-resume continue turn) run under their profile's rules, as the prompts
the running sidecar takes do: here the profile's ``timeout_s``."""

from __future__ import annotations

from helpers.config import slow_echo
from helpers.ids import source, words
from helpers.recovery import restart
from helpers.store import StoreView
from helpers.streams import QUEUE, start, watch
from sidecar_proc import Sidecar

# 300 ms a word: a queued prompt of 20 words, or the resume note, takes far
# longer than the profile's 2 s timeout; the turn cut off by the kill is short.
CONFIG = slow_echo("main", 300, timeout_s=2)


def test_restored_and_resumed_turns_keep_their_profiles_timeout(tmp_path):
    sc = Sidecar(tmp_path / "data", config=CONFIG, workers=1).start()
    try:
        first = start(sc.prompts(), text=words(3), src=source())
        first.wait_for("text_delta")
        queued = start(sc.prompts(), text=words(20, "q"), key=first.key, delivery=QUEUE)
        sc.kill9()
        restart(sc)
        [resume] = StoreView(sc).resume_turns(first.session_id)
        for request_id in (resume.request_id, queued.request_id):
            out = watch(sc.prompts(), request_id=request_id, timeout=60)
            assert out.kinds()[-1] == "failed" and out.reason == "AGENT_TIMEOUT", (request_id, out.kinds())
            assert "(2.0 s)" in out.last.failed.message, out.last.failed.message
    finally:
        sc.stop()

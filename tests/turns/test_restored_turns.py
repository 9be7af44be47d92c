"""Turns the startup restore brings back after a kill -9 (a queued prompt, the
auto-resume continue turn) run under their profile's rules, as the prompts
the running sidecar takes do: here the profile's ``timeout_s``."""

from __future__ import annotations

import threading
import time

from helpers.config import slow_echo, table
from helpers.ids import source, words
from helpers.recovery import health, restart
from helpers.store import StoreView, writes_held
from helpers.streams import QUEUE, get_queue, start, watch
from helpers.waiting import wait_until
from sidecar_proc import Sidecar

from agent_sidecar.v1 import prompt_service_pb2 as ppb

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


def test_cancel_and_get_queue_during_the_startup_restore_see_the_restored_queue(tmp_path):
    """A Cancel or GetQueue that came while the restart's restore ran (held
    here by the store's write lock) found no lane yet: Cancel answered
    false and the prompt the user had cancelled ran after the restore;
    GetQueue said the queue was empty. Both wait for the restore, as
    Prompt and WatchActivity do. Each asks about a session of its own: on
    one session, whichever of the two ran first after the restore decided
    what GetQueue saw (the cancelled prompt gone, or not yet)."""
    sc = Sidecar(tmp_path / "data", config=slow_echo("main", 300) + table("recovery", auto_resume="off"),
                 workers=1).start()
    try:
        lanes = {}
        for name in ("asked", "cancelled"):  # a turn running, two queued behind it
            # the first streams 30 s, so that the kill finds it running however slowly both
            # lanes are set up; auto_resume off: the restart does not run it again
            first = start(sc.prompts(), text=words(100), src=source())
            first.wait_for("text_delta")
            runs = start(sc.prompts(), text=words(20, "q"), key=first.key, delivery=QUEUE)  # 6 s
            last = start(sc.prompts(), text="never mind", key=first.key, delivery=QUEUE)
            lanes[name] = (first.key, runs, last)
        (asked_key, _, waiting), (_, runs, cancelled) = lanes["asked"], lanes["cancelled"]
        sc.kill9()
        out: dict = {}
        with writes_held(sc):  # the restore waits for it
            threading.Thread(target=sc.start, daemon=True).start()
            wait_until(lambda: health(sc.target, 0.5) == "NOT_SERVING", timeout=30,
                       what="the restarted sidecar's server, restoring")
            calls = [threading.Thread(target=lambda: out.__setitem__("queue", get_queue(sc.prompts(), asked_key))),
                     threading.Thread(target=lambda: out.__setitem__("cancel", sc.prompts().Cancel(
                         ppb.CancelRequest(request_id=cancelled.request_id), timeout=30)))]
            for call in calls:
                call.start()
            time.sleep(1)  # the calls reach the server while the restore still waits
        for call in calls:
            call.join(30)
        queue = out["queue"]
        assert [q.request_id for q in queue.queued] == [waiting.request_id], queue
        assert out["cancel"].cancelled
        end = watch(sc.prompts(), request_id=cancelled.request_id, timeout=30)
        assert end.kinds()[-1] == "failed" and end.reason == "CANCELLED", end.kinds()
        assert watch(sc.prompts(), request_id=runs.request_id, timeout=60).kinds()[-1] == "completed"
    finally:
        sc.stop()

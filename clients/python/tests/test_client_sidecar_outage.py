"""The client against a real sidecar subprocess that dies mid-turn.

The sidecar is started with the server test suite's helper (tests/sidecar_proc.py),
so this needs the server package importable (the repo's venv has it).
"""

import asyncio
import sys
import time
from pathlib import Path

import grpc
import pytest

import agent_sidecar_client as asc

pytest.importorskip("agent_sidecar")
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from sidecar_proc import Sidecar  # noqa: E402

# One slow turn: started, then the model sleeps far longer than the test runs.
SLOW = '''
[profiles.slow]
model = "scripted"
model_options = { steps = [ { sleep_ms = 60000, text = "late" } ] }
'''


def test_prompt_deadline_holds_while_resuming_after_the_sidecar_dies(tmp_path):
    """prompt(timeout=) bounds the whole turn, resume waits included: a sidecar
    killed mid-turn ends the stream with DeadlineExceeded at the deadline, not with
    UNAVAILABLE after resume_timeout."""
    sc = Sidecar(tmp_path / "data", config=SLOW, workers=1).start()
    try:
        async def run():
            async with await asc.connect(sc.target) as client:
                t0 = time.monotonic()
                stream = client.prompt("hi", source={"platform": "t", "chat_id": "outage"},
                                       profile="slow", timeout=3.0, resume_timeout=30.0)
                kinds = []
                with pytest.raises(asc.SidecarError) as info:
                    async for f in stream:
                        kinds.append(asc.frame_kind(f))
                        if kinds[-1] == "started":
                            await asyncio.to_thread(sc.kill9)  # gone for good: an outage
                return kinds, info.value, time.monotonic() - t0

        # A bound well under resume_timeout, so the unfixed client fails here fast.
        try:
            kinds, err, elapsed = asyncio.run(asyncio.wait_for(run(), 8.0))
        except TimeoutError:
            pytest.fail("the 3 s turn deadline was ignored: still resuming after 8 s")
    finally:
        sc.stop()
    assert kinds == ["accepted", "started"]
    assert type(err) is asc.DeadlineExceeded, repr(err)  # the client's deadline: no AGENT_TIMEOUT
    assert (err.code, err.reason) == (grpc.StatusCode.DEADLINE_EXCEEDED, "")
    assert 2.5 < elapsed < 5.0


def test_a_cancel_as_the_channel_is_found_ready_is_not_lost(tmp_path):
    """wait_ready on a connected channel, cancelled after its first step: a
    cancel that found it still waiting reaches the caller. (asyncio.wait_for
    in Python 3.11 ran the check as a task of its own and, when that finished
    in the same loop turn as the cancel, returned instead: a Ctrl-C or a task
    group's cancel was dropped.)"""
    sc = Sidecar(tmp_path / "data", workers=1).start()
    try:
        async def run():
            async with await asc.connect(sc.target) as client:
                await client.wait_ready(5)
                waiting = asyncio.create_task(client.wait_ready(5))
                await asyncio.sleep(0)  # its first step has run
                if waiting.cancel():  # still waiting: the cancel must not be lost
                    with pytest.raises(asyncio.CancelledError):
                        await waiting
                else:  # it was done already (a ready channel needs no wait)
                    await waiting
        asyncio.run(run())
    finally:
        sc.stop()

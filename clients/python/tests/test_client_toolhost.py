"""ToolHost against a real sidecar (started with the server suite's helper,
tests/sidecar_proc.py): a registration the sidecar refuses raises its typed
error and leaves nothing running behind it."""

import asyncio
import sys
import time
from pathlib import Path

import pytest

import agent_sidecar_client as asc

pytest.importorskip("agent_sidecar")
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from sidecar_proc import Sidecar  # noqa: E402


def test_a_refused_registration_leaves_no_task_behind(tmp_path):
    """A namespace the sidecar refuses: InvalidArgument naming it, and every
    task the host started ends (gRPC's request reader waited on the host's
    outbox for good: "Task was destroyed but it is pending!" at exit, one
    more task per refused attempt)."""
    sc = Sidecar(tmp_path / "data", workers=1).start()
    try:
        async def run():
            async with await asc.connect(sc.target) as client:
                host = asc.ToolHost("bad ns")
                host.tool(lambda: 1, name="bad ns.x")
                with pytest.raises(asc.InvalidArgument) as info:
                    async with host.running(client, timeout=10):
                        pass
                me = asyncio.current_task()
                deadline = time.monotonic() + 10
                while (left := [t for t in asyncio.all_tasks() if t is not me]) and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                return info.value, left

        err, left = asyncio.run(run())
    finally:
        sc.stop()
    assert err.field_violations[0][0] == "register.namespace", err.field_violations
    assert left == [], left


_CALL = '{{ tool_calls = [ {{ name = "errs.{}", arguments = {{}} }} ] }}'
TOOL_ERRORS = f'''
[profiles.errs]
model = "scripted"
tools = ["errs.*"]
model_options = {{ steps = [ {_CALL.format("own_timeout")}, {_CALL.format("own_cancel")}, {{ text = "done" }} ] }}
'''


def test_a_tools_own_timeout_and_cancel_are_its_failures(tmp_path):
    """A tool raising TimeoutError of its own was reported as the host's
    timeout ("timed out after N ms"); one raising CancelledError escaped
    invoke(), so no result was sent and the turn waited out the sidecar's tool
    timeout. Both are now the tool's failure, sent at once."""
    sc = Sidecar(tmp_path / "data", config=TOOL_ERRORS, workers=1).start()
    try:
        async def run():
            async with await asc.connect(sc.target) as client:
                host = asc.ToolHost("errs")

                @host.tool
                async def own_timeout() -> None:
                    raise TimeoutError("the database took too long")

                @host.tool
                async def own_cancel() -> None:
                    raise asyncio.CancelledError("a future it waited on was cancelled")

                async with host.running(client):
                    return await client.prompt("go", source={"platform": "t", "chat_id": "errs"},
                                               profile="errs").collect()

        frames = asyncio.run(asyncio.wait_for(run(), 20))
    finally:
        sc.stop()
    results = [f.tool_result for f in frames if asc.frame_kind(f) == "tool_result"]
    assert [r.ok for r in results] == [False, False], results
    assert "TimeoutError: the database took too long" in results[0].result_json, results[0]
    assert "timed out after" not in results[0].result_json
    assert "CancelledError: a future it waited on was cancelled" in results[1].result_json, results[1]
    assert asc.frame_kind(frames[-1]) == "completed"


BIG = f'''
[sidecar.limits]
max_text_bytes = 1000

[profiles.big]
model = "scripted"
tools = ["big.*"]
model_options = {{ steps = [ {_CALL.replace("errs.", "big.").format("answer")}, {{ text = "done" }} ] }}
'''


def test_a_result_the_sidecar_refuses_does_not_end_the_host(tmp_path):
    """A result past the sidecar's limits (a result_json over max_text_bytes) is
    refused with INVALID_ARGUMENT, and the sidecar ends that ServeTools stream.
    The host registered fine: it re-registers and answers the next call, instead
    of serve() raising and every later call finding "no tool host serves"."""
    sc = Sidecar(tmp_path / "data", config=BIG, workers=1).start()
    try:
        async def run():
            async with await asc.connect(sc.target) as client:
                host = asc.ToolHost("big")
                sizes = [5000, 10]

                @host.tool
                async def answer() -> str:
                    return "x" * sizes.pop(0)

                turns = []
                async with host.running(client):
                    for i in range(2):
                        await host.wait_registered(10)
                        turns.append(await client.prompt("go", source={"platform": "t", "chat_id": f"big{i}"},
                                                          profile="big").collect())
                return turns

        turns = asyncio.run(asyncio.wait_for(run(), 30))
    finally:
        sc.stop()
    results = [[f.tool_result for f in t if asc.frame_kind(f) == "tool_result"][0] for t in turns]
    assert not results[0].ok  # the refused one: the call failed, as the host was cut
    assert (results[1].ok, results[1].result_json) == (True, '"xxxxxxxxxx"'), results[1]

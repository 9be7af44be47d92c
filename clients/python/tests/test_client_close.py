"""close() while calls are in flight, and calls after it, against a real
sidecar subprocess: every one ends with a SidecarError of code CANCELLED, "the
client was closed" (as in the Node and Go clients). Before, the calls in
flight raised a bare asyncio.CancelledError in tasks nobody had cancelled (a
TaskGroup or asyncio.run took that for a cancellation of their own), and later
calls raised grpc.aio.UsageError."""

import asyncio
import sys
from pathlib import Path

import grpc
import pytest

import agent_sidecar_client as asc

pytest.importorskip("agent_sidecar")
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from helpers.config import slow_echo  # noqa: E402
from helpers.ids import words  # noqa: E402
from sidecar_proc import Sidecar  # noqa: E402


def closed(error: BaseException) -> bool:
    return (type(error) is asc.SidecarError and error.code == grpc.StatusCode.CANCELLED
            and error.reason == "" and "the client was closed" in str(error))


async def outcome(awaitable) -> BaseException | None:
    try:
        await awaitable
    except BaseException as e:  # noqa: BLE001 - the test looks at what came out
        return e
    return None


async def drain(stream: asc.FrameStream, first: asyncio.Event) -> None:
    async for _ in stream:
        first.set()


def test_calls_in_flight_and_after_close_raise_the_closed_error(tmp_path):
    sc = Sidecar(tmp_path / "data", config=slow_echo("main", latency_ms=100), workers=1).start()
    try:
        async def run():
            client = await asc.connect(sc.target)
            source = {"platform": "t", "chat_id": "close"}
            started = [asyncio.Event(), asyncio.Event()]
            in_flight = [asyncio.create_task(outcome(drain(client.prompt(words(30), source=source), started[0]))),
                         asyncio.create_task(outcome(drain(client.watch(platform="t"), started[1])))]
            for event in started:
                await event.wait()  # both streams are open and have yielded a frame
            host = asc.ToolHost("t")
            host.tool(lambda: 1, name="t.x")
            serving = asyncio.create_task(outcome(host.serve(client)))
            await host.wait_registered(10)
            await client.close()
            during = [await task for task in (*in_flight, serving)]
            later = [await outcome(client.get_session(session_key="k")),
                     await outcome(client.prompt("x", source=source).collect()),
                     await outcome(client.watch(platform="t").collect()),
                     await outcome(asc.ToolHost("u").serve(client))]
            return during, later

        during, later = asyncio.run(asyncio.wait_for(run(), 30))
    finally:
        sc.stop()
    assert all(closed(e) for e in during), during
    assert all(closed(e) for e in later), later


def test_a_stream_closed_from_another_task_ends_the_reading_loop_quietly(tmp_path):
    """stream.aclose() from another task while one reads it (stopping a watch
    from a shutdown handler, or a turn's stream from a /stop command) raised
    RuntimeError "aclose(): asynchronous generator is already running" and left
    the reader waiting on the stream. Now it cancels the RPC and the reader's
    loop ends, with no error and no resume (as the Node client's close())."""
    sc = Sidecar(tmp_path / "data", config=slow_echo("main", latency_ms=100), workers=1).start()
    try:
        async def run():
            async with await asc.connect(sc.target) as client:
                streams = [client.watch(platform="t"),
                           client.prompt(words(30), source={"platform": "t", "chat_id": "aclose"})]
                results = []
                for stream in streams:
                    got = asyncio.Event()

                    async def read(stream=stream, got=got):
                        n = 0
                        async for _ in stream:
                            n += 1
                            got.set()
                        return n

                    reader = asyncio.create_task(read())
                    if stream.request_id:
                        await got.wait()  # a frame of the turn came: the reader waits for the next
                    else:
                        await asyncio.sleep(0.5)  # the watch is open, its reader waits for a frame
                    await stream.aclose()
                    results.append((await reader, stream.resumes))
                return results

        results = asyncio.run(asyncio.wait_for(run(), 20))
    finally:
        sc.stop()
    (watched, watch_resumes), (frames, prompt_resumes) = results
    assert watched == 0 and watch_resumes == 0
    assert 1 <= frames < 30 and prompt_resumes == 0

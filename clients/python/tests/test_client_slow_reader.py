"""A watcher that stops reading, against a real sidecar subprocess.

The sidecar ends a WatchActivity(platform | session_key) whose client stopped
reading with STREAM_TOO_SLOW, naming the cursor to resume from (docs/api.md):
nothing is lost, the frames are persisted. The client's watch, which "follows
cursors and never ends by itself", resumes from its cursor instead of raising.

The client's channel has a small HTTP/2 window (no BDP probing, 1 KB
lookahead), as tests/api/test_load_limits.py's stalled client: flow control
fills and the sidecar's write of the next frame waits, as with a hung adapter.
"""

import asyncio
import sys
from pathlib import Path

import pytest

import agent_sidecar_client as asc

pytest.importorskip("agent_sidecar")
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from helpers.config import slow_echo  # noqa: E402
from helpers.ids import words  # noqa: E402
from sidecar_proc import Sidecar  # noqa: E402

from agent_sidecar.turns.subscriber import STALL_S  # noqa: E402

BUFFER_FRAMES = 20
CONFIG = f"[sidecar.limits]\nstream_buffer_frames = {BUFFER_FRAMES}\n\n" + slow_echo("main", latency_ms=0)
SMALL_WINDOW = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024)]
TURNS = 20


def test_a_platform_watch_left_unread_resumes_from_its_cursor(tmp_path):
    """A platform watch whose reader stalls while other turns stream is cut
    STREAM_TOO_SLOW by the sidecar; the client's watch reopens from its last
    cursor and yields every frame of those turns once, in cursor order."""
    sc = Sidecar(tmp_path / "data", config=CONFIG, workers=1).start()
    try:
        async def run():
            async with await asc.connect(sc.target) as producer, \
                    await asc.connect(sc.target, options=SMALL_WINDOW) as watcher:
                platform = "slowreader"
                first = await producer.prompt("before", source={"platform": platform, "chat_id": "c0"}).collect()
                stream = watcher.watch(platform=platform, after_cursor=first[-2].cursor)
                async with stream:
                    assert (await anext(stream)).cursor == first[-1].cursor  # the call is open
                    published = []
                    for i in range(TURNS):  # the watch is not read meanwhile
                        frames = await producer.prompt(words(60, "x" * 1000), source={"platform": platform,
                                                                         "chat_id": f"c{i + 1}"}).collect()
                        published += [f.cursor for f in frames]
                    assert len(published) > 4 * BUFFER_FRAMES
                    await asyncio.sleep(STALL_S + 0.5)  # its write waited past STALL_S: a stalled client
                    got = []
                    async with asyncio.timeout(30):
                        async for frame in stream:
                            got.append(frame.cursor)
                            if frame.cursor == published[-1]:
                                break
                    return got, published, stream.resumes

        got, published, resumes = asyncio.run(run())
    finally:
        sc.stop()
    assert got == published, "the resumed watch has a gap or a repeat"
    assert resumes >= 1  # it was cut (STREAM_TOO_SLOW) and reopened


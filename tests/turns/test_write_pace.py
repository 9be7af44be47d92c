"""The pace of a worker's writes to the parent (children.Channel): a message
after a quiet spell leaves at once, messages sent close together under load
wait for the pace and leave in one write. Real socketpair, real event loop."""

from __future__ import annotations

import asyncio
import socket

import orjson
import pytest

from agent_sidecar.children import Channel, frame, open_channel

pytestmark = pytest.mark.store_free("a worker channel's write pace, on a socketpair")


async def _channel(pace_s: float, quiet_s: float) -> tuple[Channel, socket.socket]:
    ours, peer = socket.socketpair()
    channel = await open_channel(ours.fileno(), lambda _m: None, lambda: None,
                                 pace_s=pace_s, quiet_s=quiet_s)
    ours.close()  # open_channel holds its own duplicate
    peer.setblocking(False)
    return channel, peer


async def _read(peer: socket.socket, n: int, timeout: float = 10.0) -> bytes:
    """Exactly the next ``n`` bytes from the peer, or TimeoutError."""
    loop, got = asyncio.get_running_loop(), b""
    async with asyncio.timeout(timeout):
        while len(got) < n:
            got += await loop.sock_recv(peer, n - len(got))
    return got


def _wire(*msgs) -> bytes:
    return b"".join(frame(orjson.dumps(m)) for m in msgs)


def test_a_message_after_a_quiet_spell_leaves_at_once_despite_the_pace():
    """One turn at a time writes every few milliseconds: a pace that held each
    of those writes back would add its wait to every turn."""
    async def main():
        channel, peer = await _channel(pace_s=600.0, quiet_s=0.05)
        channel.send({"n": 1})
        assert await _read(peer, len(_wire({"n": 1}))) == _wire({"n": 1})
        await asyncio.sleep(0.1)  # longer than quiet_s since that write
        channel.send({"n": 2})  # the pace (600 s) would hold it: the quiet spell must not
        assert await _read(peer, len(_wire({"n": 2}))) == _wire({"n": 2})
        channel.close()
        peer.close()
    asyncio.run(main())


def test_messages_sent_close_after_a_write_wait_for_the_pace_and_leave_in_one_write():
    async def main():
        channel, peer = await _channel(pace_s=1.0, quiet_s=600.0)  # every send finds the channel busy
        channel.send({"n": 1})  # the first write of all: nothing to pace against
        assert await _read(peer, len(_wire({"n": 1}))) == _wire({"n": 1})
        for n in (2, 3, 4):
            channel.send({"n": n})
        for _ in range(5):
            await asyncio.sleep(0)  # loop iterations: no write yet, the pace holds them
        try:
            held = peer.recv(4096)
        except BlockingIOError:
            held = b""
        assert held == b""
        # One write after the pace: the peer's first read returns all three.
        async with asyncio.timeout(10):
            first_read = await asyncio.get_running_loop().sock_recv(peer, 65536)
        assert first_read == _wire({"n": 2}, {"n": 3}, {"n": 4})
        channel.close()
        peer.close()
    asyncio.run(main())


def test_a_message_something_waits_for_leaves_at_once_with_what_was_held():
    """A tool call or a steer's answer (``soon``) is never paced: it leaves at
    the end of its loop iteration, with the messages the pace was holding
    before it, in order."""
    async def main():
        channel, peer = await _channel(pace_s=600.0, quiet_s=600.0)  # every send finds the channel busy
        channel.send({"n": 1})  # the first write of all: nothing to pace against
        assert await _read(peer, len(_wire({"n": 1}))) == _wire({"n": 1})
        channel.send({"n": 2})  # held by the pace (600 s)
        channel.send({"n": 3}, soon=True)
        expected = _wire({"n": 2}, {"n": 3})
        assert await _read(peer, len(expected)) == expected
        channel.close()
        peer.close()
    asyncio.run(main())

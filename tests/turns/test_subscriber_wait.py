"""A stream's wait for its next frame (turns/subscriber.py ``Subscriber.get``):
it ends with None (the stream then sends a keepalive) once ``timeout`` passed
without a frame, counted from when that wait began, and a stream that keeps
getting frames sets no timer per frame. Real event loop, real timers."""

from __future__ import annotations

import asyncio

import pytest

from agent_sidecar.turns.subscriber import STALL_S, FellBehind, Subscriber, TooSlow

pytestmark = pytest.mark.store_free("a subscriber's wait, on an event loop")

TIMEOUT = 0.3


def test_a_wait_with_no_frame_ends_with_none_after_the_timeout():
    async def main():
        sub, loop = Subscriber(), asyncio.get_running_loop()
        began = loop.time()
        assert await sub.get(TIMEOUT) is None
        assert loop.time() - began >= TIMEOUT - 0.01
    asyncio.run(main())


def test_frames_closer_than_the_timeout_keep_the_wait_from_ending_empty():
    """Each wait counts from its own start: frames every TIMEOUT / 3 for longer
    than several timeouts never end a wait with None; the first None comes a
    whole timeout after the last frame."""
    async def main():
        sub, loop = Subscriber(), asyncio.get_running_loop()

        async def feed():
            for i in range(12):
                await asyncio.sleep(TIMEOUT / 3)
                sub.push(i)
        feeder = loop.create_task(feed())
        got = []
        while (item := await sub.get(TIMEOUT)) is not None:
            got.append(item)
        last = loop.time()
        await feeder
        assert got == list(range(12))
        assert await sub.get(TIMEOUT) is None
        assert loop.time() - last >= TIMEOUT - 0.01
    asyncio.run(main())


def test_one_alarm_serves_every_wait_until_it_rings():
    """The alarm set by the first wait is the one the following waits use:
    no timer is made (and cancelled) per frame."""
    async def main():
        sub = Subscriber()
        waiting = asyncio.get_running_loop().create_task(sub.get(60.0))
        await asyncio.sleep(0)
        alarm = sub.alarm
        assert alarm is not None
        sub.push("a")
        assert await waiting == "a"
        for item in ("b", "c", "d"):
            waiting = asyncio.get_running_loop().create_task(sub.get(60.0))
            await asyncio.sleep(0)
            assert sub.alarm is alarm
            sub.push(item)
            assert await waiting == item
        alarm.cancel()
    asyncio.run(main())


def test_close_cancels_the_alarm():
    """A stream done waiting cancels the alarm at once: a ringing alarm would
    otherwise hold the subscriber up to a timeout after the stream ended."""
    async def main():
        sub = Subscriber()
        waiting = asyncio.get_running_loop().create_task(sub.get(60.0))
        await asyncio.sleep(0)
        alarm = sub.alarm
        sub.push("a")
        assert await waiting == "a"
        sub.close()
        assert sub.alarm is None and alarm.cancelled()
        sub.close()  # twice is harmless
    asyncio.run(main())


def test_a_reader_idle_before_a_burst_larger_than_its_bound_falls_behind_and_is_not_too_slow():
    """Waiting in ``get`` is not writing: a stream that read its frames, then
    waited longer than STALL_S before one commit brought more than its bound,
    reads on from the store (FellBehind); one whose write had taken that long
    when the burst came has a client that stopped reading (TooSlow)."""
    async def dropped_after(idle_in_get: bool) -> type:
        sub, loop = Subscriber(max_frames=5), asyncio.get_running_loop()
        sub.push("first")
        assert await sub.get(60.0) == "first"  # ... and the stream writes it
        waiting = loop.create_task(sub.get(60.0)) if idle_in_get else None
        await asyncio.sleep(STALL_S * 1.2)
        for i in range(10):
            sub.push(i)
        try:
            await (waiting or sub.get(60.0))
        except (FellBehind, TooSlow) as e:
            return type(e)
        raise AssertionError("the burst did not drop the subscriber")

    async def main():
        assert await dropped_after(idle_in_get=True) is FellBehind
        assert await dropped_after(idle_in_get=False) is TooSlow
    asyncio.run(main())

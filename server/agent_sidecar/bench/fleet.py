"""The bench's load from several client processes (``--clients N``, and
several ``--target`` sidecars).

Why: the bench's client is one Python process, one event loop on one core.
A server that streams more frames than that loop can read is paced by the
client rather than measured (stats.client_bound says when), and several
sidecars (a cluster's nodes) need a channel each. With ``--clients N`` each
point's lanes are spread over N spawned processes, each with its own channel
to its target (``deal``: client k drives target k mod T) and its own share
of the sessions; this process only conducts them and adds up what they
counted.

One point, as ``Fleet.run_point`` conducts it (messages are pickled tuples
over each client's pipe, children.Channel):

1. each client gets ``("point", spec, lanes, t0)``: its share of ``--turns``,
   the lanes ``k, k+N, k+2N…`` (the ramp then interleaves them as one
   process would) and the point's start, which every process counts seconds
   from (``time.monotonic`` is the system's CLOCK_MONOTONIC);
2. warm-up: each says ``warm`` once each of its lanes finished a turn (or
   the coordinator waits ``warmup_s``); then every client gets ``measure``;
3. the window: after ``duration_s`` every client gets ``stop`` and drains;
   with ``--turns`` each drains once its share has started;
4. each answers ``("result", tally)`` (load.Point.tally), added into one
   load.Point that load.summarize reads like a local one.

Every load.TICK_S each client sends ``("tick", snapshot)``; their sum is the
progress line. A client that fails says ``("error", text)`` and one that dies
closes its pipe: either ends the run with ClientLost (the points that
finished are kept, as for a target lost: run.run_bench). Clients are spawned
fresh interpreters (children.spawn: grpc is not fork-safe), once per server,
and serve every point of the run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import pickle
import time
from collections.abc import Callable
from typing import Any

from ..children import Channel, ChildProcess, open_channel, spawn
from . import load
from .target import BenchError, ClientLost, Target, connect

START_TIMEOUT_S = 60.0


def _dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


class Fleet:
    """One client process per ``(target, session keys)`` of ``clients``,
    driving one server (``server`` names it in errors; several targets when
    it is several sidecars)."""

    def __init__(self, clients: list[tuple[Target, list[str]]], seed: int, server: str):
        self.clients, self.n, self.seed, self.server = clients, len(clients), seed, server
        self.pids: list[int] = []
        self._procs: list[ChildProcess] = []
        self._channels: list[Channel] = []
        self._inbox: asyncio.Queue[tuple[int, tuple]] = asyncio.Queue()
        self._closing = False

    async def start(self) -> None:
        """Spawn the clients; each connects and says it is ready."""
        started = await asyncio.gather(*(self._spawn(k) for k in range(self.n)), return_exceptions=True)
        for k, outcome in enumerate(started):
            if isinstance(outcome, BaseException):
                raise BenchError(f"bench client {k} for {self.server} did not start: {outcome}")
            proc, channel, hello = outcome
            self._procs.append(proc)
            self._channels.append(channel)
            if hello[0] != "ready":
                raise BenchError(hello[1])
            self.pids.append(hello[1])

    async def _spawn(self, k: int):
        target, keys = self.clients[k]
        return await spawn("agent_sidecar.bench.fleet:client_main", (target, keys, self.seed + k, os.getpid(), k),
                           f"bench client {k}", functools.partial(self._heard, k),
                           functools.partial(self._lost, k), START_TIMEOUT_S, loads=pickle.loads, dumps=_dumps)

    def _heard(self, k: int, msg: tuple) -> None:
        self._inbox.put_nowait((k, msg))

    def _lost(self, k: int) -> None:
        if not self._closing:
            self._inbox.put_nowait((k, ("lost",)))

    async def close(self) -> None:
        self._closing = True
        for channel in self._channels:
            channel.send(("close",), now=True)
            channel.close()
        loop = asyncio.get_running_loop()
        for proc in self._procs:
            await loop.run_in_executor(None, proc.join, 10)
            proc.kill()

    # -- one point --------------------------------------------------------------------

    async def run_point(self, spec: load.LoadSpec, on_tick: Callable[[load.Point], None] | None = None,
                        window: Any = None) -> dict:
        """Like load.run_point, with the lanes in the clients."""
        point = load.Point(spec)
        active = self._channels[:max(1, min(self.n, spec.concurrency, spec.turns or self.n))]
        for k, channel in enumerate(active):
            share = dataclasses.replace(spec, turns=_share(spec.turns, len(active), k))
            channel.send(("point", share, list(range(k, spec.concurrency, len(active))), point.t0), now=True)
        run = _Conducting(self._inbox, point, on_tick, window)
        if point.phase == load.WARMUP:
            if spec.warmup_s is None:
                await run.pump(lambda: len(run.warm) == len(active))
            else:
                await run.pump(seconds=spec.warmup_s)
            point.begin_measure()
            self._tell(active, "measure")
        if window is not None:
            window.start()
        if spec.turns is None:
            assert spec.duration_s is not None  # a point runs for a number of turns or seconds
            await run.pump(seconds=spec.duration_s)
            cpu = point.end_measure(window)
            point.phase = load.DRAIN
            self._tell(active, "stop")
            await run.pump(lambda: len(run.results) == len(active))
        else:
            await run.pump(lambda: len(run.results) == len(active))
            cpu = point.end_measure(window)
        for k in sorted(run.results):
            point.add(run.results[k])
        if on_tick is not None:
            on_tick(point)
        out = load.summarize(point, cpu)
        if len({target.address for target, _ in self.clients}) > 1:
            out["by_target"] = self._by_target(point, run.results)
        return out

    def _by_target(self, point: load.Point, results: dict[int, dict]) -> dict[str, dict]:
        """Per target of several, its clients' turns summarized alone (how
        evenly the sidecars carried the load): turns/s, errors, latencies."""
        mine: dict[str, load.Point] = {}
        for k, tally in sorted(results.items()):
            address = self.clients[k][0].address
            if address not in mine:
                mine[address] = load.Point(point.spec, t0=point.t0)
                mine[address].w0, mine[address].w1 = point.w0, point.w1
            mine[address].add(tally)
        keep = ("turns", "turns_per_s", "deltas_per_s", "first_delta_ms", "turn_ms", "error_count", "errors")
        return {address: {key: value for key, value in load.summarize(p, None).items() if key in keep}
                for address, p in mine.items()}

    @staticmethod
    def _tell(channels: list[Channel], what: str) -> None:
        for channel in channels:
            channel.send((what,), now=True)


def deal(sessions: int, clients: int, targets: int) -> list[tuple[int, int]]:
    """Per bench client ``k``: the target it drives (``k % targets``: the
    targets' loads differ by one client at most) and how many of the
    ``sessions`` are its own (an even share, the first ones one more)."""
    return [(k % targets, sessions // clients + (k < sessions % clients)) for k in range(clients)]


def _share(turns: int | None, n: int, k: int) -> int | None:
    """Client ``k``'s part of ``turns`` measured turns (None: a timed point)."""
    return None if turns is None else turns // n + (k < turns % n)


class _Conducting:
    """What the clients said during one point, read from the fleet's inbox;
    the progress line and the CPU window's samples every load.TICK_S."""

    def __init__(self, inbox: asyncio.Queue, point: load.Point,
                 on_tick: Callable[[load.Point], None] | None, window: Any):
        self.inbox, self.point, self.on_tick, self.window = inbox, point, on_tick, window
        self.snapshots: dict[int, dict] = {}
        self.warm: set[int] = set()
        self.results: dict[int, dict] = {}
        self.next_tick = time.monotonic() + load.TICK_S

    async def pump(self, done: Callable[[], bool] = lambda: False, seconds: float | None = None) -> None:
        """Take messages until ``done()``, or for ``seconds``."""
        end = None if seconds is None else time.monotonic() + seconds
        while not done():
            now = time.monotonic()
            if end is not None and now >= end:
                return
            if now >= self.next_tick:
                self._tick()
            wait = self.next_tick - now if end is None else min(self.next_tick, end) - now
            try:
                async with asyncio.timeout(max(wait, 0.0)):
                    k, msg = await self.inbox.get()
            except TimeoutError:
                continue
            self._take(k, msg)

    def _tick(self) -> None:
        self.next_tick += load.TICK_S
        if self.window is not None and self.point.counting:
            self.window.sample()
        if self.on_tick is not None:
            self.on_tick(self.point)

    def _take(self, k: int, msg: tuple) -> None:
        kind = msg[0]
        if kind == "tick":
            self.snapshots[k] = msg[1]
            self.point.progress(list(self.snapshots.values()))
        elif kind == "warm":
            self.warm.add(k)
        elif kind == "result":
            self.results[k] = msg[1]
        elif kind == "error":
            raise ClientLost(f"bench client {k}: {msg[1]}")
        elif kind == "lost":
            raise ClientLost(f"bench client {k} exited during the point")


# -- a client process -------------------------------------------------------------------

def client_main(pipe, target: Target, keys: list[str], seed: int, parent_pid: int, k: int) -> None:
    """The spawn target (children.spawn): connect, say ready, run the points
    the coordinator sends until it says ``close``."""
    from ..child import become_child
    become_child(f"bench-client-{k}", parent_pid, title=f"bench client {k}", nice=0)
    import uvloop
    uvloop.run(_serve(pipe, target, keys, seed))


async def _serve(pipe, target: Target, keys: list[str], seed: int) -> None:
    inbox: asyncio.Queue[tuple] = asyncio.Queue()
    gone = asyncio.Event()  # the coordinator closed our pipe (it ends the run, or it died)

    def closed() -> None:
        inbox.put_nowait(("close",))
        gone.set()

    channel = await open_channel(pipe.fileno(), inbox.put_nowait, closed, loads=pickle.loads, dumps=_dumps)
    pipe.close()
    try:
        client = await connect(target)
    except BenchError as e:
        channel.send(("error", str(e)), now=True)
        channel.close()
        return
    channel.send(("ready", os.getpid()), now=True)
    pool = load.SessionPool(keys, seed)
    try:
        while (msg := await inbox.get())[0] == "point":
            channel.send(("result", await _point(channel, inbox, gone, client, pool, *msg[1:])), now=True)
    except _Closing:  # the coordinator ends the run (or is gone) in the middle of a point
        pass
    except Exception as e:  # a bug or a broken channel: the coordinator ends the run with it
        channel.send(("error", f"{type(e).__name__}: {e}"), now=True)
    finally:
        await client.close()
        channel.close()


async def _point(channel: Channel, inbox: asyncio.Queue, gone: asyncio.Event, client: Any,
                 pool: load.SessionPool, spec: load.LoadSpec, lanes: list[int], t0: float) -> dict:
    """This client's share of one point (the module docstring's steps). It
    ends with ``_Closing`` as soon as the coordinator closes the pipe, in
    every phase: a point of turns reads no message after its warm-up, and
    against a lost target its turns fail one at a time for as long as it
    has turns, so the coordinator's close went unseen until it killed us."""
    point = load.Point(spec, lanes=len(lanes), t0=t0)
    tasks = load.start_lanes(client, pool, spec, point, lanes)
    ticker = asyncio.create_task(_ticks(channel, point))

    async def warmed() -> None:
        if spec.warmup_s is None:
            await point.all_warm.wait()
            channel.send(("warm",), now=True)
        await _expect(inbox, "measure")

    driving = asyncio.ensure_future(load.drive(point, tasks, warmed, functools.partial(_expect, inbox, "stop")))
    watching = asyncio.ensure_future(gone.wait())
    try:
        await asyncio.wait((driving, watching), return_when=asyncio.FIRST_COMPLETED)
        if not driving.done():
            raise _Closing()
        driving.result()  # what the point raised (_Closing, from a close read in its turn), raised here
    finally:
        for t in (driving, watching, ticker, *tasks):
            t.cancel()
        await asyncio.gather(driving, watching, ticker, *tasks, return_exceptions=True)
    return point.tally()


async def _ticks(channel: Channel, point: load.Point) -> None:
    while True:
        await asyncio.sleep(load.TICK_S)
        channel.send(("tick", point.snapshot()), now=True)


class _Closing(Exception):
    """The coordinator said ``close`` (or its pipe closed) before the point ended."""


async def _expect(inbox: asyncio.Queue, kind: str) -> None:
    msg = await inbox.get()
    if msg[0] == "close":
        raise _Closing()
    if msg[0] != kind:
        raise RuntimeError(f"expected {kind!r} from the coordinator, got {msg[0]!r}")

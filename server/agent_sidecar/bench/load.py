"""The load generator: N concurrent turns through the project's Python client,
one measured point at a time.

Why closed-loop lanes: a chat deployment's load is "N conversations each
waiting for its reply", so each of ``concurrency`` lanes runs one turn, waits
for its terminal frame, and starts the next. A lane takes a session that has
no turn in flight (picked at random among the idle ones), so no turn queues
behind another of its session unless there are fewer sessions than lanes;
then turns share sessions and ``delivery`` decides what happens to them.

A point has three phases. **Warm-up**: lanes start, spread evenly over
``ramp_s`` so they do not stream in lockstep (the bench spreads them over one
turn, options.ramp_for: a lane's later turns keep its first one's place in the
cycle, so the prompts then arrive evenly); it ends after ``warmup_s``, or
by default ("auto") once every lane has finished one turn, so the pipeline is
full and caches are warm. **Measure**: ``duration_s`` seconds, or until
``turns`` turns have started. **Drain**: no new turns; the ones in flight
finish. Rates count what happens inside the measure window (completions and
deltas of any turn, steady state); with ``turns`` the window runs until the
last measured turn ends. Latencies are those of the turns started in the
measure window, all of which finish during the drain, so a slow tail is never
cut off. Every turn of every phase is counted in ``totals``, which is what the
sidecar's store holds afterwards.

A prompt that runs no turn of its own is **absorbed**, not a turn: one sent
with ``steer`` that joined the running turn (its stream is ``accepted``,
``completed``, with no ``started``: the running turn read its text), and one
superseded by a newer prompt of its session (a follow-up burst, an interrupt
taking over a waiting prompt: ``superseded{by_request_id}``, its text runs in
the newer one's turn). Counted apart (``absorbed``), they are in no rate, no
latency and no error, and ``totals`` stays what the store holds.
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .target import BenchError
from .turns import (  # noqa: F401 - the phases, outcomes and summarize are load's too
    ABSORBED,
    COMPLETED,
    DRAIN,
    MEASURE,
    MERGED,
    STEERED,
    TURN_FAILED,
    WARMUP,
    Turn,
    summarize,
)

TICK_S = 0.5


@dataclass
class LoadSpec:
    concurrency: int
    text: str
    duration_s: float | None = 10.0
    turns: int | None = None
    warmup_s: float | None = None  # None: until every lane has finished one turn
    ramp_s: float = 1.0
    delivery: str = "queue"
    profile: str | None = None
    turn_timeout_s: float = 300.0
    resume_timeout_s: float = 30.0  # how long a turn whose stream broke tries to resume (the target's connect timeout)


def warmup_past_ramp(warmup_s: float | None, ramp_s: float, concurrency: int, timed: bool) -> float | None:
    """``--warmup`` seconds, but for a ``timed`` point never ending before
    the last lane's first turn has started (its place in the ramp: ``ramp_s
    * (c - 1) / c``; None, auto, waits for every lane's first turn to end
    anyway). A timed window opened during the ramp measured some of the
    lanes as all of them: at ``--warmup 0 --ramp 3``, four lanes of 0.2 s
    turns read 6.7 turns/s, not ~18. A point of ``--turns`` keeps its
    warm-up: with ``--warmup 0`` it sends exactly its turns."""
    if warmup_s is None or concurrency < 2 or not timed:
        return warmup_s
    return max(warmup_s, ramp_s * (concurrency - 1) / concurrency)


class SessionPool:
    """Session keys to hand to lanes: idle ones first, at random; when every
    session is busy, a random busy one (the turns then share it)."""

    def __init__(self, keys: list[str], seed: int = 1):
        self.keys = list(keys)
        self.idle = list(keys)
        self.in_use: Counter[str] = Counter()
        self.rng = random.Random(seed)

    def take(self) -> str:
        if self.idle:
            i = self.rng.randrange(len(self.idle))
            self.idle[i], self.idle[-1] = self.idle[-1], self.idle[i]
            key = self.idle.pop()
        else:
            key = self.rng.choice(self.keys)
        self.in_use[key] += 1
        return key

    def give(self, key: str) -> None:
        self.in_use[key] -= 1
        if not self.in_use[key]:
            del self.in_use[key]
            self.idle.append(key)


class Point:
    """The state of one running point; ``snapshot()`` feeds the progress line.
    ``lanes``: how many lanes it drives (default the spec's concurrency; a
    client process of a fleet drives a share, bench/fleet.py); ``t0``: the
    point's start (default now), which a fleet's processes share, so their
    per-second counts add up second by second."""

    def __init__(self, spec: LoadSpec, lanes: int | None = None, t0: float | None = None):
        self.spec = spec
        self.lanes = spec.concurrency if lanes is None else lanes
        self.phase = WARMUP if spec.warmup_s != 0 else MEASURE
        self.t0 = time.monotonic() if t0 is None else t0
        self.w0 = self.t0 if self.phase == MEASURE else None
        self.w1: float | None = None
        self.counting = self.phase == MEASURE
        self.turns: list[Turn] = []
        self.deltas_by_second: defaultdict[int, int] = defaultdict(int)
        self.deltas_total = 0
        self.window_deltas = 0
        self.window_words = 0
        self.window_done = 0
        self.window_tool_calls = 0
        self.measured_started = 0
        self.lanes_warm: set[int] = set()
        self.all_warm = asyncio.Event()
        self.measured_all_started = asyncio.Event()
        self.in_flight = 0
        self.done_total = 0
        self.errors_total = 0
        self.absorbed_total = 0
        if not self.lanes:
            self.all_warm.set()

    def begin_measure(self) -> None:
        self.phase, self.counting, self.w0 = MEASURE, True, time.monotonic()

    def end_measure(self, window: Any = None) -> dict | None:
        """The measure window ends now: nothing more is counted, and
        ``window`` (a procs.TreeWindow, or None) gives what it measured."""
        self.counting, self.w1 = False, time.monotonic()
        return window.stop() if window is not None else None

    def accepting(self) -> bool:
        if self.phase == DRAIN:
            return False
        if self.phase == MEASURE and self.spec.turns is not None:
            return self.measured_started < self.spec.turns
        return True

    def started(self, turn: Turn) -> None:
        self.turns.append(turn)
        self.in_flight += 1
        if turn.phase == MEASURE:
            self.measured_started += 1
            if self.spec.turns is not None and self.measured_started >= self.spec.turns:
                self.measured_all_started.set()

    def delta(self, now: float, words: int) -> None:
        self.deltas_by_second[int(now - self.t0)] += 1
        self.deltas_total += 1
        if self.counting:
            self.window_deltas += 1
            self.window_words += words

    def finished(self, lane: int, turn: Turn) -> None:
        self.in_flight -= 1
        ok = turn.outcome == COMPLETED
        absorbed = turn.outcome in ABSORBED
        self.done_total += ok
        self.absorbed_total += absorbed
        self.errors_total += not ok and not absorbed
        if self.counting:
            self.window_done += ok
            self.window_tool_calls += turn.tool_calls
        self.lanes_warm.add(lane)
        if len(self.lanes_warm) >= self.lanes:
            self.all_warm.set()

    def tally(self) -> dict:
        """What this point counted (its turns, its deltas per second, its
        window's counts), for a fleet's coordinator to ``add`` up."""
        return {"turns": self.turns, "deltas_by_second": dict(self.deltas_by_second),
                "window_deltas": self.window_deltas, "window_words": self.window_words,
                "window_done": self.window_done, "window_tool_calls": self.window_tool_calls}

    def add(self, tally: dict) -> None:
        """Count in another process's ``tally`` of the same point (same ``t0``)."""
        self.turns.extend(tally["turns"])
        for second, n in tally["deltas_by_second"].items():
            self.deltas_by_second[second] += n
        self.window_deltas += tally["window_deltas"]
        self.window_words += tally["window_words"]
        self.window_done += tally["window_done"]
        self.window_tool_calls += tally["window_tool_calls"]

    def progress(self, snapshots: list[dict]) -> None:
        """Show the sum of other processes' ``snapshot()`` counts as ours (a
        fleet's coordinator, for the progress line)."""
        self.done_total = sum(s["done"] for s in snapshots)
        self.errors_total = sum(s["errors"] for s in snapshots)
        self.absorbed_total = sum(s.get("absorbed", 0) for s in snapshots)
        self.in_flight = sum(s["in_flight"] for s in snapshots)
        self.deltas_total = sum(s["deltas"] for s in snapshots)
        self.measured_started = sum(s["measured_started"] for s in snapshots)

    def snapshot(self) -> dict:
        now = time.monotonic()
        return {"phase": self.phase, "elapsed": now - self.t0,
                "window_elapsed": (now - self.w0) if self.w0 else 0.0,
                "done": self.done_total, "errors": self.errors_total, "absorbed": self.absorbed_total,
                "in_flight": self.in_flight,
                "deltas": self.deltas_total, "measured_started": self.measured_started}


async def run_turn(client: Any, key: str, spec: LoadSpec, point: Point, lane: int) -> Turn:
    """One turn through ``client.prompt``; never raises for the turn's own
    failure (the reason goes into ``outcome``). A prompt the client itself
    refuses to send (InvalidArgument before any call: text that is not
    UTF-8, say) is the run's input, not a turn: BenchError, which ends the
    run. Counted as a turn, it
    failed with no await, so its lane sent the next at once, forever: the
    event loop never ran again (Ctrl-C included) and the turns held filled
    the memory (19 GB in a minute)."""
    from agent_sidecar_client import SidecarError

    try:
        stream = client.prompt(spec.text, session_key=key, delivery=spec.delivery, profile=spec.profile,
                               timeout=spec.turn_timeout_s, resume_timeout=spec.resume_timeout_s,
                               retry_refusals=False)  # a refusal is what the bench counts
    except (ValueError, SidecarError) as e:  # nothing was sent: prompt() only checks and builds
        raise BenchError(f"the client refuses to send the prompt: {e}") from None
    turn = Turn(phase=point.phase, start=time.monotonic())
    point.started(turn)
    try:
        async for frame in stream:
            kind = frame.WhichOneof("event")
            if kind == "started":
                turn.started = True
            elif kind == "text_delta":
                now = time.monotonic()
                words = len(frame.text_delta.text.split())
                if turn.first is None:
                    turn.first, turn.first_words = now, words
                turn.last = now
                turn.deltas += 1
                turn.words += words
                point.delta(now, words)
            elif kind == "accepted":
                turn.accepted = True
            elif kind == "tool_call":
                turn.tool_calls += 1
            elif kind == "completed":
                turn.outcome = COMPLETED if turn.started else STEERED  # no turn of its own: it joined one
            elif kind == "failed":
                turn.outcome = frame.failed.reason or "FAILED"
                turn.code, turn.message = TURN_FAILED, frame.failed.message
            elif kind == "superseded":  # by a newer prompt, which runs its text; by nothing: dropped (a reset)
                turn.outcome = MERGED if frame.superseded.by_request_id else "SUPERSEDED"
    except SidecarError as e:
        if not turn.outcome or turn.outcome in (COMPLETED, *ABSORBED):
            turn.outcome = e.reason or e.code.name
            turn.code, turn.message = e.code.name, e.message
        turn.retry_after = e.retry_delay or 0.0
    except asyncio.CancelledError:
        raise
    except Exception as e:  # a bug or transport oddity: count it, keep the load going
        turn.outcome = type(e).__name__
    if not turn.outcome:
        turn.outcome = "NO_TERMINAL_FRAME"
    turn.end = time.monotonic()
    point.finished(lane, turn)
    return turn


async def run_point(client: Any, pool: SessionPool, spec: LoadSpec,
                    on_tick: Callable[[Point], None] | None = None,
                    window: Any = None) -> dict:
    """Run one point and return its figures (see ``summarize``). ``window``
    (a procs.TreeWindow or None) is started and stopped with the measure
    window and sampled every tick."""
    point = Point(spec)

    async def ticker() -> None:
        while True:
            await asyncio.sleep(TICK_S)
            if window is not None and point.counting:
                window.sample()
            if on_tick is not None:
                on_tick(point)

    lanes = start_lanes(client, pool, spec, point, range(spec.concurrency))
    tick = asyncio.create_task(ticker())
    assert spec.turns is not None or spec.duration_s is not None  # a point runs for a number of turns or seconds
    try:
        warmed = point.all_warm.wait if spec.warmup_s is None else functools.partial(asyncio.sleep, spec.warmup_s)
        cpu = await drive(point, lanes, warmed, functools.partial(asyncio.sleep, spec.duration_s), window)
    finally:
        tick.cancel()
        for t in lanes:
            t.cancel()
        await asyncio.gather(tick, *lanes, return_exceptions=True)
    if on_tick is not None:
        on_tick(point)
    return summarize(point, cpu)


async def drive(point: Point, lanes: list[asyncio.Task], warmed: Callable[[], Awaitable[Any]],
                elapsed: Callable[[], Awaitable[Any]], window: Any = None) -> dict | None:
    """Take ``point`` through its phases while ``lanes`` run its turns: the
    warm-up until ``warmed()`` returns (skipped when the point has none),
    then the measure window, until ``elapsed()`` returns (a timed point) or
    until its turns have all started; then the drain. A timed window ends
    before the drain, a window of turns with it (its last turn's end).
    ``window`` (a procs.TreeWindow or None) is started and stopped with the
    measure window; returns what it measured. Here, a point's own timers
    say when; in a fleet's client process (bench/fleet.py), the bench's."""
    if point.phase == WARMUP:
        await wait_any(lanes, warmed())
        point.begin_measure()
    if window is not None:
        window.start()
    if point.spec.turns is None:
        await wait_any(lanes, elapsed())
        cpu = point.end_measure(window)
        point.phase = DRAIN
        await asyncio.gather(*lanes)
    else:
        await wait_any(lanes, point.measured_all_started.wait())
        point.phase = DRAIN
        await asyncio.gather(*lanes)
        cpu = point.end_measure(window)
    return cpu


def start_lanes(client: Any, pool: SessionPool, spec: LoadSpec, point: Point,
                lanes: Iterable[int]) -> list[asyncio.Task]:
    """A task per lane ``i`` of ``lanes``: its first turn waits for its place
    in the ramp (``i / concurrency`` of ``ramp_s``), then it runs turns back
    to back while the point accepts them. After an error that says when to
    come back (RetryInfo: OVERLOADED past the admission limits, AGENT_BUSY
    with reject_if_busy, 1 s) the lane waits that long, as an adapter does
    (the client's own default): sent again at once, the refusals came by the
    thousand a second (at 3,000 lanes, 5,860 OVERLOADED in a 2 s point),
    the sidecar busy refusing them while its admitted turns were measured."""

    async def lane(i: int) -> None:
        if spec.ramp_s and spec.concurrency > 1:
            await asyncio.sleep(spec.ramp_s * i / spec.concurrency)
        while point.accepting():
            key = pool.take()
            try:
                turn = await run_turn(client, key, spec, point, i)
            finally:
                pool.give(key)
            if turn.retry_after and point.accepting():
                await asyncio.sleep(turn.retry_after)

    return [asyncio.create_task(lane(i)) for i in lanes]


async def wait_any(lanes: list[asyncio.Task], awaitable) -> None:
    """Wait for ``awaitable`` (what it raises is raised here), or until every
    lane has stopped (a lane that raised re-raises here)."""
    waiter = asyncio.ensure_future(awaitable)
    try:
        while not waiter.done():
            running = [t for t in lanes if not t.done()]
            await asyncio.wait([waiter, *running], return_when=asyncio.FIRST_COMPLETED)
            for t in lanes:
                if t.done() and (error := t.exception()) is not None:
                    raise error
            if not running or all(t.done() for t in lanes):
                break
        if waiter.done():
            waiter.result()  # what it raised, raised here
    finally:
        if not waiter.done():
            waiter.cancel()

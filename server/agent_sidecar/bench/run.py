"""One bench run: connect, create sessions, calibrate, run every point against
the target (and the bare server), and return the JSON document.

The order matters for a fair comparison: points run from the lowest
concurrency up, the target and the bare server alternating at each one, so a
machine that slows down over the run slows both sides alike.

The ideal turn (what ``--slo`` is measured against) is, in this order: the
``--ideal`` given; the median turn of the calibration (``--calibrate`` turns
one at a time on the target before the sweep, default 3); the p50 turn of the
target's lowest point. The bare server's timing is ``--bare-latency-ms`` when
given, else read off the calibration (``bare_timing``): the median gap
between deltas (both the echo model and the bare server pace by deadline, so
a late wake-up does not add up); the deltas per turn (echo when it equals the
prompt's words); and when the first delta is due: one gap, plus the wait
beyond it when that is 25 ms or more (less is the sidecar's own overhead, not
the model's); with a coalescing sidecar (frames of several words, the first
sent at once), after the first frame's words at the pace of the later
frames' words. So the bare server streams the frames the sidecar sent, at
the model's times; ``--bare-latency-ms`` with the model's token latency
compares against a server streaming one frame per token instead.
"""

from __future__ import annotations

import asyncio
import functools
import os
import select
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import load, procs, report
from .fleet import Fleet
from .target import BenchError, Target, connect

if TYPE_CHECKING:  # the client is the bench extra's: imported where used
    from contextlib import AbstractAsyncContextManager

    from agent_sidecar_client import SidecarClient, ToolHost

FIRST_DELAY_FLOOR_MS = 25.0
DEFAULT_RAMP_S = 1.0  # --ramp auto with no ideal turn known (no --ideal, no calibration)
ONE_DELTA_FLOOR_MS = 5.0  # one delta per turn: below this its wait is overhead, not latency


@dataclass
class BenchOptions:
    target: Target
    text: str
    levels: list[int] = field(default_factory=lambda: [1])
    sweep: bool = False
    clients: int = 1  # client processes driving the points (bench/fleet.py); 1: this one
    profile: str | None = None
    platform: str = "bench"
    sessions: int | None = None
    duration_s: float | None = 10.0
    turns: int | None = None
    warmup_s: float | None = None
    ramp_s: float | None = None  # None: auto (ramp_for)
    delivery: str = "queue"
    tools: bool = False
    compare_bare: bool = False
    bare_latency_ms: float | None = None
    bare_first_delay_ms: float = 0.0
    ideal_s: float | None = None
    slo: float = 0.10
    first_delta_slo_ms: float | None = None  # the SLO's bound on the first delta's p99 (None: none)
    calibrate: int = 3
    pid: int | None = None
    turn_timeout_s: float = 300.0
    seed: int = 1


Status = Callable[[str, "load.Point | None"], None]


class BareProcess:
    """The bare server (bench/bare.py) in a child process, on the same kind of
    transport as the target: a Unix socket in a temporary directory, or TCP
    on 127.0.0.1."""

    def __init__(self, timing: dict, unix: bool):
        self.timing = timing
        self.dir = tempfile.mkdtemp(prefix="sidecar-bench-bare-")
        self.listen = f"unix:{self.dir}/bare.sock" if unix else "127.0.0.1:0"
        self.proc: subprocess.Popen | None = None
        self.address = ""

    def start(self, timeout: float = 30.0) -> str:
        args = [sys.executable, "-m", "agent_sidecar.bench.bare", "--listen", self.listen,
                "--token-latency-ms", str(self.timing["delta_gap_ms"]),
                "--first-delta-ms", str(self.timing["first_delta_ms"]),
                "--reply-deltas", str(self.timing["reply_deltas"]),
                "--delta-words", str(self.timing["delta_words"])]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stdout, stderr = self.proc.stdout, self.proc.stderr
        assert stdout is not None and stderr is not None  # PIPE
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([stdout], [], [], 0.2)
            if ready:
                line = stdout.readline()
                if line.startswith("serving "):
                    self.address = line.split(None, 1)[1].strip()
                    return self.address
            if self.proc.poll() is not None:
                err = (stderr.read() or "").strip().splitlines()
                raise BenchError(f"the bare server exited ({self.proc.returncode}): "
                                 f"{err[-1] if err else 'no output'}")
        self.stop()
        raise BenchError(f"the bare server did not start within {timeout:g}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        sock = os.path.join(self.dir, "bare.sock")
        if os.path.exists(sock):
            os.unlink(sock)
        try:
            os.rmdir(self.dir)
        except OSError:
            pass


def bare_timing(opts: BenchOptions, calibration: dict | None, words: int) -> dict:
    """How the bare server should stream: given, or read off the calibration.
    The gap is the one the client saw between deltas, as it is: the bare
    server paces by deadline (models/_text.paced), so a late wake-up does not
    add up over a turn. The first delta is due one gap after ``started``, or
    when the calibration saw it if that was FIRST_DELAY_FLOOR_MS or more
    later (the model's own wait before its first token; less is the
    sidecar's overhead, not the model's). A sidecar that coalesces sends a
    turn's first delta at once and then one frame of several words per
    window: then the first is due after its own words at the pace of the
    words in the later frames."""
    if opts.bare_latency_ms is not None or not calibration or not calibration.get("turns"):
        gap = opts.bare_latency_ms or 0.0
        return {"delta_gap_ms": gap, "first_delta_ms": gap + opts.bare_first_delay_ms,
                "reply_deltas": 0, "delta_words": 1,
                "source": "given" if opts.bare_latency_ms is not None else "default"}
    gap = calibration["delta_gap_ms"]["p50"]
    first = calibration["first_delta_ms"]["p50"] or 0.0
    per_turn = calibration["deltas_per_turn"] or 0
    if gap is None:  # one delta per turn: all the wait is before it
        gap = first_delta = first if first >= ONE_DELTA_FLOOR_MS else 0.0
    elif first - gap >= FIRST_DELAY_FLOOR_MS:
        first_delta = first
    else:
        first_delta = _coalesced_first(calibration, gap) or gap
    reply = 0 if round(per_turn) == words else max(1, round(per_turn))
    # Fixed deltas carry the words the sidecar's did (several when it coalesces),
    # so both sides stream as much text and CPU per word compares like for like.
    delta_words = max(1, round((calibration.get("words_per_turn") or 0) / per_turn)) if reply and per_turn else 1
    return {"delta_gap_ms": round(gap, 3), "first_delta_ms": round(first_delta, 3),
            "reply_deltas": reply, "delta_words": delta_words, "source": "calibrated"}


def _coalesced_first(calibration: dict, gap: float) -> float | None:
    """When a coalescing sidecar's first delta would come at the model's
    pace: its words at the pace of the words in the frames after it. None
    when the frames carry one word each (no coalescing seen)."""
    frames, words = calibration["deltas_per_turn"] or 0, calibration.get("words_per_turn") or 0
    first_words = calibration.get("first_delta_words") or 0
    if frames < 2 or words - first_words <= frames - 1:
        return None
    return first_words * gap * (frames - 1) / (words - first_words)


async def _sessions(client, opts: BenchOptions, n: int, prefix: str, where: str) -> list[str]:
    from agent_sidecar_client import SidecarError
    try:
        return await load.create_sessions(client, n, platform=opts.platform, prefix=prefix, profile=opts.profile)
    except SidecarError as e:
        raise BenchError(f"cannot create sessions on {where}: {e}") from None


def ramp_for(opts: BenchOptions, calibration: dict | None) -> tuple[float, str]:
    """How long the lanes' first turns are spread over, and why: ``--ramp``
    when given; else one ideal turn as known before the points
    (report.ideal_before_points: ``--ideal``, else the calibration's median
    turn), else DEFAULT_RAMP_S.

    Why one turn: each lane starts its next turn when its last one ends, so
    the spread of the first starts is the spread of every later one. Lanes
    started within a second, with turns of four, send their prompts in a
    burst of four times the mean rate every turn and then nothing: the
    prompts' first deltas then queue behind each other, and the bursts' big
    commits make each delta cheaper than a steady load's do."""
    if opts.ramp_s is not None:
        return opts.ramp_s, "given (--ramp)"
    ideal = report.ideal_before_points(opts.ideal_s, calibration)
    if ideal is not None:
        return ideal[0], f"one ideal turn: {ideal[1]}"
    return DEFAULT_RAMP_S, "default (no ideal turn known)"


def _spec(opts: BenchOptions, concurrency: int, ramp_s: float) -> load.LoadSpec:
    return load.LoadSpec(concurrency=concurrency, text=opts.text, duration_s=opts.duration_s, turns=opts.turns,
                         warmup_s=opts.warmup_s, ramp_s=ramp_s, delivery=opts.delivery,
                         profile=opts.profile, turn_timeout_s=opts.turn_timeout_s)


async def run_bench(opts: BenchOptions, status: Status) -> dict:
    """The whole run; returns the document (report.analyse() has completed it)."""
    run = _Run(opts, status)
    try:
        await run.setup()
        await run.calibrate()
        await run.start_bare()
        await run.sweep()
    finally:
        await run.teardown()
    return report.analyse(run.document())


class _Run:
    """The state of one run, so each step is a short method."""

    def __init__(self, opts: BenchOptions, status: Status):
        self.opts, self.status = opts, status
        self.started = time.time()
        self.run_id = uuid.uuid4().hex[:8]
        self.client: SidecarClient | None = None
        self.bare: BareProcess | None = None
        self.bare_client: SidecarClient | None = None
        self.host_ctx: AbstractAsyncContextManager[Any] | None = None
        self.tool_host: _BenchTools | None = None
        self.pid: int | None = None
        self.tree: list[tuple[str, int]] | None = None
        self.idle: list[dict] | None = None
        self.calibration: dict | None = None
        self.ramp: tuple[float, str] = (DEFAULT_RAMP_S, "")
        self.timing: dict | None = None
        self.keys: list[str] = []
        self.servers: list[_Server] = []
        self.fleets: list[Fleet] = []
        self.points: list[dict] = []

    async def setup(self) -> None:
        opts = self.opts
        self.client = await connect(opts.target)
        self.pid = opts.pid or procs.listening_pid(opts.target.address)
        self.tree = procs.process_tree(self.pid, "sidecar") if self.pid else None
        self.idle = procs.memory_snapshot(self.tree) if self.tree else None
        n = opts.sessions or max(opts.levels)
        self.status(f"creating {n} sessions", None)
        self.keys = await _sessions(self.client, opts, n, self.run_id, opts.target.address)
        self.pool = load.SessionPool(self.keys, opts.seed)
        self.servers.append(await self._server("sidecar", opts.target, self.client, self.keys, self.tree))
        if opts.tools:
            self.tool_host = _tool_host(opts.platform)
            ctx = self.tool_host.host.running(self.client)
            try:
                await ctx.__aenter__()
            except Exception as e:
                raise BenchError(f"cannot host the bench tools on {opts.target.address}: {e}") from None
            self.host_ctx = ctx

    async def _server(self, name: str, target: Target, client: SidecarClient, keys: list[str],
                      tree: list[tuple[str, int]] | None) -> _Server:
        """How the points reach a server: through ``client`` here, or with
        ``--clients N`` through a fleet of N client processes."""
        if self.opts.clients == 1:
            pool = self.pool if name == "sidecar" else load.SessionPool(keys, self.opts.seed)
            return _Server(name, functools.partial(load.run_point, client, pool), tree)
        self.status(f"starting {self.opts.clients} client processes for {name}", None)
        fleet = Fleet(self.opts.clients, target, keys, self.opts.seed, name)
        self.fleets.append(fleet)
        await fleet.start()
        return _Server(name, fleet.run_point, tree, fleet.pids)

    async def calibrate(self) -> None:
        opts = self.opts
        if not opts.calibrate:
            return
        spec = load.LoadSpec(concurrency=1, text=opts.text, duration_s=None, turns=opts.calibrate, warmup_s=0,
                             ramp_s=0, delivery=opts.delivery, profile=opts.profile,
                             turn_timeout_s=opts.turn_timeout_s)
        self.calibration = await load.run_point(self.client, self.pool, spec,
                                                lambda p: self.status("calibrating", p))

    async def start_bare(self) -> None:
        opts = self.opts
        if not opts.compare_bare:
            return
        self.timing = bare_timing(opts, self.calibration, len(opts.text.split()))
        bare = self.bare = BareProcess(self.timing, unix=opts.target.address.startswith("unix:"))
        address = await asyncio.get_running_loop().run_in_executor(None, bare.start)
        assert bare.proc is not None  # start() ran it
        target = opts.target.plain(address)
        self.bare_client = await connect(target)
        keys = await _sessions(self.bare_client, opts, len(self.keys), self.run_id, "the bare server")
        self.servers.append(await self._server("bare", target, self.bare_client, keys,
                                               procs.process_tree(bare.proc.pid, "bare")))

    async def sweep(self) -> None:
        self.ramp = ramp_for(self.opts, self.calibration)
        levels = self.opts.levels
        for i, level in enumerate(levels):
            for server in self.servers:
                label = f"{server.name} c={level} [{i + 1}/{len(levels)}]"
                tree = server.tree
                if tree:  # re-read per point: a crashed worker's replacement is a new pid
                    tree = procs.process_tree(tree[0][1], tree[0][0])
                window = procs.TreeWindow(tree, server.bench_pids) if tree else None
                result = await server.run_point(_spec(self.opts, level, self.ramp[0]),
                                                functools.partial(self.status, label), window)
                self.points.append({"server": server.name, "concurrency": level, **result})
                self.status(f"done {label}: {_brief(result)}", None)

    async def teardown(self) -> None:
        for fleet in self.fleets:
            await fleet.close()
        if self.host_ctx is not None:
            await self.host_ctx.__aexit__(None, None, None)
        if self.bare_client is not None:
            await self.bare_client.close()
        if self.client is not None:
            await self.client.close()
        if self.bare is not None:
            self.bare.stop()

    def document(self) -> dict:
        return {"version": 1, "started_at": self.started, "finished_at": time.time(), "run_id": self.run_id,
                "options": report.options_dict(self.opts), "machine": report.machine(),
                "sidecar_pid": self.pid, "local": self.tree is not None, "idle_memory": self.idle,
                "sessions": {"platform": self.opts.platform, "count": len(self.keys), "keys": self.keys},
                "calibration": self.calibration, "ramp": {"s": self.ramp[0], "source": self.ramp[1]},
                "bare": self.timing, "points": self.points,
                "tool_invocations": self.tool_host.invocations if self.tool_host else None}


@dataclass
class _Server:
    """A server the points run against: ``run_point(spec, on_tick, window)``
    (load.run_point, or a fleet's), its process tree when it is local, and
    the bench's client processes that drive it (none: this one alone)."""
    name: str
    run_point: Callable[..., Awaitable[dict]]
    tree: list[tuple[str, int]] | None
    bench_pids: list[int] = field(default_factory=list)


def _brief(result: dict) -> str:
    p99 = result["turn_ms"]["p99"]
    return (f"{result['turns_per_s']:,.1f} turns/s, {result['deltas_per_s']:,.0f} deltas/s, turn p99 "
            + ("-" if p99 is None else f"{p99:,.0f} ms") + f", {result['error_count']} errors")


@dataclass
class _BenchTools:
    """The bench's own tool host and the invocations it has answered."""
    host: ToolHost
    invocations: int = 0


def _tool_host(namespace: str) -> _BenchTools:
    """The bench's own tool host: ``<ns>.echo(text)`` and ``<ns>.sleep(ms)``,
    counting the invocations it answers (``.invocations``)."""
    from agent_sidecar_client import ToolHost

    tools = _BenchTools(ToolHost(namespace))

    @tools.host.tool(description="Return the text it is given.")
    async def echo(text: str = "") -> str:
        tools.invocations += 1
        return text

    @tools.host.tool(description="Wait ms milliseconds, then return them.")
    async def sleep(ms: int = 0) -> int:
        tools.invocations += 1
        await asyncio.sleep(max(0, ms) / 1000)
        return ms

    return tools

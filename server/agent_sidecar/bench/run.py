"""One bench run: connect, create sessions, calibrate, run every point against
the target (and the bare server), and return the JSON document.

The order matters for a fair comparison: points run from the lowest
concurrency up, the target and the bare server alternating at each one, so a
machine that slows down over the run slows both sides alike. With
``--find-knee`` the levels go on past the sweep's, for the servers that have
not missed the SLO yet (``_Run._find_knees``). With ``--repeat N`` the whole
sweep (its levels past the sweep too) runs N times, one after another, on the
same sessions and bare server; each point carries its ``round``, and the
report gives each round's knee and their median.

The ideal turn (what ``--slo`` is measured against) is, in this order: the
``--ideal`` given; the median turn of the calibration (``--calibrate`` turns
one at a time on one session of the target before the sweep, default 3,
after a warm-up there: _Run.calibrate); the p50 turn of the target's
lowest point. The bare server's timing is ``--bare-latency-ms`` when
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
import itertools
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import load, procs, report, sessions, sockets
from .bare_process import BareProcess, bare_timing
from .fleet import Fleet, deal
from .options import DEFAULT_RAMP_S, BenchOptions, calibration_spec, point_spec, ramp_for
from .target import BenchError, ClientLost, Target, TargetLost, check_answers, connect
from .tools import BenchTools, tool_host
from .turns import check_refused

if TYPE_CHECKING:  # the client is the bench extra's: imported where used
    from contextlib import AbstractAsyncContextManager

    from agent_sidecar_client import SidecarClient

WATCH_S = 1.0  # how often the targets are asked for their connection while a point of theirs runs
INTERRUPTED_BY_SIGNAL = "SIGINT"  # the document's interrupted.reason after a Ctrl-C
# interrupted.reason and .message per signal that stops a run (SIGTERM: `timeout 60 agent-sidecar bench`)
STOPPED_BY = {"SIGINT": "stopped by Ctrl-C (SIGINT)", "SIGTERM": "stopped by SIGTERM"}

Status = Callable[[str, "load.Point | None"], None]


async def run_bench(opts: BenchOptions, status: Status,
                    stopped_by: Callable[[], str] = lambda: INTERRUPTED_BY_SIGNAL) -> dict:
    """The whole run; returns the document (report.analyse() has completed it).

    Cancelled (Ctrl-C: asyncio.Runner cancels this task; SIGTERM, when the
    caller cancels it so: ``stopped_by()`` names the signal), finding before
    a point that a target stopped answering (TargetLost), or losing a bench
    client process (ClientLost: it died, or failed), once some point has
    finished, it stops there, tears down as usual and returns the document of
    the finished points, its ``interrupted`` saying where and why (a point
    cut short is in no figure): a long sweep stopped early keeps what it
    measured. Before any point has finished, both are raised, with a note
    of the run's sessions its teardown could not delete (no report follows
    to say so: a target lost while they were made leaves them in its store)."""
    run = _Run(opts, status, stopped_by)
    try:
        await _steps(run, stopped_by)
    except BaseException as e:
        await run.teardown()
        if run.cleanup and run.cleanup["left"]:
            e.add_note(f"{run.cleanup['left']:,} of the run's sessions (platform {opts.platform!r}) are left in "
                       f"the target's store: {run.cleanup['error']}")
        raise
    await run.teardown()
    return report.analyse(run.document())


async def _steps(run: _Run, stopped_by: Callable[[], str]) -> None:
    """The run's steps; an end that leaves finished points is the run's end (run.interrupted), not an error."""
    try:
        await run.setup()
        await run.calibrate()
        await run.start_bare()
        await run.sweep()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if not run.points or task is None:
            raise
        task.uncancel()  # handled: the run ends here, with its report
        by = stopped_by()
        run.interrupted = {"at": run.running or "between points", "reason": by, "message": STOPPED_BY[by],
                           "when": "during"}
    except (TargetLost, ClientLost) as e:
        if not run.points:
            raise
        lost = isinstance(e, TargetLost)
        before = isinstance(e, TargetLost) and not e.during
        run.interrupted = {"at": run.running or "between points", "reason": "TARGET_LOST" if lost else "CLIENT_LOST",
                           "message": str(e), "when": "before" if before else "during"}


class _Run:
    """The state of one run, so each step is a short method."""

    def __init__(self, opts: BenchOptions, status: Status, stopped_by: Callable[[], str]):
        self.opts, self.status, self.stopped_by = opts, status, stopped_by
        self.started = time.time()
        self.run_id = uuid.uuid4().hex[:8]
        self.mains: list[SidecarClient] = []  # this process's client of each target
        self.bare: BareProcess | None = None
        self.bare_client: SidecarClient | None = None
        self.host_ctxs: list[AbstractAsyncContextManager[Any]] = []
        self.tool_hosts: list[BenchTools] = []
        self.pid: int | None = None
        self.tree: list[tuple[str, int]] | None = None
        self.idle: list[dict] | None = None
        self.calibration: dict | None = None
        self.ramp: tuple[float, str] = (DEFAULT_RAMP_S, "")
        self.timing: dict | None = None
        self.shares: list[tuple[Target, list[str]]] = []  # each bench client's target and sessions
        self.made: dict[Target, list[str]] = {}  # every session made on each target, as it was made
        self.servers: list[_Server] = []
        self.fleets: list[Fleet] = []
        self.points: list[dict] = []
        self.running: str | None = None  # the point under way (or about to be), by its progress label
        self.interrupted: dict | None = None  # where and why the run ended early (run_bench)
        self.cleanup: dict | None = None  # what became of the run's sessions (sessions.delete)

    @property
    def keys(self) -> list[str]:
        return [key for _, keys in self.shares for key in keys]

    async def setup(self) -> None:
        opts = self.opts
        if opts.pid is not None and not procs.exists(opts.pid):
            raise BenchError(f"--pid {opts.pid}: no such process on this host (nothing in /proc/{opts.pid})")
        for target in opts.targets:
            self.mains.append(await connect(target))
        if len(opts.targets) == 1:  # CPU and memory: one sidecar's tree
            self.pid = opts.pid or sockets.listening_pid(opts.target.address)
            self.tree = procs.process_tree(self.pid, "sidecar") if self.pid else None
            self.idle = procs.memory_snapshot(self.tree) if self.tree else None
        n = opts.session_count
        self.status(f"creating {n} sessions", None)
        self.shares = await self._sessions_per_client(n)
        self.servers.append(await self._server("sidecar", self.mains[0], self.shares, self.tree))
        if opts.tools:
            for target, client in zip(opts.targets, self.mains):
                await self._host_tools(target, client)

    async def _sessions_per_client(self, n: int) -> list[tuple[Target, list[str]]]:
        """``n`` sessions, dealt to the bench's clients as fleet.deal says,
        each created through the target its client drives (the targets may
        be sidecars with stores of their own)."""
        opts = self.opts
        shares = deal(n, opts.clients, len(opts.targets))
        made: list[Iterator[str]] = []
        for t, (target, client) in enumerate(zip(opts.targets, self.mains)):
            prefix = self.run_id if t == 0 else f"{self.run_id}-t{t}"
            want = sum(count for where, count in shares if where == t)
            made.append(iter(await sessions.create(client, opts.platform, opts.profile, want, prefix, target.address,
                                                   self.made.setdefault(target, []))))
        return [(opts.targets[t], list(itertools.islice(made[t], count))) for t, count in shares]

    async def _host_tools(self, target: Target, client: SidecarClient) -> None:
        tools = tool_host(self.opts.platform)
        ctx = tools.host.running(client)
        try:
            await ctx.__aenter__()
        except Exception as e:
            raise BenchError(f"cannot host the bench tools on {target.address}: {e}") from None
        self.tool_hosts.append(tools)
        self.host_ctxs.append(ctx)

    async def _server(self, name: str, client: SidecarClient, shares: list[tuple[Target, list[str]]],
                      tree: list[tuple[str, int]] | None) -> _Server:
        """How the points reach a server: through ``client`` here, or with
        ``--clients N`` (or several targets) through a fleet of client processes."""
        if len(shares) == 1:
            pool = load.SessionPool(shares[0][1], self.opts.seed)
            return _Server(name, functools.partial(load.run_point, client, pool), tree)
        self.status(f"starting {len(shares)} client processes for {name}", None)
        fleet = Fleet(shares, self.opts.seed, name)
        self.fleets.append(fleet)
        await fleet.start()
        return _Server(name, fleet.run_point, tree, fleet.pids)

    async def calibrate(self) -> None:
        """``--calibrate`` turns one at a time through the first target, on
        one session, after a warm-up there (load's auto: its first turn;
        in ``totals`` only): a
        session runs on one worker slot, whose first turn is slower (100-200
        ms on a fresh echo sidecar). Spread over fresh sessions, most turns
        met a cold worker, and the ideal turn (their median) came out up to
        7x the unhurried one on a sidecar just started, the SLO with it."""
        opts = self.opts
        if not opts.calibrate:
            return
        pool = load.SessionPool(self.shares[0][1][:1], opts.seed)
        self.calibration = await self._watched(load.run_point(self.mains[0], pool, calibration_spec(opts),
                                                              lambda p: self.status("calibrating", p)))
        check_refused(self.calibration, "the calibration")

    async def start_bare(self) -> None:
        opts = self.opts
        if not opts.compare_bare:
            return
        self.timing = bare_timing(opts, self.calibration, len(opts.text.split()))
        bare = self.bare = BareProcess(self.timing, unix=opts.target.unix)
        address = await asyncio.get_running_loop().run_in_executor(None, bare.start)
        assert bare.proc is not None  # start() ran it
        target = opts.target.plain(address)
        self.bare_client = await connect(target)
        keys = iter(await sessions.create(self.bare_client, opts.platform, opts.profile, len(self.keys), self.run_id,
                                          "the bare server"))
        shares = [(target, list(itertools.islice(keys, len(mine)))) for _, mine in self.shares]  # as many each
        self.servers.append(await self._server("bare", self.bare_client, shares,
                                               procs.process_tree(bare.proc.pid, "bare")))

    async def sweep(self) -> None:
        self.ramp = ramp_for(self.opts, self.calibration)
        levels, rounds = self.opts.levels, self.opts.repeat
        for r in range(1, rounds + 1):
            of = f", sweep {r}/{rounds}" if rounds > 1 else ""
            for i, level in enumerate(levels):
                await self._point(self.servers, level, f"[{i + 1}/{len(levels)}{of}]", r)
            if self.opts.find_knee:
                await self._find_knees(self.opts.find_knee, r, of)

    async def _find_knees(self, top: int, r: int, of: str) -> None:
        """``--find-knee``: past the listed levels, one more level at a time
        (report.next_level) for each server that met the SLO at every point so
        far in round ``r``, judged as the report will judge it, until each has
        a failing point or the next level would pass ``top``. A server that
        failed already runs no more points in this round: its knee is known."""
        level = max(self.opts.levels)
        while (level := report.next_level(level)) <= top:
            doc = report.analyse(self.document())
            going = [s for s in self.servers
                     if all(p["within_slo"] for p in doc["points"] if p["server"] == s.name and p["round"] == r)]
            if not going:
                return
            await self._point(going, level, f"[past the sweep, up to {top}{of}]", r)

    async def _point(self, servers: list[_Server], level: int, where: str, r: int) -> None:
        """One level's point on each of ``servers``, in turn, in round ``r``;
        the targets are asked for a connection first (check_answers), so a
        sidecar that died in the last point ends the run here instead of
        every later turn waiting out its resume; and again after a point of
        theirs that had failed turns, which is dropped when a target no
        longer answers (its errors are the crash's, not figures)."""
        for server in servers:
            label = self.running = f"{server.name} c={level} {where}"
            if server.name == "sidecar":
                await self._check_targets()
            tree = server.tree
            if tree:  # re-read per point: a crashed worker's replacement is a new pid
                tree = procs.process_tree(tree[0][1], tree[0][0])
            window = procs.TreeWindow(tree, server.bench_pids, _peers_of(tree, server.bench_pids)) if tree else None
            point = server.run_point(point_spec(self.opts, level, self.ramp[0]), functools.partial(self.status, label),
                                     window)
            result = await (self._watched(point) if server.name == "sidecar" else point)
            if server.name == "sidecar" and (result["totals"]["failed"] or result["totals"]["refused"]):
                await self._check_targets(during=True)
                if not any(p["server"] == "sidecar" for p in self.points):
                    check_refused(result, label)
            self.running = None
            self.points.append({"server": server.name, "concurrency": level, "round": r, **result})
            self.status(f"done {label}: {_brief(result)}", None)

    async def _watched(self, point: Awaitable[dict]) -> dict:
        """``point`` (of the targets, or the calibration), each target asked
        every WATCH_S for its connection: one lost ends it, TargetLost (during
        it); a point of --turns went on failing its turns against a dead one."""
        task = asyncio.ensure_future(point)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=WATCH_S)
                if done:
                    return task.result()
                await self._check_targets(during=True)
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def _check_targets(self, during: bool = False) -> None:
        """TargetLost when a target does not answer (``during``: the point
        under way, ``self.running``, was hit by it)."""
        for target, client in zip(self.opts.targets, self.mains):
            try:
                await check_answers(target, client)
            except TargetLost as e:
                e.during = during
                raise

    async def teardown(self) -> None:
        for fleet in self.fleets:
            await fleet.close()
        for ctx in self.host_ctxs:
            await ctx.__aexit__(None, None, None)
        if any(self.made.values()) and not self.opts.keep_sessions:  # after the clients' lanes have ended
            self.cleanup = await sessions.delete([(t, c, self.made.get(t, [])) for t, c in zip(self.opts.targets,
                                                  self.mains)], lambda text: self.status(text, None),
                                           self.stopped_by)
        for client in [self.bare_client, *self.mains]:
            if client is not None:
                await client.close()
        if self.bare is not None:
            self.bare.stop()

    def document(self) -> dict:
        by_target: dict[str, list[str]] = {}
        for target, keys in self.shares:
            by_target.setdefault(target.address, []).extend(keys)
        return {"version": 1, "started_at": self.started, "finished_at": time.time(), "run_id": self.run_id,
                "options": report.options_dict(self.opts), "machine": report.machine(),
                "sidecar_pid": self.pid, "local": self.tree is not None, "idle_memory": self.idle,
                "sessions": {"platform": self.opts.platform, "count": len(self.keys), "keys": self.keys,
                             "by_target": by_target, "kept": self.opts.keep_sessions, **(self.cleanup or {})},
                "calibration": self.calibration, "ramp": {"s": self.ramp[0], "source": self.ramp[1]},
                "bare": self.timing, "points": self.points, "interrupted": self.interrupted,
                "tool_invocations": sum(t.invocations for t in self.tool_hosts) if self.tool_hosts else None}


@dataclass
class _Server:
    """A server the points run against: ``run_point(spec, on_tick, window)``
    (load.run_point, or a fleet's), its process tree when it is local, and
    the bench's client processes that drive it (none: this one alone)."""
    name: str
    run_point: Callable[..., Awaitable[dict]]
    tree: list[tuple[str, int]] | None
    bench_pids: list[int] = field(default_factory=list)


def _peers_of(tree: list[tuple[str, int]], bench: list[int]) -> Callable[..., list[tuple[str, int]]]:
    """What finds the processes serving ``tree``'s own connections (its
    PostgreSQL backends), none of the bench's, given where to look
    (sockets.peers_of's ``among``)."""
    import os
    pids, exclude = [pid for _, pid in tree], {os.getpid(), *bench}
    return lambda among: sockets.peers_of(pids, exclude, among)


def _brief(result: dict) -> str:
    p99 = result["turn_ms"]["p99"]
    return (f"{result['turns_per_s']:,.1f} turns/s, {result['deltas_per_s']:,.0f} deltas/s, turn p99 "
            + ("-" if p99 is None else f"{p99:,.0f} ms") + f", {result['error_count']} errors")

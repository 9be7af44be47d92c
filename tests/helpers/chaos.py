"""A chaos soak: adapters keep prompting every lane of one sidecar or of a
cluster's nodes, in all six delivery modes, with admin calls between, while
faults strike at random; then every acknowledged request is read back through
gRPC and checked.

    soak = Soak(nodes, seed=7, server=pg_server_or_None, disk=small_disk_or_None)
    report = soak.run(seconds)
    assert not report.violations, report

The faults: a node killed -9 (down a while, started again), its writer
killed -9 (the node exits; started again), one of its workers killed -9 or
stopped (SIGSTOP) a while, the whole node stopped a while, a clean stop
(SIGTERM, which must exit 0) and start; with ``server``, a PostgreSQL server
this soak may stop (``pg_ctl -m fast`` or ``immediate``, then started again)
and whose connections it may cut (``pg_terminate_backend``); with ``disk``,
the small filesystem a SQLite store is on, filled up a while
(helpers/disk.py). A fault that takes a node out strikes only while another
node is up, so adapters always have one to call (on one sidecar: they retry
until it is back).

Adapters read most streams at once, some slowly, and walk away from some
after a few frames to come back with the same request id (``Reader``).

What every acknowledged request must show afterwards (``Report.violations``
lists each one that does not): its frames from seq 1 without a gap, exactly one
terminal frame, at most one ``started``; and no two turns of one lane overlap.
Along the way no call may end ``INTERNAL`` or ``UNKNOWN``, and no refusal may
come without the ErrorInfo reason the API promises.

Seeded: the same seed draws the same prompts, modes and fault schedule (the
timing still varies). ``CHAOS_SEED`` and ``CHAOS_SECONDS`` override a test's
seed and length, for soaking longer (``make soak``).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import grpc
from sidecar_proc import Sidecar, error_info

from agent_sidecar.v1 import prompt_service_pb2 as ppb
from agent_sidecar.v1 import prompt_service_pb2_grpc as ppb_grpc
from agent_sidecar.v1 import session_service_pb2 as spb
from agent_sidecar.v1 import session_service_pb2_grpc as spb_grpc

from . import pg, procs
from .disk import SmallDisk
from .ids import rid, source
from .streams import TERMINAL, PromptRun, kind_of, watch

MODES = [ppb.DeliveryMode.Value(f"DELIVERY_MODE_{m}")
         for m in ("QUEUE", "FOLLOW_UP", "INTERRUPT", "ROLLBACK", "STEER", "REJECT_IF_BUSY")]
RETRY = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
BROKEN = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
CALL_TIMEOUT = 20
NODE_FAULTS = ("kill", "writer", "worker", "worker_stop", "node_stop", "term")
SERVER_FAULTS = ("pg_down", "pg_kick")
DISK_FAULTS = ("disk_full",)


def seed_and_seconds(seed: int, seconds: float) -> tuple[int, float]:
    """A test's own seed and length, unless CHAOS_SEED / CHAOS_SECONDS say otherwise."""
    return int(os.environ.get("CHAOS_SEED", seed)), float(os.environ.get("CHAOS_SECONDS", seconds))


@dataclass(repr=False)
class Report:
    """What one soak did and saw; its repr is the summary a failing assert prints."""

    seed: int
    acknowledged: int = 0
    calls: int = 0
    faults: list[str] = field(default_factory=list)
    ends: Counter = field(default_factory=Counter)
    refusals: Counter = field(default_factory=Counter)
    admin: Counter = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        lines = [f"seed {self.seed}: {self.acknowledged} acknowledged of {self.calls} calls",
                 f"faults: {', '.join(self.faults)}", f"ends: {dict(self.ends)}",
                 f"refusals: {dict(self.refusals)}", f"admin calls: {dict(self.admin)}",
                 f"violations ({len(self.violations)}):", *self.violations[:30]]
        return "\n  ".join(lines)


class Reader:
    """How an adapter reads one Prompt stream (the ``stop`` of its PromptRun):
    mostly at once; sometimes slowly (a pause after every frame); sometimes it
    walks away after a few frames (the call cancelled), as an adapter that
    restarts does, and comes back with the same request id."""

    def __init__(self, rng: random.Random):
        self.style = rng.choices(["prompt", "slow", "walk_away"], weights=[8, 1, 1])[0]
        self.frames_left = rng.randint(1, 6)
        self.walked_away = False

    def __call__(self, frame) -> bool:
        if self.style == "slow":
            time.sleep(0.05)
        elif self.style == "walk_away" and kind_of(frame) not in TERMINAL:
            self.frames_left -= 1
            self.walked_away = self.frames_left == 0
        return self.walked_away


class Soak:
    """One soak over ``nodes`` (one Sidecar, or a Cluster's nodes) with
    ``lanes`` adapters, each prompting its own lane, and one admin caller.
    They call each node on one channel of the soak's own, kept across the
    node's restarts, as an adapter's would be."""

    def __init__(self, nodes: list[Sidecar], seed: int, server: pg.PgServer | None = None,
                 disk: SmallDisk | None = None, lanes: int = 10):
        self.nodes, self.server, self.disk = list(nodes), server, disk
        self.channels = [grpc.insecure_channel(n.target) for n in self.nodes]
        self.rng = random.Random(seed)
        self.report = Report(seed)
        self.sources = [source("telegram") for _ in range(lanes)]
        self.acked: dict[str, int] = {}  # request id -> lane
        self.down: set[int] = set()  # nodes the fault thread has taken out
        self.lock = threading.Lock()
        self.stop = threading.Event()

    # -- the run ------------------------------------------------------------------

    def run(self, seconds: float) -> Report:
        threads = [threading.Thread(target=self._guarded, args=(self._adapter, lane), daemon=True)
                   for lane in range(len(self.sources))]
        threads += [threading.Thread(target=self._guarded, args=(fn,), daemon=True)
                    for fn in (self._admin, self._faults)]
        for t in threads:
            t.start()
        self.stop.wait(seconds)
        self.stop.set()
        for t in threads:
            t.join(120)
            if t.is_alive():
                self.report.violations.append(f"{t.name} still running 120 s after the soak ended")
        self._all_up()
        self.report.acknowledged = len(self.acked)
        self._check_ends()
        for channel in self.channels:
            channel.close()
        return self.report

    def _guarded(self, fn, *args) -> None:
        """A thread's body: what it raises is a violation, not a quietly lost thread."""
        try:
            fn(*args)
        except Exception as e:
            self._violation(f"{fn.__name__}{args} raised {e!r}")

    def _live(self) -> list[int]:
        return [i for i in range(len(self.nodes)) if i not in self.down]

    def _prompts(self, i: int):
        return ppb_grpc.PromptServiceStub(self.channels[i])

    def _violation(self, what: str) -> None:
        with self.lock:
            self.report.violations.append(what)

    # -- adapters -----------------------------------------------------------------

    def _adapter(self, lane: int) -> None:
        rng = random.Random(self.report.seed * 100 + lane)
        while not self.stop.is_set():
            self._prompt(lane, rng, rid(f"soak{lane}"), rng.choice(MODES))
            time.sleep(rng.random() * 0.3)

    def _prompt(self, lane: int, rng: random.Random, request_id: str, mode: int) -> None:
        """One request, retried with its id until it ends or is refused, as an
        adapter whose sidecar went away would."""
        req = ppb.PromptRequest(request_id=request_id, text="words " * rng.randint(1, 15),
                                source=self.sources[lane], delivery=mode)
        for _ in range(100):
            live = self._live()
            if not live:
                time.sleep(0.2)
                continue
            reader = Reader(rng)
            run = PromptRun(self._prompts(rng.choice(live)), req, timeout=CALL_TIMEOUT,
                            stop=reader, background=False)
            kinds = run.kinds()
            with self.lock:
                self.report.calls += 1
                if "accepted" in kinds:
                    self.acked[request_id] = lane
            if kinds and kinds[-1] in TERMINAL:
                return
            if run.code not in RETRY and not reader.walked_away:
                self._refused(request_id, run)
                return
            time.sleep(0.2)
        self._violation(f"{request_id}: still retried after 100 calls")

    def _refused(self, request_id: str, run: PromptRun) -> None:
        with self.lock:
            self.report.refusals[f"{run.code.name}/{run.reason}"] += 1
        if run.code in BROKEN or run.reason is None or run.reason != "AGENT_BUSY":
            self._violation(f"{request_id}: ended {run.code.name} / {run.reason}: {run.details} "
                            f"after {run.kinds()}")

    # -- admin calls --------------------------------------------------------------

    def _admin(self) -> None:
        rng = random.Random(self.report.seed * 7)
        while not self.stop.wait(rng.uniform(0.3, 1.5)):
            live = self._live()
            if not live:
                continue
            node, src, op = rng.choice(live), rng.choice(self.sources), rng.choice(
                ["cancel", "queue", "reset", "suspend", "rewind"])
            try:
                self._admin_call(self.channels[node], src, op)
                outcome = "OK"
            except grpc.RpcError as e:
                reason = error_info(e)[0]
                outcome = f"{e.code().name}/{reason}"
                if e.code() in BROKEN or (reason is None and e.code() not in RETRY):
                    self._violation(f"admin {op}: {outcome}: {e.details()}")
            with self.lock:
                self.report.admin[f"{op} {outcome}"] += 1

    @staticmethod
    def _admin_call(channel: grpc.Channel, src, op: str) -> None:
        key = f"agent:main:telegram:dm:{src.chat_id}"
        prompts, sessions = ppb_grpc.PromptServiceStub(channel), spb_grpc.SessionServiceStub(channel)
        if op == "cancel":
            prompts.Cancel(ppb.CancelRequest(session_key=key), timeout=CALL_TIMEOUT)
        elif op == "queue":
            prompts.GetQueue(ppb.GetQueueRequest(session_key=key), timeout=CALL_TIMEOUT)
        elif op == "reset":
            sessions.ResetSession(spb.ResetSessionRequest(session_key=key), timeout=CALL_TIMEOUT)
        elif op == "suspend":
            sessions.SuspendSession(spb.SuspendSessionRequest(session_key=key), timeout=CALL_TIMEOUT)
        else:
            got = sessions.GetOrCreateSession(spb.GetOrCreateSessionRequest(source=src),
                                              timeout=CALL_TIMEOUT)
            sessions.RewindSession(spb.RewindSessionRequest(session_id=got.session.session_id, n=1),
                                   timeout=CALL_TIMEOUT)

    # -- faults -------------------------------------------------------------------

    def _faults(self) -> None:
        kinds = NODE_FAULTS + (SERVER_FAULTS if self.server is not None else ()) + (
            DISK_FAULTS if self.disk is not None else ())
        while not self.stop.wait(self.rng.uniform(2, 6)):
            kind, i = self.rng.choice(kinds), self.rng.randrange(len(self.nodes))
            if kind in SERVER_FAULTS:
                self._server_fault(kind)
            elif kind in DISK_FAULTS:
                self._disk_full()
            elif i not in self.down and (len(self.nodes) == 1 or len(self._live()) > 1):
                self._node_fault(kind, i)

    def _note(self, what: str) -> None:
        with self.lock:
            self.report.faults.append(f"{time.strftime('%X')} {what}")

    def _node_fault(self, kind: str, i: int) -> None:
        node, kids = self.nodes[i], procs.children(self.nodes[i])
        workers = [pid for name, pid in kids.items() if name.startswith("sidecar-work-")]
        self._note(f"{kind} node {i}")
        if kind in ("worker", "worker_stop") and workers:
            pid = self.rng.choice(workers)
            if kind == "worker":
                os.kill(pid, signal.SIGKILL)
            else:
                self._stopped_a_while(pid)
        elif kind == "node_stop":
            self._stopped_a_while(node.proc.pid, *kids.values())
        elif kind in ("kill", "term") or (kind == "writer" and "sidecar-writer" in kids):
            self._take_out(kind, i, kids.get("sidecar-writer", 0))

    def _stopped_a_while(self, *pids: int) -> None:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(self.rng.uniform(0.3, 3))
        for pid in pids:
            os.kill(pid, signal.SIGCONT)

    def _take_out(self, kind: str, i: int, writer: int) -> None:
        """The node down (killed, its writer killed, or stopped cleanly), then started again."""
        node = self.nodes[i]
        with self.lock:
            self.down.add(i)
        if kind == "kill":
            node.kill9()
        elif kind == "writer":
            os.kill(writer, signal.SIGKILL)
            try:
                node.proc.wait(30)
            except Exception:
                self._violation(f"node {i} still running 30 s after its writer was killed")
                node.kill9()
        else:
            code = node.stop()
            if code != 0:
                self._violation(f"node {i}: a clean stop exited {code}")
        time.sleep(self.rng.uniform(0.2, 3))
        self._start(i)

    def _start(self, i: int) -> None:
        node = self.nodes[i]
        for attempt in range(5):  # a start may meet the database down: it ends, and is tried again
            try:
                node.start(60)
                break
            except (RuntimeError, TimeoutError) as e:
                if attempt == 4:
                    self._violation(f"node {i} did not start again: {str(e)[-500:]}")
                time.sleep(2)
        with self.lock:
            self.down.discard(i)

    def _server_fault(self, kind: str) -> None:
        assert self.server is not None and self.server.root is not None
        if kind == "pg_down":
            mode, seconds = self.rng.choice(["fast", "immediate"]), self.rng.uniform(0.5, 8)
            self._note(f"pg_down {mode} {seconds:.1f}s")
            pg.stop_server(self.server.root, mode)
            time.sleep(seconds)
            pg.start_again(self.server.root)
        else:
            self._note("pg_kick")
            self.server.terminate_connections()

    def _disk_full(self) -> None:
        assert self.disk is not None
        seconds = self.rng.uniform(0.5, 4)
        self._note(f"disk_full {seconds:.1f}s")
        self.disk.fill()
        time.sleep(seconds)
        self.disk.free()

    def _all_up(self) -> None:
        for i, node in enumerate(self.nodes):
            if node.proc.poll() is not None:
                self._start(i)

    # -- the check ----------------------------------------------------------------

    def _check_ends(self) -> None:
        """Every acknowledged request's frames, read back through one node."""
        reader = self._prompts(0)
        deadline = time.monotonic() + 120
        turns: dict[int, list[tuple[float, float, str]]] = {}
        for request_id, lane in self.acked.items():
            frames = self._frames_to_end(reader, request_id, deadline)
            self._check_frames(request_id, frames, turns.setdefault(lane, []))
        for lane_turns in turns.values():
            lane_turns.sort()
            for (_, end, first), (start, _, second) in zip(lane_turns, lane_turns[1:]):
                if end > start:
                    self._violation(f"{first} and {second} ran at once on one lane ({end - start:.3f} s)")

    @staticmethod
    def _frames_to_end(reader, request_id: str, deadline: float) -> list:
        while True:
            frames = watch(reader, request_id=request_id, timeout=CALL_TIMEOUT).frames
            if any(kind_of(f) in TERMINAL for f in frames) or time.monotonic() > deadline:
                return frames
            time.sleep(0.5)

    def _check_frames(self, request_id: str, frames: list, lane_turns: list) -> None:
        kinds = [kind_of(f) for f in frames]
        ends = [f for f in frames if kind_of(f) in TERMINAL]
        if [f.seq for f in frames] != list(range(1, len(frames) + 1)) or len(ends) != 1 \
                or kinds.count("started") > 1:
            self._violation(f"{request_id}: frames {kinds} seqs {[f.seq for f in frames]}")
            return
        end = ends[0]
        self.report.ends[f"failed/{end.failed.reason}" if kind_of(end) == "failed" else kind_of(end)] += 1
        started = [f for f in frames if kind_of(f) == "started"]
        if started:
            lane_turns.append((started[0].at.ToNanoseconds() / 1e9, end.at.ToNanoseconds() / 1e9,
                               request_id))

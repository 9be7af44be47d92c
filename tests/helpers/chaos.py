"""A chaos soak: adapters keep prompting every lane of one sidecar or of a
cluster's nodes, two at a time on each lane (so prompts often find it busy),
in all six delivery modes, with admin calls between (ADMIN_OPS), while
faults strike at random; then every acknowledged request is read back
through gRPC and checked.

    soak = Soak(nodes, seed=7, server=pg_server_or_None, disk=small_disk_or_None)
    report = soak.run(seconds)
    assert not report.violations, report

The faults (helpers/faults.py): a node, its writer or a worker killed -9, a
worker or a node stopped a while, clean restarts, a tool host's stream cut;
with ``server``, that PostgreSQL server stopped or its connections cut; with
``disk``, the SQLite store's filesystem filled up a while.

Adapters read most streams at once, some slowly, and walk away from some
after a few frames to come back with the same request id (``Reader``).

What every acknowledged request must show afterwards (``Report.violations``
lists each one that does not; helpers/soak_audit.py checks): its frames from
seq 1 without a gap, exactly one terminal frame, at most one ``started``; no
two turns of one lane overlap, auto-resume turns included, neither in time
nor in the transcript (each turn's rows in one run); and every tool call in a
tool lane's transcript has its result right after it.
Along the way no call may end ``INTERNAL`` or ``UNKNOWN``, and no refusal may
come without the ErrorInfo reason the API promises.

Seeded: the same seed draws the same prompts, modes and fault schedule (the
timing still varies). ``CHAOS_SEED`` and ``CHAOS_SECONDS`` override a test's
seed and length, for soaking longer (``make soak``).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import grpc
from sidecar_proc import Sidecar, error_info

from agent_sidecar.v1 import common_pb2 as cpb
from agent_sidecar.v1 import prompt_service_pb2 as ppb
from agent_sidecar.v1 import prompt_service_pb2_grpc as ppb_grpc
from agent_sidecar.v1 import session_service_pb2 as spb
from agent_sidecar.v1 import session_service_pb2_grpc as spb_grpc
from agent_sidecar.v1 import tool_service_pb2_grpc as tpb_grpc

from . import pg
from .config import echo, scripted
from .disk import SmallDisk
from .faults import Faults
from .ids import rid, source
from .sessions import transcript
from .soak_audit import audit
from .streams import TERMINAL, PromptRun, kind_of
from .tools import AB_SCHEMA, ToolHost, call_ids, unanswered_calls

MODES = [ppb.DeliveryMode.Value(f"DELIVERY_MODE_{m}")
         for m in ("QUEUE", "FOLLOW_UP", "INTERRUPT", "ROLLBACK", "STEER", "REJECT_IF_BUSY")]
RETRY = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
BROKEN = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
CALL_TIMEOUT = 20
# What the admin caller does to a random lane now and then; "rewrite" writes back
# the transcript up to its first unanswered tool call (cutting off a running
# turn's), "switch" returns to an incarnation the soak saw earlier (/resume).
ADMIN_OPS = ["cancel", "queue", "reset", "suspend", "rewind", "rewrite", "switch"]
MAX_MESSAGES_PER_REQUEST, REWRITE_KEEP = 1000, 500  # a lane's transcript outgrows a request's cap
ADAPTERS_PER_LANE = 2  # each prompting on its own: a lane is often busy when a prompt comes
RETRY_FOR_S = 120  # how long an adapter keeps retrying one request (a node may take a while to come back)
# Every third lane runs profile "tools": a tool call answered by the soak's
# tool host on the lane's node, then the result as text.
TOOL_STEPS = [{"text": "adding", "token_latency_ms": 15,
               "tool_calls": [{"name": "soak.add", "arguments": {"a": 2, "b": 3}}]},
              {"text_from_last_tool_result": True, "token_latency_ms": 15}]
CONFIG = echo("main", latency_ms=15) + scripted("tools", TOOL_STEPS, tools=["soak.*"])


def seed_and_seconds(seed: int, seconds: float) -> tuple[int, float]:
    """A test's own seed and length, unless CHAOS_SEED / CHAOS_SECONDS say otherwise."""
    return int(os.environ.get("CHAOS_SEED", seed)), float(os.environ.get("CHAOS_SECONDS", seconds))


@dataclass(repr=False)
class Report:
    """What one soak did and saw; its repr is the summary a failing assert prints."""

    seed: int
    acknowledged: int = 0
    calls: int = 0
    tool_calls: int = 0  # in the tool lanes' transcripts, checked answered
    resumed: int = 0  # auto-resume turns, checked with the acknowledged requests
    faults: list[str] = field(default_factory=list)
    ends: Counter = field(default_factory=Counter)
    refusals: Counter = field(default_factory=Counter)
    admin: Counter = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        lines = [f"seed {self.seed}: {self.acknowledged} acknowledged of {self.calls} calls, "
                 f"{self.tool_calls} tool calls in transcripts, {self.resumed} auto-resume turns",
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
    """One soak over ``nodes`` (one Sidecar, or a Cluster's nodes, each
    started with ``CONFIG``) with ``lanes`` lanes, two adapters prompting each
    (so that a prompt often finds its lane busy), one admin caller and a tool host on every node (docs/cluster.md
    "Tools"), opened again whenever its stream ends. They call each node on
    one channel of the soak's own, kept across the node's restarts, as an
    adapter's would be."""

    def __init__(self, nodes: list[Sidecar], seed: int, server: pg.PgServer | None = None,
                 disk: SmallDisk | None = None, lanes: int = 10):
        self.nodes = list(nodes)
        self.channels = [grpc.insecure_channel(n.target) for n in self.nodes]
        self.report = Report(seed)
        self.faults = Faults(self.nodes, random.Random(seed), note=self._note, violation=self._violation,
                             drop_host=self._drop_host, server=server, disk=disk)
        self.sources = [source("telegram") for _ in range(lanes)]
        self.acked: dict[str, int] = {}  # request id -> lane
        self.sessions: dict[str, str] = {}  # incarnations the audit saw: their lane's key
        self.incarnations: dict[int, set[str]] = {lane: set() for lane in range(lanes)}  # seen by admin calls
        self.hosts: dict[int, ToolHost] = {}  # each node's tool host now
        self.lock = threading.Lock()
        self.stop = threading.Event()

    # -- the run ------------------------------------------------------------------

    def run(self, seconds: float) -> Report:
        threads = [threading.Thread(target=self._guarded, args=(self._adapter, lane, k), daemon=True)
                   for lane in range(len(self.sources)) for k in range(ADAPTERS_PER_LANE)]
        threads += [threading.Thread(target=self._guarded, args=(fn,), daemon=True)
                    for fn in (self._admin, self._faults)]
        threads += [threading.Thread(target=self._guarded, args=(self._tool_host, i), daemon=True)
                    for i in range(len(self.nodes))]
        for t in threads:
            t.start()
        self.stop.wait(seconds)
        self.stop.set()
        for t in threads:
            t.join(120)
            if t.is_alive():
                self._violation(f"{t.name} still running 120 s after the soak ended")
        self.faults.all_up()
        self.report.acknowledged = len(self.acked)
        audit(self)
        for channel in self.channels:
            channel.close()
        return self.report

    def _guarded(self, fn, *args) -> None:
        """A thread's body: what it raises is a violation, not a quietly lost thread."""
        try:
            fn(*args)
        except Exception as e:
            self._violation(f"{fn.__name__}{args} raised {e!r}")

    def _prompts(self, i: int):
        return ppb_grpc.PromptServiceStub(self.channels[i])

    def _profile(self, lane: int) -> str:
        return "tools" if lane % 3 == 2 else "main"

    def _key(self, lane: int) -> str:
        return f"agent:{self._profile(lane)}:telegram:dm:{self.sources[lane].chat_id}"

    def _violation(self, what: str) -> None:
        with self.lock:
            self.report.violations.append(what)

    def _note(self, what: str) -> None:
        with self.lock:
            self.report.faults.append(f"{time.strftime('%X')} {what}")

    # -- adapters -----------------------------------------------------------------

    def _adapter(self, lane: int, k: int) -> None:
        rng = random.Random((self.report.seed * 100 + lane) * ADAPTERS_PER_LANE + k)
        while not self.stop.is_set():
            self._prompt(lane, rng, rid(f"soak{lane}"), rng.choice(MODES))
            time.sleep(rng.random() * 0.3)

    def _prompt(self, lane: int, rng: random.Random, request_id: str, mode: int) -> None:
        """One request, retried with its id until it ends or is refused, as an
        adapter whose sidecar went away would (for up to RETRY_FOR_S)."""
        req = ppb.PromptRequest(request_id=request_id, text="words " * rng.randint(1, 15),
                                source=self.sources[lane], delivery=mode, profile=self._profile(lane))
        deadline = time.monotonic() + RETRY_FOR_S
        while time.monotonic() < deadline:
            live = self.faults.live()
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
            if run.code == grpc.StatusCode.CANCELLED and run.reason is None and not reader.walked_away:
                # gRPC's, not the sidecar's: the call reached the server as it
                # stopped, before a handler took it (grpc/grpc#41785). Sent
                # again with its id, as docs/semantics.md ("Errors") tells
                # adapters and the three clients do.
                with self.lock:
                    self.report.refusals["CANCELLED/None (gRPC's, sent again)"] += 1
            elif run.code not in RETRY and not reader.walked_away:
                self._refused(request_id, run)
                return
            time.sleep(0.2)
        self._violation(f"{request_id}: still retried after {RETRY_FOR_S} s")

    def _refused(self, request_id: str, run: PromptRun) -> None:
        with self.lock:
            self.report.refusals[f"{run.code.name}/{run.reason}"] += 1
        # A running turn whose node stalled or lost the store while another node
        # reset or suspended the lane ends CANCELLED, as that call cancels it on
        # one sidecar (docs/cluster.md); a prompt still waiting never does.
        cancelled = run.reason == "CANCELLED" and "started" in run.kinds() and run.details.startswith(
            ("the session was reset", "the session was suspended"))
        if run.reason != "AGENT_BUSY" and not cancelled:  # REJECT_IF_BUSY's refusal: anything else is wrong
            debug = run.error.debug_error_string() if run.error is not None else ""  # whose status it is
            self._violation(f"{request_id}: ended {run.code.name} / {run.reason}: {run.details} "
                            f"after {run.kinds()} ({debug})")

    # -- admin calls --------------------------------------------------------------

    def _admin(self) -> None:
        rng = random.Random(self.report.seed * 7)
        while not self.stop.wait(rng.uniform(0.3, 1.5)):
            live = self.faults.live()
            if not live:
                continue
            node, lane, op = rng.choice(live), rng.randrange(len(self.sources)), rng.choice(ADMIN_OPS)
            try:
                outcome = self._admin_call(self.channels[node], lane, op, rng)
            except grpc.RpcError as e:
                reason = error_info(e)[0]
                outcome = f"{e.code().name}/{reason}"
                if e.code() in BROKEN or e.code() == grpc.StatusCode.INVALID_ARGUMENT or (
                        reason is None and e.code() not in RETRY):  # what the soak sends is valid
                    self._violation(f"admin {op}: {outcome}: {e.details()}")
            with self.lock:
                self.report.admin[f"{op} {outcome}"] += 1

    def _admin_call(self, channel: grpc.Channel, lane: int, op: str, rng: random.Random) -> str:
        """One admin call on ``lane``; what it did ("OK", or why it did nothing)."""
        prompts, sessions = ppb_grpc.PromptServiceStub(channel), spb_grpc.SessionServiceStub(channel)
        key = self._key(lane)
        if op == "cancel":
            prompts.Cancel(ppb.CancelRequest(session_key=key), timeout=CALL_TIMEOUT)
        elif op == "queue":
            prompts.GetQueue(ppb.GetQueueRequest(session_key=key), timeout=CALL_TIMEOUT)
        elif op == "suspend":
            sessions.SuspendSession(spb.SuspendSessionRequest(session_key=key), timeout=CALL_TIMEOUT)
        elif op == "reset":
            got = sessions.ResetSession(spb.ResetSessionRequest(session_key=key), timeout=CALL_TIMEOUT)
            self.incarnations[lane].add(got.session.session_id)
        else:
            got = sessions.GetOrCreateSession(spb.GetOrCreateSessionRequest(
                source=self.sources[lane], profile=self._profile(lane)), timeout=CALL_TIMEOUT)
            session_id = got.session.session_id
            self.incarnations[lane].add(session_id)
            if op == "rewind":
                sessions.RewindSession(spb.RewindSessionRequest(session_id=session_id, n=1),
                                       timeout=CALL_TIMEOUT)
            elif op == "rewrite":
                sessions.RewriteTranscript(spb.RewriteTranscriptRequest(
                    session_id=session_id, messages=_answered_prefix(transcript(sessions, session_id))),
                    timeout=CALL_TIMEOUT)
            else:  # "switch": back to an earlier incarnation (/resume)
                earlier = sorted(self.incarnations[lane] - {session_id})
                if not earlier:
                    return "none earlier"
                sessions.SwitchSession(spb.SwitchSessionRequest(
                    session_key=key, target_session_id=rng.choice(earlier)), timeout=CALL_TIMEOUT)
        return "OK"

    # -- tool hosts ---------------------------------------------------------------

    def _tool_host(self, i: int) -> None:
        """Node ``i``'s tool host: a ServeTools stream answering ``soak.add``
        after up to half a second (so that faults often strike while a call
        waits: its turn must then leave a result for it in the transcript),
        opened again whenever it ends (its node went away, or a
        ``host_drop`` cut it)."""
        rng = random.Random(self.report.seed * 13 + i)

        def add(inv) -> tuple[bool, str, str]:
            time.sleep(rng.random() * 0.5)
            return True, '{"sum": 5}', ""
        stub = tpb_grpc.ToolServiceStub(self.channels[i])
        while not self.stop.is_set():
            self.hosts[i] = host = ToolHost(stub, "soak", [("soak.add", "Add two numbers", AB_SCHEMA)],
                                            add, timeout=3600)
            while not host.ended.wait(0.2) and not self.stop.is_set():
                pass
            host.cancel()
            self.stop.wait(0.2)

    def _faults(self) -> None:
        self.faults.run(self.stop)

    def _drop_host(self, i: int) -> None:
        if i in self.hosts:
            self.hosts[i].cancel()

def _answered_prefix(messages) -> list:
    """A transcript up to its first assistant message whose tool calls are not
    all answered right after it (a running turn's, usually), as messages to
    write: its last REWRITE_KEEP from a user message on, when it is longer than
    a request may carry (limits.max_messages_per_request)."""
    unanswered = set(unanswered_calls(messages))
    out = []
    for m in messages:
        if m.role == "assistant" and unanswered.intersection(call_ids(m)):
            break
        out.append(cpb.Message(role=m.role, content=m.content, tool_call_id=m.tool_call_id,
                               tool_name=m.tool_name, tool_calls_json=m.tool_calls_json))
    if len(out) > MAX_MESSAGES_PER_REQUEST:
        out = out[-REWRITE_KEEP:]
        while out and out[0].role != "user":
            out.pop(0)
    return out

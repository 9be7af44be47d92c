"""Turns and lanes: the in-memory view of what each session is doing.

A ``Turn`` is one prompt (one request id) from its reservation to its
terminal frame, in exactly one ``Phase`` at a time, changed only through its
own methods, each of which checks the phase it leaves::

    RESERVED ──accept──▶ WAITING ──begin──▶ STARTING ──run_on──▶ RUNNING
       │   └─accept (a steer)─▶ JOINED        │                    │
       │             WAITING ◀─release─ ABSORBED ◀─absorb─ WAITING  │
       └───────────── any open phase ──ending──▶ ENDING ──ended──▶ ENDED
                        any phase ──drop (the lane's lease was lost)──▶ ENDED

* RESERVED: the request id is taken in memory (a twin follows this turn), its
  accept job not committed yet; an end decided meanwhile is deferred until it
  commits (``defer_end``), since nothing may end before its ``accepted`` frame.
* WAITING: acknowledged, in its lane's queue or next to start.
* JOINED: a steer taken into its lane's running turn (its ``host``); it ends
  with that turn.
* STARTING / RUNNING: its start (user messages, ``started`` frame) is being
  committed / its worker has it.
* ABSORBED: a newer follow-up is taking it over (burst collapse, burst.py);
  that one's accept ends it, so nothing else may.
* ENDING / ENDED: its terminal frame is published / committed. A turn ends
  once: every ``ending`` from a closing phase is refused.

Orthogonal to the phase, a turn carries what was asked of it: a cancel (its
reason), a rollback, a take-back by RewindSession (``taken_back``).

A ``Lane`` is one session key's line of turns: the running one, then the
interrupt slot, the single follow-up slot (seed 001 §8's pending message) and
the FIFO of /queue prompts. The store mirrors all of it (the ledger and the
queue rows), so a restart can rebuild lanes; this is the fast path.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ..delivery import FOLLOW_UP
from .jobs import PromptRecord


class Phase(enum.Enum):
    RESERVED = "reserved"
    WAITING = "waiting"
    JOINED = "joined"
    STARTING = "starting"
    RUNNING = "running"
    ABSORBED = "absorbed"
    ENDING = "ending"
    ENDED = "ended"


class TurnStateError(RuntimeError):
    """A transition from a phase it does not leave: a bug in the turn engine."""


@dataclass(eq=False)
class Turn:
    rid: str
    key: str
    platform: str
    profile: str
    text: str
    delivery: int = FOLLOW_UP
    sid: str = ""
    created_at: float = field(default_factory=time.time)
    payload: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = 1800.0
    call_deadline: float = 0.0  # time.time() when its Prompt call's deadline passes (0: none)
    phase: Phase = Phase.RESERVED
    queued: bool = False  # has a queue row in the store (it waited in its lane)
    next_seq: int = 2  # seq 1 is the accepted frame, written by the accept job
    subscribers: list = field(default_factory=list)
    terminal: Any = None  # its terminal frame, once committed
    worker: Any = None
    worker_gen: int = -1  # which incarnation of the worker slot got the run message
    deadline: float = 0.0  # loop time after which the watchdog kills the worker
    open_tool_calls: dict[str, str] = field(default_factory=dict)
    usage: dict[str, float] = field(default_factory=dict)
    steers: list[Turn] = field(default_factory=list)
    host: Turn | None = None  # for a steer: the turn it joined
    cancel_reason: str = ""
    rollback: bool = False
    taken_back: str = ""  # why RewindSession/RewriteTranscript took it back (undo.py)
    lost: bool = False  # a flush the store refused for good took some of its activity (flights.py)
    deferred_end: tuple | None = None  # (status, reason, text) decided while RESERVED
    acked: bool = False  # its accept committed (its ``accepted`` frame is durable)
    began: bool = False  # its start was decided (it has, or will have, user messages)
    epoch: int = 0  # its lane's lease epoch when it was placed (a cluster; 0: none)
    dropped: bool = False  # its lane's lease was lost: no longer this node's turn (drop)
    # Burst collapse (docs/semantics.md FOLLOW_UP, burst.py): the pending prompt this
    # one absorbed (whose own ``absorbed_from`` goes on back), who absorbed this
    # one, and for a turn restored from the store the absorbed texts read back
    # from the ledger, oldest first, as {"text", "at"}.
    absorbed_from: Turn | None = None
    absorbed_by: Turn | None = None
    absorbed: list[dict[str, Any]] = field(default_factory=list)
    # For the metrics (turns/stats.py): when its start was decided (monotonic), and
    # whether its first text delta came in.
    began_at: float = 0.0
    first_token_seen: bool = False
    span: Any = None  # its trace span while tracing is on (obs/otel.py)

    @classmethod
    def restored(cls, **kw) -> Turn:
        """A turn the startup restore found acknowledged in the store."""
        turn = cls(**kw)
        turn.phase, turn.acked = Phase.WAITING, True
        return turn

    # -- what the phase says --------------------------------------------------------------

    @property
    def accepted(self) -> bool:
        return self.acked

    @property
    def closing(self) -> bool:
        """Its end is decided (absorbed, ending or ended): nothing else may end it.
        Compared by identity: a set of phases would hash each (Enum's
        ``__hash__`` is Python code), several times a turn."""
        phase = self.phase
        return phase is Phase.ENDING or phase is Phase.ENDED or phase is Phase.ABSORBED

    @property
    def finished(self) -> bool:
        return self.phase is Phase.ENDED

    @property
    def start_in_flight(self) -> bool:
        """Reserved on an idle lane, its accept not committed yet (which also
        starts it and writes its user message, unless it is a restore's
        resume turn)."""
        return not self.began and not self.acked and not self.queued

    @property
    def in_flight(self) -> bool:
        """Its start is decided and its end is not."""
        return self.began and not self.closing

    def time_left(self) -> float:
        """Seconds it may run if it starts now: its timeout, cut to what is
        left of its Prompt call's deadline. A deadline is an instant (gRPC's):
        time the prompt waited in its lane is spent, so a turn whose caller
        has given up never starts to write a reply nobody is waiting for.
        Unless it absorbed other prompts (a burst, an INTERRUPT's take-over):
        their callers were told their texts run in its turn, so it runs."""
        if not self.call_deadline or self.absorbed_from is not None or self.absorbed:
            return self.timeout_s
        return min(self.timeout_s, self.call_deadline - time.time())

    # -- transitions ------------------------------------------------------------------------

    def _move(self, to: Phase, *sources: Phase) -> None:
        if self.phase not in sources:
            raise TurnStateError(f"turn {self.rid}: {self.phase.value} -> {to.value}")
        self.phase = to

    def accept(self) -> None:
        """Its accept committed: it waits in its lane, or rides with its host
        (an absorbed one stays absorbed: its absorber ends it)."""
        if self.phase is not Phase.ABSORBED:
            self._move(Phase.JOINED if self.host is not None else Phase.WAITING, Phase.RESERVED)
        self.acked = True

    def begin(self) -> None:
        """Its start is decided (published, or committed by its accept)."""
        self._move(Phase.STARTING, Phase.WAITING)
        self.began = True
        self.began_at = time.monotonic()

    def run_on(self, worker) -> None:
        self._move(Phase.RUNNING, Phase.STARTING)
        self.worker = worker

    def absorb_into(self, newer: Turn) -> None:
        self._move(Phase.ABSORBED, Phase.WAITING, Phase.RESERVED)
        self.absorbed_by, newer.absorbed_from = newer, self

    def release(self) -> None:
        """The follow-up absorbing it was refused: it waits again."""
        self._move(Phase.WAITING, Phase.ABSORBED)
        self.absorbed_by = None

    def defer_end(self, status: str, reason: str, text: str) -> None:
        """An end decided before its accept committed: applied right after."""
        if self.phase is not Phase.RESERVED:
            raise TurnStateError(f"turn {self.rid}: deferring an end in {self.phase.value}")
        self.deferred_end = (status, reason, text)

    def ending(self) -> None:
        """Its terminal frame is published."""
        self._move(Phase.ENDING, Phase.WAITING, Phase.JOINED, Phase.STARTING, Phase.RUNNING)
        self.deferred_end = None

    def ended(self, frame) -> None:
        """Its terminal frame committed (an absorbed turn's comes with its absorber's accept)."""
        if self.dropped:
            return
        self._move(Phase.ENDED, Phase.ENDING, Phase.ABSORBED)
        self.terminal = frame

    def drop(self) -> None:
        """This node lost the lane's lease: the turn is no longer this node's
        to end (the node that took the lane over closes or reruns it from the
        ledger). It ends here without a terminal frame; what was already on
        its way to the store for it lands or is fenced, and changes nothing
        here."""
        self.phase = Phase.ENDED
        self.dropped = True

    def cancel(self, reason: str) -> None:
        """Its worker is told to stop; it ends with ``reason``."""
        self.cancel_reason = reason

    def want_rollback(self) -> None:
        """What it wrote is hidden when it ends (ROLLBACK delivery, undo)."""
        self.rollback = True

    def take_back(self, why: str) -> None:
        """RewindSession/RewriteTranscript took it back: its further writes are
        refused and it ends CANCELLED, its rows hidden."""
        self.taken_back = why
        self.rollback = True

    def join(self, host: Turn) -> None:
        """A steer the host's worker took in: it ends with the host."""
        self.host = host
        host.steers.append(self)

    def leave_host(self) -> None:
        if self.host is not None and self in self.host.steers:
            self.host.steers.remove(self)
        self.host = None

    # -- what it carries ------------------------------------------------------------------

    def record(self) -> PromptRecord:
        """What the accept job writes to the ledger (plain data: it is pickled
        to the store's writer process)."""
        return PromptRecord(self.rid, self.key, self.platform, self.profile, self.delivery,
                            self.text, self.payload, self.created_at)

    def user_texts(self) -> list[str]:
        """The user messages this turn starts with: the texts of the prompts it
        absorbed and its own, in the order the sidecar received them."""
        if self.absorbed_from is None and not self.absorbed:
            return [self.text]
        newest_first: list[tuple[float, str]] = []
        t: Turn | None = self
        while t is not None:
            newest_first.append((t.created_at, t.text))
            newest_first.extend((e["at"], e["text"]) for e in reversed(t.absorbed))
            t = t.absorbed_from
        # Received order is chain order; the sort only moves a steer that fell
        # back to FOLLOW_UP after a newer follow-up took the slot (burst.absorb).
        ordered = sorted(reversed(newest_first), key=lambda e: e[0])
        return [text for _, text in ordered]


@dataclass(eq=False)
class Lane:
    key: str
    running: Turn | None = None
    interrupt: deque = field(default_factory=deque)
    pending: Turn | None = None
    fifo: deque = field(default_factory=deque)
    position_counter: int = 0

    def depth(self) -> int:
        return len(self.interrupt) + (1 if self.pending else 0) + len(self.fifo)

    def busy(self) -> bool:
        return self.running is not None or self.depth() > 0

    def waiting(self) -> list[Turn]:
        """Every queued turn in the order they will run."""
        out = list(self.interrupt)
        if self.pending:
            out.append(self.pending)
        out.extend(self.fifo)
        return out

    def pop_next(self) -> Turn | None:
        if self.interrupt:
            return self.interrupt.popleft()
        if self.pending:
            t, self.pending = self.pending, None
            return t
        if self.fifo:
            return self.fifo.popleft()
        return None

    def detach(self, turn: Turn) -> bool:
        """Take ``turn`` out of the lane, running or waiting, and out of its
        host if it is a steer. Returns whether it was the running turn."""
        was_running = self.running is turn
        if was_running:
            self.running = None
        if self.pending is turn:
            self.pending = None
        else:
            for q in (self.interrupt, self.fifo):
                if turn in q:
                    q.remove(turn)
                    break
        turn.leave_host()
        return was_running

    def starting(self, turn: Turn) -> bool:
        """``turn`` is this lane's running turn and its accept, in flight,
        starts it: ended now, it keeps the lane until that commit (its end
        comes right after it, accept._accepted), then the lane moves on."""
        return self.running is turn and turn.start_in_flight

    def next_position(self) -> int:
        self.position_counter += 1
        return self.position_counter

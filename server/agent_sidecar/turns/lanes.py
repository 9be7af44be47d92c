"""Turns and lanes: the in-memory view of what each session is doing.

A ``Turn`` is one prompt (one request id) from acceptance to its terminal
frame. A ``Lane`` is one session key's line of turns: the running one, then the
interrupt slot, the single follow-up slot (seed 001 §8's pending message) and
the FIFO of /queue prompts. The store mirrors all of it (``prompts`` and
``prompt_queue``), so a restart can rebuild lanes; this is the fast path.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

# Delivery modes (values of the proto enum DeliveryMode).
REJECT_IF_BUSY, FOLLOW_UP, QUEUE, INTERRUPT, ROLLBACK, STEER = 1, 2, 3, 4, 5, 6
MODE_NAMES = {1: "REJECT_IF_BUSY", 2: "FOLLOW_UP", 3: "QUEUE", 4: "INTERRUPT", 5: "ROLLBACK",
              6: "STEER"}


@dataclass(eq=False)
class Turn:
    rid: str
    key: str
    platform: str
    profile: str
    text: str
    delivery: int
    sid: str = ""
    created_at: float = field(default_factory=time.time)
    source: dict[str, Any] | None = None
    payload: dict[str, Any] = field(default_factory=dict)
    next_seq: int = 1
    accepted: bool = False
    queued: bool = False  # has a prompt_queue row (waited in the lane)
    routing_row: tuple | None = None  # (session_id, created_at, origin) seen at accept
    started: bool = False
    finished: bool = False
    terminal_pending: bool = False
    subscribers: list = field(default_factory=list)
    terminal: Any = None
    worker: Any = None
    worker_gen: int = -1  # which incarnation of the worker slot got the run message
    open_tool_calls: dict[str, str] = field(default_factory=dict)
    steers: list["Turn"] = field(default_factory=list)
    host: "Turn | None" = None  # for a steer: the turn it joined
    rollback: bool = False
    cancel_reason: str = ""
    timeout_s: float = 1800.0
    deadline: float = 0.0  # loop time after which the watchdog kills the worker
    final_text: str = ""
    usage: dict[str, float] = field(default_factory=dict)
    pending_end: tuple | None = None  # an end decided before the accept committed
    # Burst collapse (docs/semantics.md FOLLOW_UP, turns/burst.py): the pending prompt this
    # one absorbed (whose own ``absorbed_from`` goes on back), who absorbed this
    # one, and for a turn restored from the store the absorbed texts read back
    # from the ledger, oldest first, as {"text", "at"}.
    absorbed_from: "Turn | None" = None
    absorbed_by: "Turn | None" = None
    absorbed: list[dict[str, Any]] = field(default_factory=list)
    # Taken back by RewindSession / RewriteTranscript while it ran: what the
    # worker still sends is refused, and the turn ends CANCELLED (turns/undo.py).
    taken_back: str = ""

    def ledger_fields(self) -> tuple:
        """What the accept job writes to the ledger (plain data: it is pickled
        to the store's writer process)."""
        return (self.rid, self.key, self.platform, self.profile, self.delivery, self.text,
                self.payload, self.created_at)

    def user_texts(self) -> list[str]:
        """The user messages this turn starts with: the texts of the prompts it
        absorbed and its own, in the order the sidecar received them."""
        if self.absorbed_from is None and not self.absorbed:
            return [self.text]
        newest_first, t = [], self
        while t is not None:
            newest_first.append((t.created_at, t.text))
            newest_first.extend((e["at"], e["text"]) for e in reversed(t.absorbed))
            t = t.absorbed_from
        # Received order is chain order; the sort only moves a steer that fell
        # back to FOLLOW_UP after a newer follow-up took the slot (burst.absorb).
        ordered = sorted(reversed(newest_first), key=lambda e: e[0])
        return [text for _, text in ordered]

    def on_terminal(self, frame) -> None:
        self.terminal = frame
        self.finished = True


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

    def remove(self, turn: Turn) -> bool:
        if self.pending is turn:
            self.pending = None
            return True
        for q in (self.interrupt, self.fifo):
            if turn in q:
                q.remove(turn)
                return True
        return False

    def next_position(self) -> int:
        self.position_counter += 1
        return self.position_counter

"""The agent cache of seed 001 §11, one per worker: warm sessions, bounded.

Three valves, all of which skip agents that are mid-turn or whose messages have
not yet reached the store (``unpersisted``):
- the entry cap (LRU, ``max_size``), enforced on insert;
- the idle TTL, swept by the worker's housekeeping tick;
- memory pressure: when this process's anonymous RSS is over its budget, shed
  LRU agents (never the ``protect_recent`` most recent), at most
  ``max_evictions_per_pass`` per pass, then ``malloc_trim`` so the freed arenas
  go back to the OS.
An evicted session loses nothing: its next turn rebuilds it from the store.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from .agent import Agent


def anon_rss_bytes() -> int:
    """This process's anonymous resident memory (what a transcript pins)."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def malloc_trim() -> None:
    import ctypes  # the process's own symbols: libc's malloc_trim among them (glibc)
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


class AgentCache:
    def __init__(self, max_size: int = 128, idle_ttl: float = 3600,
                 memory_budget_bytes: int = 0, max_evictions_per_pass: int = 16,
                 protect_recent: int = 8, clock: Callable[[], float] = time.monotonic,
                 rss: Callable[[], int] = anon_rss_bytes, trim: Callable[[], None] = malloc_trim):
        self.max_size = max_size
        self.idle_ttl = idle_ttl
        self.memory_budget_bytes = memory_budget_bytes  # 0: pressure pass off
        self.max_evictions_per_pass = max_evictions_per_pass
        self.protect_recent = protect_recent
        self.clock, self.rss, self.trim = clock, rss, trim
        self._agents: OrderedDict[str, Agent] = OrderedDict()
        self.evictions = {"lru": 0, "ttl": 0, "pressure": 0}

    def __len__(self) -> int:
        return len(self._agents)

    def __contains__(self, key: str) -> bool:
        return key in self._agents

    def keys(self) -> list[str]:
        """LRU first, MRU last."""
        return list(self._agents)

    def peek(self, key: str) -> Agent | None:
        return self._agents.get(key)

    def get(self, key: str) -> Agent | None:
        agent = self._agents.get(key)
        if agent is not None:
            self._agents.move_to_end(key)
            agent.last_used = self.clock()
        return agent

    def put(self, agent: Agent) -> list[str]:
        agent.last_used = self.clock()
        self._agents[agent.session_key] = agent
        self._agents.move_to_end(agent.session_key)
        return self._enforce_cap()

    def remove(self, key: str) -> bool:
        return self._agents.pop(key, None) is not None

    def clear(self) -> None:
        self._agents.clear()

    @staticmethod
    def _sheddable(agent: Agent) -> bool:
        return not agent.in_turn and agent.unpersisted <= 0

    def _enforce_cap(self) -> list[str]:
        """Evict least recently used agents down to ``max_size``, skipping the
        newest and any that is busy or unpersisted. Walks from the LRU end only
        as far as it must: this runs on every cache miss of a full cache."""
        excess = len(self._agents) - self.max_size
        if excess <= 0:
            return []
        newest = next(reversed(self._agents))
        evicted: list[str] = []
        for key, agent in self._agents.items():
            if key != newest and self._sheddable(agent):
                evicted.append(key)
                if len(evicted) == excess:
                    break
        for key in evicted:
            del self._agents[key]
        self.evictions["lru"] += len(evicted)
        return evicted

    def sweep_idle(self) -> list[str]:
        """Unmount agents idle longer than the TTL (seed 000's idle state: the
        row stays, the warm agent goes)."""
        now = self.clock()
        evicted = [k for k, a in self._agents.items()
                   if now - a.last_used >= self.idle_ttl and self._sheddable(a)]
        for k in evicted:
            del self._agents[k]
        self.evictions["ttl"] += len(evicted)
        return evicted

    def sweep_pressure(self) -> list[str]:
        if self.memory_budget_bytes <= 0 or self.rss() <= self.memory_budget_bytes:
            return []
        keys = list(self._agents)
        protected = set(keys[-self.protect_recent:]) if self.protect_recent > 0 else set()
        evicted: list[str] = []
        for k in keys:
            if len(evicted) >= self.max_evictions_per_pass:
                break
            if k in protected or not self._sheddable(self._agents[k]):
                continue
            del self._agents[k]
            evicted.append(k)
        if evicted:
            self.evictions["pressure"] += len(evicted)
            self.trim()
        return evicted

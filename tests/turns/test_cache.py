"""The agent cache of seed 001 §11 (issue 4): AgentCache driven directly with an
injected clock, RSS reading and trim; the memory budget; and, through a real
sidecar, sessions shed under a tiny budget (or an idle TTL) and rebuilt from
the store with their transcripts intact."""

from __future__ import annotations

import time

from helpers.config import profile
from helpers.ids import source
from helpers.logs import log_lines
from helpers.sessions import get_session, transcript
from helpers.streams import start
from helpers.waiting import wait_until
from sidecar_proc import Sidecar

from agent_sidecar import cgroup
from agent_sidecar.turns import memory
from agent_sidecar.turns.agent import Agent
from agent_sidecar.turns.cache import AgentCache

MB = 1024 * 1024


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class Rss:
    def __init__(self, value: int = 0):
        self.value = value

    def __call__(self) -> int:
        return self.value


class Trim:
    def __init__(self):
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


def agent(key: str, **kw) -> Agent:
    return Agent(key, f"sid-{key}", 0, 1, [{"role": "user", "content": key}], **kw)


def cache(**kw):
    clock, rss, trim = Clock(), Rss(), Trim()
    kw.setdefault("max_size", 100)
    c = AgentCache(clock=clock, rss=rss, trim=trim, **kw)
    return c, clock, rss, trim


def fill(c: AgentCache, keys, clock: Clock | None = None, **kw) -> None:
    for k in keys:
        if clock is not None:
            clock.t += 1
        c.put(agent(k, **kw))


# -- LRU ---------------------------------------------------------------------------------

def test_lru_order_and_get_moves_to_mru():
    c, clock, _, _ = cache()
    fill(c, "abcd", clock)
    assert c.keys() == list("abcd")
    clock.t += 1
    assert c.get("b").session_key == "b"
    assert c.keys() == list("acdb")
    assert c.peek("a") is not None and c.keys() == list("acdb")  # peek does not touch
    assert c.get("zz") is None


def test_cap_evicts_lru_first():
    c, clock, _, _ = cache(max_size=3)
    fill(c, "abc", clock)
    c.get("a")
    assert c.put(agent("d")) == ["b"]
    assert c.keys() == ["c", "a", "d"]
    assert c.put(agent("e")) == ["c"]
    assert len(c) == 3 and c.evictions["lru"] == 2


def test_cap_never_evicts_the_just_inserted_agent():
    c, clock, _, _ = cache(max_size=1)
    c.put(agent("a", in_turn=True))
    assert c.put(agent("b")) == []  # a is mid-turn, b is the MRU: over the cap for now
    assert c.keys() == ["a", "b"]
    c.peek("a").in_turn = False
    assert c.put(agent("c")) == ["a", "b"]
    assert c.keys() == ["c"]


def test_cap_skips_mid_turn_and_unpersisted():
    c, clock, _, _ = cache(max_size=2)
    c.put(agent("busy", in_turn=True))
    c.put(agent("dirty", unpersisted=2))
    assert c.put(agent("new")) == []
    assert set(c.keys()) == {"busy", "dirty", "new"}
    c.peek("dirty").unpersisted = 0
    assert c.put(agent("newer")) == ["dirty", "new"]
    assert c.keys() == ["busy", "newer"]


# -- TTL ---------------------------------------------------------------------------------

def test_ttl_sweep():
    c, clock, _, _ = cache(idle_ttl=60)
    fill(c, "abc", clock)  # last_used 1001, 1002, 1003
    clock.t = 1061.5
    assert c.sweep_idle() == ["a"]
    clock.t = 1062.0
    c.get("b")  # touched: fresh again
    clock.t = 1070
    assert c.sweep_idle() == ["c"]
    assert c.keys() == ["b"] and c.evictions["ttl"] == 2
    clock.t = 1200
    assert c.sweep_idle() == ["b"] and len(c) == 0


def test_ttl_sweep_never_sheds_mid_turn_or_unpersisted():
    c, clock, _, _ = cache(idle_ttl=10)
    c.put(agent("busy", in_turn=True))
    c.put(agent("dirty", unpersisted=1))
    c.put(agent("idle"))
    clock.t += 100
    assert c.sweep_idle() == ["idle"]
    assert set(c.keys()) == {"busy", "dirty"}


# -- memory pressure ------------------------------------------------------------------------

def test_pressure_sheds_lru_but_protects_recent():
    c, clock, rss, trim = cache(memory_budget_bytes=100 * MB, protect_recent=2)
    fill(c, "abcde", clock)
    rss.value = 50 * MB
    assert c.sweep_pressure() == [] and trim.calls == 0  # under budget
    rss.value = 200 * MB
    assert c.sweep_pressure() == ["a", "b", "c"]
    assert c.keys() == ["d", "e"] and trim.calls == 1
    assert c.sweep_pressure() == [] and trim.calls == 1  # nothing shed: no trim
    assert c.evictions["pressure"] == 3


def test_pressure_never_sheds_mid_turn_or_unpersisted():
    c, clock, rss, trim = cache(memory_budget_bytes=MB, protect_recent=1)
    c.put(agent("busy", in_turn=True))
    c.put(agent("dirty", unpersisted=3))
    c.put(agent("free"))
    c.put(agent("recent"))
    rss.value = 10 * MB
    assert c.sweep_pressure() == ["free"]
    assert c.keys() == ["busy", "dirty", "recent"]
    c.peek("busy").in_turn = False
    c.peek("dirty").unpersisted = 0
    assert c.sweep_pressure() == ["busy", "dirty"] and c.keys() == ["recent"]
    assert trim.calls == 2


def test_pressure_caps_evictions_per_pass():
    c, clock, rss, trim = cache(memory_budget_bytes=MB, max_evictions_per_pass=3, protect_recent=0)
    fill(c, [f"k{i}" for i in range(10)], clock)
    rss.value = 2 * MB
    assert c.sweep_pressure() == ["k0", "k1", "k2"]
    assert c.sweep_pressure() == ["k3", "k4", "k5"]
    assert trim.calls == 2 and len(c) == 4


def test_pressure_protect_recent_zero_may_shed_everything():
    c, clock, rss, _ = cache(memory_budget_bytes=MB, protect_recent=0)
    fill(c, "abc", clock)
    rss.value = 2 * MB
    assert c.sweep_pressure() == ["a", "b", "c"] and len(c) == 0


def test_budget_zero_disables_the_pressure_pass():
    c, clock, rss, trim = cache(memory_budget_bytes=0, protect_recent=0)
    fill(c, "abc", clock)
    rss.value = 1 << 40
    assert c.sweep_pressure() == [] and len(c) == 3 and trim.calls == 0


def test_budget_per_worker():
    assert memory.budget_per_worker(0, 4) == 0
    assert memory.budget_per_worker("off", 4) == 0
    assert memory.budget_per_worker("0", 2) == 0
    assert memory.budget_per_worker(-5, 2) == 0
    assert memory.budget_per_worker(1024, 4) == 256 * MB
    assert memory.budget_per_worker("512", 2) == 256 * MB
    assert memory.budget_per_worker(100, 0) == 100 * MB
    auto = memory.budget_per_worker("auto", 2)
    assert auto == memory.detect_limit_bytes() // 2 and auto > 0
    assert memory.budget_per_worker(" AUTO ", 1) == memory.detect_limit_bytes()


def test_detect_limit_prefers_cgroup_files(tmp_path, monkeypatch):
    own = tmp_path / "system.slice" / "sidecar.service"  # the process's cgroup v2 directory
    own.mkdir(parents=True)
    (own / "memory.high").write_text("max\n")
    (own / "memory.max").write_text(str(3 * 1024 * MB) + "\n")
    monkeypatch.setattr(cgroup, "ROOT", str(tmp_path))
    monkeypatch.setattr(cgroup, "cgroup_dir", lambda: str(own))
    assert memory.detect_limit_bytes() == 3 * 1024 * MB
    (own / "memory.high").write_text(str(2 * 1024 * MB))
    assert memory.detect_limit_bytes() == 2 * 1024 * MB
    (tmp_path / "system.slice" / "memory.max").write_text(str(1024 * MB))  # a parent's limit binds it too
    assert memory.detect_limit_bytes() == 1024 * MB


# -- through a real sidecar -----------------------------------------------------------------

def shed_config(**cache_kw) -> str:
    lines = ["[agent.agent_cache]"] + [f"{k} = {v!r}" for k, v in cache_kw.items()]
    return "\n".join(lines) + "\n" + profile("main", "echo")


# The cache is invisible through the API by design (a shed agent is rebuilt from the
# store, transcript intact), so its eviction and rebuild log lines are what these
# tests check, beside the transcripts read back over gRPC.
def evicted_keys(sc, why: str) -> set[str]:
    out = set()
    for line in log_lines(sc):
        if line.get("why") == why and line.get("msg") in ("agents evicted", "agent evicted"):
            out.update(line.get("keys", []) or [line.get("key")])
    return out


def rebuilt(sc, key: str) -> list[dict]:
    return [x for x in log_lines(sc, "agent rebuilt from store") if x.get("key") == key]


def shed_and_rebuild(tmp_path, why: str, n_evicted: int = 4, **cache_kw) -> None:
    sc = Sidecar(tmp_path / "data", config=shed_config(sweep_interval_secs=0.2, **cache_kw),
                 workers=1).start()
    try:
        prompts, sessions = sc.prompts(), sc.sessions()
        firsts = [start(prompts, text=f"first {i}", src=source()).result(10) for i in range(5)]
        assert all(p.end == "completed" for p in firsts)
        keys = [p.key for p in firsts]
        gone = wait_until(lambda: evicted_keys(sc, why) >= set(keys[:n_evicted]) and evicted_keys(sc, why),
                          timeout=5, what=f"agents evicted ({why})")
        assert set(keys[:n_evicted]) <= gone
        if why != "ttl":
            assert keys[-1] not in gone  # the most recent one is never shed
        victim = firsts[0]
        assert rebuilt(sc, victim.key) == []
        again = start(prompts, text="second turn", key=victim.key).result(10)
        assert again.end == "completed" and again.final_text == "second turn"
        lines = wait_until(lambda: rebuilt(sc, victim.key), timeout=5, what="agent rebuilt from store")
        assert lines[0]["messages"] == 3  # first turn's two rows + this turn's user message
        msgs = transcript(sessions, victim.session_id)
        assert [(m.role, m.content) for m in msgs] == [
            ("user", "first 0"), ("assistant", "first 0"), ("user", "second turn"), ("assistant", "second turn")]
        assert get_session(sessions, victim.key).turn_count == 2
    finally:
        sc.stop()


def test_memory_pressure_sheds_and_rebuilds(tmp_path):
    shed_and_rebuild(tmp_path, "pressure", memory_high_mb=1, protect_recent=1)


def test_lru_cap_evicts_and_rebuilds(tmp_path):
    shed_and_rebuild(tmp_path, "lru", n_evicted=3, max_size=2, memory_high_mb="off")


def test_idle_ttl_unmounts_and_rebuilds(tmp_path):
    shed_and_rebuild(tmp_path, "ttl", idle_ttl_secs=0.5, memory_high_mb="off")


def test_config_accepts_a_fractional_idle_ttl(tmp_path):
    from agent_sidecar.config import load_config
    path = tmp_path / "c.toml"
    path.write_text(shed_config(idle_ttl_secs=0.5))
    assert load_config(str(path)).agent_cache.idle_ttl_secs == 0.5


def test_warm_agent_is_not_rebuilt(tmp_path):
    """The control: with the defaults nothing is shed, so a second turn is a cache hit."""
    sc = Sidecar(tmp_path / "data", config=shed_config(sweep_interval_secs=0.2), workers=1).start()
    try:
        first = start(sc.prompts(), text="one", src=source()).result(10)
        time.sleep(0.6)
        second = start(sc.prompts(), text="two", key=first.key).result(10)
        assert second.end == "completed"
        assert rebuilt(sc, first.key) == [] and log_lines(sc, "agents evicted") == []
    finally:
        sc.stop()

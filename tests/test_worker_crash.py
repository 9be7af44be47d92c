"""A worker killed with SIGKILL mid-turn (issue 4, "A dead worker"): its turn
ends failed WORKER_CRASHED, the session is marked resume_pending, a dangling
tool call gets a synthetic error result, a new worker takes the slot, and the
other worker's turns go on untouched."""

from __future__ import annotations

import json
import os
import signal

import grpc
import pytest

from agent_sidecar.turns.pool import rendezvous
from agent_sidecar.v1 import session_service_pb2 as spb
from helpers_busy import (
    ToolHost,
    get_session,
    log_lines,
    run,
    scripted,
    slow_echo,
    source,
    tool_calls_answered,
    unanswered_calls,
    transcript,
    wait_until,
    words,
)
from sidecar_proc import Sidecar

WORKERS = 2
CONFIG = (slow_echo("main")
          + scripted("thang", [{"tool_calls": [{"name": "test.hang", "id": "h1"}]}, {"text": "recovered"}],
                     tools=["test.*"]))


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    s = Sidecar(tmp_path_factory.mktemp("crash") / "data", config=CONFIG, workers=WORKERS).start()
    yield s
    s.stop()


def ready_lines(sc, index: int) -> list[dict]:
    return [x for x in log_lines(sc, "worker ready") if x.get("index") == index]


def worker_pid(sc, index: int) -> int:
    lines = wait_until(lambda: ready_lines(sc, index), timeout=5, what=f"worker {index} ready")
    pid = lines[-1]["pid"]
    os.kill(pid, 0)  # alive
    return pid


def session_on_slot(sc, slot: int, profile: str = ""):
    """A fresh session whose key hashes to this worker slot."""
    for _ in range(200):
        s = sc.sessions().GetOrCreateSession(
            spb.GetOrCreateSessionRequest(source=source(), profile=profile), timeout=10).session
        if rendezvous(s.session_key, WORKERS) == slot:
            return s
    raise AssertionError(f"no key hashed to slot {slot}")


def kill_worker(sc, index: int) -> tuple[int, int]:
    """SIGKILL the worker serving this slot: (its pid, how many 'worker ready' lines it had)."""
    pid = worker_pid(sc, index)
    before = len(ready_lines(sc, index))
    os.kill(pid, signal.SIGKILL)
    return pid, before


def test_killed_worker_fails_its_turn_and_is_replaced(sc):
    prompts, sessions = sc.prompts(), sc.sessions()
    victim, bystander = session_on_slot(sc, 0), session_on_slot(sc, 1)
    a = run(prompts, text=words(30, "a"), key=victim.session_key)
    b = run(prompts, text=words(30, "b"), key=bystander.session_key)
    a.wait_for("text_delta")
    b.wait_for("text_delta")
    old_pid, before = kill_worker(sc, 0)
    a.result(10)
    assert a.end == "failed" and a.terminal.failed.reason == "WORKER_CRASHED", a.kinds()
    assert a.error.code() == grpc.StatusCode.UNAVAILABLE and a.reason == "WORKER_CRASHED"
    s = get_session(sessions, victim.session_key)
    assert s.resume_pending and s.resume_reason == "worker_crashed"
    assert s.session_id == victim.session_id and not s.suspended
    fresh = wait_until(lambda: len(ready_lines(sc, 0)) > before and ready_lines(sc, 0)[-1],
                       timeout=3, what="a replacement worker")
    assert fresh["pid"] != old_pid  # a replacement, found within the bounded wait above
    assert fresh.get("grpc_loaded") is False
    # the other worker's turn went on untouched
    b.result(15)
    assert b.end == "completed" and b.final_text == words(30, "b")
    assert "WORKER_CRASHED" not in str(b.kinds())
    assert worker_pid(sc, 1) == ready_lines(sc, 1)[0]["pid"]
    # the next turn on the crashed session runs on the new worker
    nxt = run(prompts, text="are you back", key=victim.session_key).result(10)
    assert nxt.end == "completed" and nxt.final_text == "are you back"
    assert nxt.session_id == victim.session_id
    after = get_session(sessions, victim.session_key)
    assert not after.resume_pending and after.resume_reason == ""
    msgs = transcript(sessions, victim.session_id)
    users = [m.content for m in msgs if m.role == "user"]
    assert users == [words(30, "a"), "are you back"]
    assert msgs[-1].role == "assistant" and msgs[-1].content == "are you back"


def test_dangling_tool_call_gets_a_synthetic_result(sc):
    host = ToolHost(sc.tools(), "test", [("test.hang", "never answers", {"type": "object"})],
                    lambda inv: None)
    try:
        host.wait_registered()
        victim = session_on_slot(sc, 1, profile="thang")
        p = run(sc.prompts(), text="call it", key=victim.session_key)
        assert host.on_invocation.wait(10), p.kinds()
        p.wait_for("tool_call")
        kill_worker(sc, 1)
        p.result(10)
        assert p.end == "failed" and p.reason == "WORKER_CRASHED"
        msgs = transcript(sc.sessions(), victim.session_id)
        assert [m.role for m in msgs] == ["user", "assistant", "tool"]
        calls, answered = tool_calls_answered(msgs)
        assert calls == ["h1"] and answered == {"h1"} and unanswered_calls(msgs) == []
        assert msgs[2].tool_call_id == "h1" and "error" in json.loads(msgs[2].content)
        assert get_session(sc.sessions(), victim.session_key).resume_reason == "worker_crashed"
    finally:
        host.close()
    # with the host gone the call is an error result and the turn goes on to its text
    wait_until(lambda: host.ended.is_set(), timeout=5, what="host stream end")
    nxt = run(sc.prompts(), text="again", key=victim.session_key).result(20)
    assert nxt.end == "completed" and nxt.final_text == "recovered", (nxt.kinds(), nxt.error)
    assert unanswered_calls(transcript(sc.sessions(), victim.session_id)) == []

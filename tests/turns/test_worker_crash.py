"""A worker killed with SIGKILL mid-turn (issue 4, "A dead worker"): its turn
ends failed WORKER_CRASHED, the session is marked resume_pending, a dangling
tool call gets a synthetic error result, a new worker takes the slot, and the
other worker's turns go on untouched."""

from __future__ import annotations

import contextlib
import json
import os
import signal

import grpc
import pytest
from helpers import child_hooks
from helpers.config import scripted, slow_echo, table
from helpers.ids import source, words
from helpers.logs import log_lines
from helpers.procs import alive, grpc_loaded, worker_pid
from helpers.sessions import get_session, transcript
from helpers.streams import start
from helpers.tools import ToolHost, tool_calls_answered, unanswered_calls
from helpers.waiting import wait_until
from sidecar_proc import Sidecar

from agent_sidecar.recovery.startup import MARKER
from agent_sidecar.turns.pool import rendezvous
from agent_sidecar.v1 import session_service_pb2 as spb

WORKERS = 2
CONFIG = (slow_echo("main")
          + scripted("thang", [{"tool_calls": [{"name": "test.hang", "id": "h1"}]}, {"text": "recovered"}],
                     tools=["test.*"]))


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    s = Sidecar(tmp_path_factory.mktemp("crash") / "data", config=CONFIG, workers=WORKERS).start()
    yield s
    s.stop()


def live_worker(sc, index: int) -> int:
    """The pid of the worker in this slot, once there is one."""
    pid = wait_until(lambda: worker_pid(sc, index), timeout=5, what=f"worker {index} running")
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


def kill_worker(sc, index: int) -> int:
    """SIGKILL the worker serving this slot; its pid."""
    pid = live_worker(sc, index)
    os.kill(pid, signal.SIGKILL)
    return pid


def test_killed_worker_fails_its_turn_and_is_replaced(sc):
    prompts, sessions = sc.prompts(), sc.sessions()
    victim, bystander = session_on_slot(sc, 0), session_on_slot(sc, 1)
    a = start(prompts, text=words(30, "a"), key=victim.session_key)
    b = start(prompts, text=words(30, "b"), key=bystander.session_key)
    a.wait_for("text_delta")
    b.wait_for("text_delta")
    other = live_worker(sc, 1)
    old_pid = kill_worker(sc, 0)
    a.result(10)
    assert a.end == "failed" and a.last.failed.reason == "WORKER_CRASHED", a.kinds()
    assert a.error.code() == grpc.StatusCode.UNAVAILABLE and a.reason == "WORKER_CRASHED"
    s = get_session(sessions, victim.session_key)
    assert s.resume_pending and s.resume_reason == "worker_crashed"
    assert s.session_id == victim.session_id and not s.suspended
    fresh = wait_until(lambda: (lambda p: p if p not in (None, old_pid) else None)(worker_pid(sc, 0)),
                       timeout=3, what="a replacement worker")
    assert fresh != old_pid  # a replacement, found within the bounded wait above
    assert not grpc_loaded(fresh)
    # the other worker's turn went on untouched
    b.result(15)
    assert b.end == "completed" and b.final_text == words(30, "b")
    assert "WORKER_CRASHED" not in str(b.kinds())
    assert live_worker(sc, 1) == other
    # the next turn on the crashed session runs on the new worker
    nxt = start(prompts, text="are you back", key=victim.session_key).result(10)
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
        p = start(sc.prompts(), text="call it", key=victim.session_key)
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
    nxt = start(sc.prompts(), text="again", key=victim.session_key).result(20)
    assert nxt.end == "completed" and nxt.final_text == "recovered", (nxt.kinds(), nxt.error)
    assert unanswered_calls(transcript(sc.sessions(), victim.session_id)) == []


RESPAWN_FAILED = "respawning worker failed; retrying"


def test_a_replacement_that_keeps_failing_is_one_warning_and_the_slot_comes_back(tmp_path):
    """A dead worker whose replacements cannot start (a broken install) was
    retried every half second, each try two error lines (the child's bare
    traceback among them, later its line) and the parent's traceback. Now the
    first failure is one warning and the child's own line, the retries (at
    growing intervals) debug lines without a traceback; once the install is
    mended the slot takes turns again."""
    with broken_slot(tmp_path) as (sc, broken):
        tries = wait_until(lambda: lines if len(lines := log_lines(sc, RESPAWN_FAILED)) >= 3 else None,
                           timeout=30, what="three failed replacements")
        assert [x["level"] for x in tries] == ["warning"] + ["debug"] * (len(tries) - 1), tries
        assert all("ImportError" in x["error"] and "exc" not in x for x in tries), tries
        assert len(log_lines(sc, "child process failed")) == 1, sc.log()
        broken.unlink()
        assert slot_back(sc).final_text == "back"


def test_a_turn_whose_worker_cannot_be_replaced_ends_unavailable_then_the_slot_takes_turns_again(tmp_path):
    """A turn for a slot whose worker died and whose replacement fails to
    start (a broken install) waited for that worker until its timeout, half
    an hour by default: the Prompt got `accepted`, `started`, then nothing.
    Now it ends UNAVAILABLE naming the worker and why, whether it came while
    the replacement was starting or after it failed; once the install is
    mended the slot runs turns again."""
    with broken_slot(tmp_path) as (sc, broken):
        for text in ("while it is replaced", "after its replacement failed"):
            out = start(sc.prompts(), text=text, src=source()).result(timeout=30)
            assert out.end == "failed" and out.reason == "UNAVAILABLE", (out.kinds(), out.error)
            assert "worker 0 cannot be started" in out.details and "ImportError" in out.details, out.details
        broken.unlink()
        assert slot_back(sc).final_text == "back"


@contextlib.contextmanager
def broken_slot(tmp_path):
    """A one-worker sidecar whose worker was killed while its install is
    broken (its replacements fail to start until ``broken`` is removed)."""
    broken = tmp_path / "broken"
    env = child_hooks.env(broken="agent_sidecar.turns.worker", broken_while=broken)
    with Sidecar(tmp_path / "data", workers=1, env=env) as sc:
        broken.touch()
        os.kill(live_worker(sc, 0), signal.SIGKILL)
        # Its death seen: a prompt sent before could go to the dying worker (WORKER_CRASHED).
        wait_until(lambda: sc.status().workers[0].restarts >= 1, 30, what="worker 0's death seen")
        yield sc, broken


def slot_back(sc: Sidecar):
    """The first prompt that completes once the install is mended: until a
    replacement starts (retried at growing intervals) the slot's turns end
    UNAVAILABLE."""
    def completed():
        run = start(sc.prompts(), text="back", src=source()).result(timeout=30)
        assert run.end == "completed" or run.reason == "UNAVAILABLE", (run.kinds(), run.error)
        return run if run.end == "completed" else None
    return wait_until(completed, timeout=60, what="the slot's worker back")


def test_workers_stuck_at_a_stop_share_one_wait_then_are_killed_and_named(tmp_path):
    """Every worker's loop is stuck (stopped, as a backend blocking it would
    leave it) when the sidecar stops: they had 5 s each, one after the other
    (a minute and more on a large machine, past a supervisor's stop timeout),
    and were killed without a word. Now they share the 5 s, then are killed
    and named; the stop is still clean."""
    with Sidecar(tmp_path / "data", workers=3, config=table("sidecar", drain_timeout=1)) as sc:
        pids = [live_worker(sc, i) for i in range(3)]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        assert sc.stop() == 0, sc.log()
    (line,) = log_lines(sc, "workers did not stop in time; killed")  # the line is the behaviour
    assert line["workers"] == [0, 1, 2], line
    assert not any(alive(pid) for pid in pids)
    assert (sc.data_dir / MARKER).exists()

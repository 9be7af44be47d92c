"""What a turn sent commits before the next turn of its lane writes, even when
the frame flush that carried it was refused and sent again (docs/cluster.md
"Fencing"): a flush holding a lane whose epoch moved is refused whole, and the
flushes behind it with it (turns/flush.py); the bus sends them again, behind
whatever was written to the store meanwhile. A prompt that found the lane idle
then must not write its user message in its accept: it would land between the
last turn's tool call and its result (the soak's "tool calls without a
result", seen once in tests/cluster/test_cluster_soak.py).

Made deterministic by holding the store's frames lock (what every writer of
the cluster takes first) while the node's flushes queue up behind it, and by
moving another lane's epoch in that same transaction, as another node's take
would: one real sidecar on a real PostgreSQL database."""

from __future__ import annotations

import threading

from helpers.cluster import Cluster, FramesLock, lock_waiters
from helpers.config import echo, scripted
from helpers.ids import source, words
from helpers.metrics import metrics_config, scrape
from helpers.pg import free_port
from helpers.sessions import transcript
from helpers.streams import PromptRun, assert_well_formed, prompt_req
from helpers.tools import AB_SCHEMA, ToolHost
from helpers.waiting import wait_until

from agent_sidecar.v1 import session_service_pb2 as spb

STEPS = [{"tool_calls": [{"name": "calc.add", "arguments": {"a": 2, "b": 3}}]}, {"text": "five"}]
CONFIG = scripted("tools", STEPS, tools=["calc.*"]) + echo("slow", 20)
MODEL_CALLS = "agent_sidecar_model_call_duration_seconds_count"  # reported with a turn's end
ADMITTED = "agent_sidecar_prompts_admitted_bytes"  # the prompts placed and not ended
BACKLOG = "agent_sidecar_store_writer_backlog_jobs"  # jobs handed to the writer, not answered


def test_a_prompt_on_an_idle_lane_writes_after_what_its_last_turn_sent_though_that_flush_was_refused(
        tmp_path, cluster_dsn):
    """Lane T's turn waits for a tool's result while lane S streams. The
    frames lock is held: S's next flush waits for it in the writer. The tool
    answers: T's turn writes its result and reply and ends (its flushes queue
    behind S's), then a new prompt finds T's lane idle (its accept queues
    behind them). The lock's transaction moves S's epoch and commits: S's
    flush is refused and T's with it, and sent again after the new prompt's
    accept. T's transcript must still hold each turn whole, in order."""
    port = free_port()
    with Cluster(tmp_path, cluster_dsn, n=1, config=CONFIG + metrics_config(port), lease_ttl_s=60.0) as c:
        node = c["a"]
        answer = threading.Event()

        def add(inv) -> tuple[bool, str, str]:
            answer.wait(60)
            return True, '{"sum": 5}', ""
        with ToolHost(node.tools(), "calc", [("calc.add", "Add two numbers", AB_SCHEMA)], add) as host:
            src = source()
            first = PromptRun(node.prompts(), text="add them", src=src, profile="tools")
            assert host.on_invocation.wait(30), first.kinds()
            streaming = PromptRun(node.prompts(), text=words(600), src=source(), profile="slow")
            streaming.wait_for("text_delta")
            reported = scrape(port).total(MODEL_CALLS)
            lock = FramesLock(c.dsn, streaming.key)
            try:
                wait_until(lambda: lock_waiters(c.dsn) > 0, timeout=30, what="the node's writer behind the lock")
                answer.set()  # the first turn ends, its last writes queued behind the lock
                wait_until(lambda: scrape(port).total(MODEL_CALLS) >= reported + 2, timeout=30,
                           what="the first turn's end (its model calls reported)")
                held = scrape(port).value(ADMITTED)
                second = PromptRun(node.prompts(), prompt_req(text="once more", source=src, profile="tools"))
                wait_until(lambda: scrape(port).value(ADMITTED) > held, timeout=30,
                           what="the new prompt placed (its accept queued behind the lock)")
            finally:
                lock.release()
            first.result(60)
            second.result(60)
        assert_well_formed(first)
        assert_well_formed(second)
        messages = transcript(node.sessions(), second.session_id)
        assert [(m.role, m.content) for m in messages] == [
            ("user", "add them"), ("assistant", ""), ("tool", '{"sum": 5}'), ("assistant", "five"),
            ("user", "once more"), ("assistant", ""), ("tool", '{"sum": 5}'), ("assistant", "five")], messages


def test_a_rewind_right_after_a_turn_hides_all_of_it_though_the_flush_carrying_its_end_was_refused(
        tmp_path, cluster_dsn):
    """As above, with RewindSession(n=1) in place of the new prompt: its job
    must run after the turn's last writes, hiding the whole turn, not leave
    its tool result and reply live without their call and user message."""
    port = free_port()
    with Cluster(tmp_path, cluster_dsn, n=1, config=CONFIG + metrics_config(port), lease_ttl_s=60.0) as c:
        node = c["a"]
        with ToolHost(node.tools(), "calc", [("calc.add", "Add two numbers", AB_SCHEMA)]) as host:  # answers when told
            first = PromptRun(node.prompts(), text="add them", src=source(), profile="tools")
            wait_until(lambda: len(host.invocations) == 1, timeout=30, what="the first turn's tool call")
            other = PromptRun(node.prompts(), text="add those", src=source(), profile="tools")
            wait_until(lambda: len(host.invocations) == 2, timeout=30, what="the other turn's tool call")
            session_id = first.wait_for("accepted").session_id
            reported = scrape(port).total(MODEL_CALLS)
            lock = FramesLock(c.dsn, other.key)
            try:
                host.answer(host.invocations[1], True, '{"sum": 5}')  # the other lane's flush waits for the lock
                wait_until(lambda: lock_waiters(c.dsn) > 0, timeout=30, what="the node's writer behind the lock")
                host.answer(host.invocations[0], True, '{"sum": 5}')  # the first turn's last writes queue behind
                wait_until(lambda: scrape(port).total(MODEL_CALLS) >= reported + 4, timeout=30,
                           what="both turns' ends (their model calls reported)")
                backlog = scrape(port).value(BACKLOG)
                rewound = {}
                rewind = threading.Thread(target=lambda: rewound.update(r=node.sessions().RewindSession(
                    spb.RewindSessionRequest(session_id=session_id, n=1), timeout=60)))
                rewind.start()
                wait_until(lambda: scrape(port).value(BACKLOG) > backlog, timeout=30,
                           what="the rewind's job handed to the writer")
            finally:
                lock.release()
            rewind.join(60)
            first.result(60)
        assert_well_formed(first)
        assert rewound["r"].rewound_count == 4, rewound
        assert list(transcript(node.sessions(), session_id)) == []

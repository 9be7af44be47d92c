"""A profile's ``tool_timeout_s``: how long a tool call waits for its host's
result before the model gets an error result and the turn goes on."""

from __future__ import annotations

import json

from helpers.config import scripted
from helpers.ids import source
from helpers.streams import start
from helpers.tools import ToolHost
from helpers.waiting import wait_until
from sidecar_proc import Sidecar

STEPS = [{"tool_calls": [{"name": "test.hang", "id": "h1"}]}, {"text": "went on"}]


def test_a_call_waits_its_profiles_tool_timeout_then_the_turn_goes_on(tmp_path):
    sc = Sidecar(tmp_path / "data", workers=1,
                 config=scripted("quick", STEPS, tools=["test.*"], tool_timeout_s=1.5)
                 + scripted("patient", STEPS, tools=["test.*"])).start()
    try:
        with ToolHost(sc.tools(), "test", [("test.hang", "never answers", {"type": "object"})]) as host:
            p = start(sc.prompts(), text="call it", src=source(), profile="quick").result(30)
            assert p.end == "completed" and p.final_text == "went on", (p.kinds(), p.error)
            result = p.frame("tool_result").tool_result
            assert not result.ok and "timed out after 1.5 s" in json.loads(result.result_json)["error"], result
            assert host.invocations[0].timeout_ms == 1500
            start(sc.prompts(), text="call it", src=source(), profile="patient")
            wait_until(lambda: len(host.invocations) == 2, what="the second call")
            assert host.invocations[1].timeout_ms == 60_000  # the default
    finally:
        sc.stop()


def test_a_tool_timeout_of_ages_is_sent_as_the_largest_every_client_reads(tmp_path):
    """A profile may wait for its tools as long as it likes (any finite number):
    before, one past int64 milliseconds could not be put in an invocation, and
    the host's stream was given up with every tool it served (its later calls,
    of every session: "no tool host serves"), while the host went on unaware."""
    answered = [{"text_from_last_tool_result": True}]
    sc = Sidecar(tmp_path / "data", workers=1,
                 config=scripted("ages", STEPS[:1] + answered, tools=["test.*"], tool_timeout_s=1e17)
                 + scripted("usual", STEPS[:1] + answered, tools=["test.*"])).start()
    try:
        with ToolHost(sc.tools(), "test", [("test.hang", "answers", {"type": "object"})],
                      lambda inv: (True, '{"at": "once"}', "")) as host:
            for profile in ("ages", "usual"):
                p = start(sc.prompts(), text="call it", src=source(), profile=profile).result(30)
                assert p.end == "completed" and p.final_text == '{"at": "once"}', (profile, p.final_text)
            assert [inv.timeout_ms for inv in host.invocations] == [2**53 - 1, 60_000]
    finally:
        sc.stop()

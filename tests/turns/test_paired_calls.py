"""turns/agent.py ``paired_calls``: the model's input from a stored transcript
holds every tool call answered before the next message, whatever an adapter
wrote (end to end, with an OpenAI-compatible server that sees the input:
tests/models/test_turns_openai.py)."""

from __future__ import annotations

import pytest

from agent_sidecar.turns.agent import NO_RESULT, paired_calls

pytestmark = pytest.mark.store_free("a pure function of the worker")


def _calling(*ids: str) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": i, "type": "function", "function": {"name": f"t_{i}", "arguments": "{}"}} for i in ids]}


def _result(call_id: str, content: str = "42") -> dict:
    return {"role": "tool", "tool_call_id": call_id, "name": f"t_{call_id}", "content": content}


def _shape(messages: list[dict]) -> list[tuple]:
    return [(m["role"], m.get("tool_call_id"), m["content"] == NO_RESULT) for m in messages]


def test_a_well_formed_transcript_is_passed_as_it_is():
    messages = [{"role": "user", "content": "hi"}, _calling("a", "b"), _result("a"), _result("b"),
                {"role": "assistant", "content": "done"}]
    assert paired_calls(messages) is messages


def test_calls_left_open_are_answered_where_the_next_message_comes_and_at_the_end():
    messages = [{"role": "user", "content": "u1"}, _calling("a", "b"), _result("b"),
                {"role": "user", "content": "u2"}, _calling("c")]
    assert _shape(paired_calls(messages)) == [
        ("user", None, False), ("assistant", None, False), ("tool", "b", False), ("tool", "a", True),
        ("user", None, False), ("assistant", None, False), ("tool", "c", True)]
    assert len(messages) == 5  # the stored transcript's list is left alone


def test_tool_messages_answering_no_open_call_are_left_out():
    messages = [_result("x"), {"role": "user", "content": "u"}, _calling("a"), _result("a"), _result("a"),
                {"role": "assistant", "content": "ok"}]
    assert _shape(paired_calls(messages)) == [
        ("user", None, False), ("assistant", None, False), ("tool", "a", False), ("assistant", None, False)]

"""The openai backend through PromptService, against FakeOpenAI: a real
OpenAI-compatible HTTP server on loopback, one per scenario (issue 3)."""

from __future__ import annotations

import json

import grpc
import pytest
from helpers.config import profile
from helpers.fake_openai import FakeOpenAI
from helpers.ids import source
from helpers.sessions import get_session, msg, seed, transcript
from helpers.streams import assert_failed, assert_well_formed, prompt_req, run
from sidecar_proc import Sidecar

SCRIPTS = {
    "stream": [{"text": "hello from the fake model"}],
    "tools": [{"tool_calls": [{"name": "test.add", "arguments": {"a": 2, "b": 3}, "id": "call_x"}]},
              {"text": "the answer is 5"}],
    "flaky": [{"status": 500}, {"text": "recovered fine"}],
    "down": [{"status": 500}],
    "broken": [{"text": "half an answer", "truncate": True}],
    "endless_error": [{"status": 500, "content_type": "text/plain", "prefix": "overloaded ", "endless": "x"}],
    "bad_call_id": [{"raw": 'data: {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": 7}]}}]}\n\n'
                            'data: {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}\n\ndata: [DONE]\n\n'}],
    "paired": [{"text": "noted"}],
    "cached": [{"text": "cached answer", "usage": {
        "prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110,
        "prompt_tokens_details": {"cached_tokens": 80}}}],
}


@pytest.fixture(scope="module")
def fakes():
    with FakeOpenAI.several(SCRIPTS) as servers:
        yield servers


@pytest.fixture(scope="module")
def sc(tmp_path_factory, fakes):
    # the config names the fake servers' ports, so it is written after they started
    profiles = "".join(profile(name, "openai", {
        "base_url": fake.url, "model": "gpt-test", "backoff_initial_s": 0.01,
        "backoff_max_s": 0.05, "max_retries": 2}, tools=["test.*"]) for name, fake in fakes.items())
    profiles += "[stream]\ncoalesce_ms = 0\n"  # one frame per chunk: what the backend streamed, as it came
    s = Sidecar(tmp_path_factory.mktemp("openai") / "data", config=profiles, workers=2).start()
    yield s
    s.stop()


def test_streaming_text(sc, fakes):
    out = run(sc.prompts(), prompt_req(text="hi there", profile="stream"))
    assert_well_formed(out)
    deltas = [f.text_delta.text for f in out.frames if f.WhichOneof("event") == "text_delta"]
    assert len(deltas) == 5  # one chunk per word, streamed as they came
    assert "".join(deltas) == "hello from the fake model"
    assert out.last.completed.final_text == "hello from the fake model"
    assert out.usage() == (10, 5)
    s = get_session(sc.sessions(), out.frames[0].session_key)
    assert (s.input_tokens, s.output_tokens, s.turn_count) == (10, 5, 1)

    (body,) = fakes["stream"].requests
    assert body["model"] == "gpt-test" and body["stream"] is True
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert body["messages"][-1]["content"] == "hi there"
    assert [(m.role, m.content) for m in transcript(sc.sessions(), out.frames[0].session_id)] == [
        ("user", "hi there"), ("assistant", "hello from the fake model")]


def test_cached_prompt_tokens_count_once(sc):
    """80 of 100 prompt tokens came from the provider's cache: the session's
    counters are disjoint and total what the provider billed (110)."""
    out = run(sc.prompts(), prompt_req(text="hello", profile="cached"))
    assert_well_formed(out)
    s = get_session(sc.sessions(), out.frames[0].session_key)
    assert (s.input_tokens, s.cache_read_tokens, s.output_tokens, s.total_tokens) == (20, 80, 10, 110), s
    assert s.last_prompt_tokens == 100, "the prompt's whole size, as the provider reported it"


def test_text_streamed_before_a_model_failure_stays_in_the_transcript(sc):
    """The stream breaks after text went out: the turn fails LLM_API_FAILURE and
    the transcript keeps what the user already saw."""
    out = run(sc.prompts(), prompt_req(text="go on", profile="broken"))
    assert_failed(out, "LLM_API_FAILURE", grpc.StatusCode.UNAVAILABLE)
    streamed = "".join(f.text_delta.text for f in out.frames if f.WhichOneof("event") == "text_delta")
    assert streamed == "half an answer"
    assert [(m.role, m.content) for m in transcript(sc.sessions(), out.frames[0].session_id)] == [
        ("user", "go on"), ("assistant", "half an answer")]


def test_tool_call_round_trip(sc, fakes, host):
    req = prompt_req(text="add 2 and 3", profile="tools")
    out = run(sc.prompts(), req)
    assert_well_formed(out)
    kinds = out.kinds()
    call = out.frames[kinds.index("tool_call")].tool_call
    result = out.frames[kinds.index("tool_result")].tool_result
    assert (call.call_id, call.name) == ("call_x", "test.add")  # the safe name mapped back
    assert json.loads(call.arguments_json) == {"a": 2, "b": 3}  # fragments merged
    assert result.ok and json.loads(result.result_json) == 5
    assert out.last.completed.final_text == "the answer is 5"
    assert [i.request_id for i in host.invocations].count(req.request_id) == 1

    first, second = fakes["tools"].requests
    assert [t["function"]["name"] for t in first["tools"]] == ["test__add"]
    tool_msgs = [m for m in second["messages"] if m["role"] == "tool"]
    assert len(tool_msgs) == 1 and tool_msgs[0]["tool_call_id"] == "call_x"
    assert json.loads(tool_msgs[0]["content"]) == 5
    asked = [m for m in second["messages"] if m.get("tool_calls")]
    assert asked and asked[0]["tool_calls"][0]["function"]["name"] == "test__add"

    roles = [m.role for m in transcript(sc.sessions(), out.frames[0].session_id)]
    assert roles == ["user", "assistant", "tool", "assistant"]


def test_a_500_then_success_is_retried(sc, fakes):
    out = run(sc.prompts(), prompt_req(text="try again", profile="flaky"))
    assert_well_formed(out)
    assert out.last.completed.final_text == "recovered fine"
    assert len(fakes["flaky"].requests) == 2
    assert fakes["flaky"].requests[0] == fakes["flaky"].requests[1]  # the same call, retried


def test_permanent_failure_is_llm_api_failure(sc, fakes):
    out = run(sc.prompts(), prompt_req(text="anyone?", profile="down"))
    assert_failed(out, "LLM_API_FAILURE", grpc.StatusCode.UNAVAILABLE)
    assert "500" in out.last.failed.message
    assert len(fakes["down"].requests) == 3  # the call and max_retries = 2 retries
    assert out.count("text_delta") == 0
    s = get_session(sc.sessions(), out.frames[0].session_key)
    assert s.turn_count == 0
    # the user's message stays; no assistant message was written
    assert [m.role for m in transcript(sc.sessions(), out.frames[0].session_id)] == ["user"]


def test_an_endless_error_body_fails_the_turn_with_an_excerpt(sc, fakes):
    """The 500's body never ends: the turn still fails (after the retries) with
    the start of it, and the worker goes on serving."""
    out = run(sc.prompts(), prompt_req(text="anyone?", profile="endless_error"))
    assert_failed(out, "LLM_API_FAILURE", grpc.StatusCode.UNAVAILABLE)
    assert "HTTP 500" in out.last.failed.message and "overloaded xxx" in out.last.failed.message
    assert len(fakes["endless_error"].requests) == 3
    assert_well_formed(run(sc.prompts(), prompt_req(text="hi again", profile="stream")))


def test_a_call_id_that_is_not_a_string_fails_the_turn_naming_it(sc):
    """A tool call whose id is a number: a failed frame naming the field (the
    number used to reach the worker's frames and the turn never ended)."""
    out = run(sc.prompts(), prompt_req(text="call something", profile="bad_call_id"))
    assert_failed(out, "LLM_API_FAILURE", grpc.StatusCode.UNAVAILABLE)
    assert "tool_calls[0].id is a JSON integer (7), expected string" in out.last.failed.message


def test_calls_a_transcript_leaves_unanswered_reach_the_model_answered(sc, fakes):
    """A transcript may end on tool calls nobody answered (an adapter seeded or
    appended them) or hold a tool message answering no call (a store written
    before the transcript RPCs checked). Sent as they are, an OpenAI-compatible
    backend refuses every later turn of the session; the model gets each call
    answered (an error result) before the next message, and the store keeps
    what was written."""
    calls = [{"id": "c1", "type": "function", "function": {"name": "t__x", "arguments": "{}"}},
             {"id": "c2", "type": "function", "function": {"name": "t__y", "arguments": "{}"}}]
    session = seed(sc.sessions(), src=source(), profile="paired", messages=[
        msg("user", "do it"), msg("assistant", "", tool_calls_json=json.dumps(calls))])
    out = run(sc.prompts(), prompt_req(text="and now?", session_key=session.session_key, profile="paired"))
    assert out.last.completed.final_text == "noted", out.kinds()
    sent = [m for m in fakes["paired"].requests[-1]["messages"] if m["role"] != "system"]
    assert [(m["role"], m.get("tool_call_id")) for m in sent] == [
        ("user", None), ("assistant", None), ("tool", "c1"), ("tool", "c2"), ("user", None)], sent
    assert all("no result" in m["content"] for m in sent if m["role"] == "tool")
    assert [m.role for m in transcript(sc.sessions(), session.session_id)] == ["user", "assistant", "user",
                                                                                "assistant"]

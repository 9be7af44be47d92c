"""Model backends: echo, scripted, openai (against a real local HTTP server), registry.

pytest-asyncio is not installed: each test drives its coroutine with asyncio.run.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time

import pytest
from helpers.fake_openai import FakeOpenAI

from agent_sidecar.models import (
    ModelError,
    ModelRequest,
    TextDelta,
    ToolCallRequest,
    UsageReport,
    backend_names,
    load_backend,
)
from agent_sidecar.models.echo import EchoModel
from agent_sidecar.models.openai import OpenAIModel
from agent_sidecar.models.openai_wire import StreamParser, call_tag, events_from_message, safe_tool_name
from agent_sidecar.models.scripted import ScriptedModel

pytestmark = pytest.mark.store_free("model backends, in-process against a local HTTP server")


def user(text, system="you are a bot"):
    return [{"role": "system", "content": system}, {"role": "user", "content": text}]


def collect(backend, request):
    async def run():
        try:
            return [event async for event in backend.stream(request)]
        finally:
            await backend.aclose()

    return asyncio.run(run())


def text_of(events):
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def of_type(events, cls):
    return [e for e in events if isinstance(e, cls)]


# -- echo ------------------------------------------------------------------

@pytest.mark.parametrize("text", ["hello world", "  leading and trailing  ", "tabs\tand\nnewlines  here", "x",
                                  "   ", ""])
def test_echo_round_trips_text_exactly(text):
    events = collect(EchoModel({}), ModelRequest(messages=user(text)))
    assert text_of(events) == text
    assert isinstance(events[-1], UsageReport)
    assert events[-1].output_tokens == len(text.split())
    assert not of_type(events, ToolCallRequest)


def test_echo_one_word_is_two_events_and_word_per_delta():
    events = collect(EchoModel({}), ModelRequest(messages=user("hi")))
    assert events == [TextDelta("hi"), UsageReport(input_tokens=5, output_tokens=1)]
    deltas = of_type(collect(EchoModel({}), ModelRequest(messages=user("a b  c"))), TextDelta)
    assert [d.text for d in deltas] == ["a ", "b  ", "c"]


def test_echo_uses_last_user_message_and_prefix():
    messages = user("first") + [{"role": "assistant", "content": "x"}, {"role": "user", "content": "second one"}]
    events = collect(EchoModel({"prefix": "echo: "}), ModelRequest(messages=messages))
    assert text_of(events) == "echo: second one"
    assert len(of_type(events, TextDelta)) == 2
    assert events[-1].output_tokens == 3


def test_echo_latency_option():
    start = time.monotonic()
    collect(EchoModel({"token_latency_ms": 30}), ModelRequest(messages=user("a b c d")))
    assert time.monotonic() - start >= 0.11
    with pytest.raises(ValueError, match="token_latency_ms"):
        EchoModel({"token_latency_ms": -1})
    with pytest.raises(ValueError, match="unknown option"):
        EchoModel({"latency": 1})


# -- scripted ----------------------------------------------------------------

def run_script(steps, iterations=1, messages=None, **options):
    model = ScriptedModel({"steps": steps, **options})
    messages = messages or user("go")
    return [collect(model, ModelRequest(messages=messages, iteration=i)) for i in range(iterations)]


def test_scripted_text_then_default_empty_final():
    first, second = run_script([{"text": "hello  big world"}], iterations=2)
    assert [e.text for e in of_type(first, TextDelta)] == ["hello  ", "big ", "world"]
    assert first[-1] == UsageReport(input_tokens=5, output_tokens=3)
    assert second == [UsageReport(input_tokens=5, output_tokens=0)]


def test_scripted_string_shorthand_and_repeat():
    calls = run_script(["one", {"text": "again", "repeat": True}], iterations=4)
    assert [text_of(c) for c in calls] == ["one", "again", "again", "again"]


def test_scripted_tool_calls_with_text_and_ids():
    steps = [{"text": "let me add", "tool_calls": [
        {"name": "test.add", "arguments": {"a": 1, "b": 2}},
        {"name": "test.echo", "arguments": '{"x": "y"}', "id": "mine"},
    ]}, {"text": "done"}]
    model = ScriptedModel({"steps": steps})
    events = collect(model, ModelRequest(messages=user("go"), iteration=0))
    assert text_of(events) == "let me add"
    calls = of_type(events, ToolCallRequest)
    assert calls == [ToolCallRequest("call_0_0", "test.add", '{"a": 1, "b": 2}'),
                     ToolCallRequest("mine", "test.echo", '{"x": "y"}')]
    assert isinstance(events[-1], UsageReport)
    assert text_of(collect(model, ModelRequest(messages=user("go"), iteration=1))) == "done"


def test_scripted_sleep_delay_and_token_latency():
    start = time.monotonic()
    (events,) = run_script([{"sleep_ms": 50, "delay_ms": 30, "token_latency_ms": 20, "text": "a b c"}])
    assert time.monotonic() - start >= 0.13
    assert text_of(events) == "a b c"


def test_scripted_sleep_is_cancellable():
    model = ScriptedModel({"steps": [{"sleep_ms": 10_000, "text": "late"}]})

    async def run():
        async def consume():
            return [e async for e in model.stream(ModelRequest(messages=user("go")))]
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(consume(), 0.05)

    asyncio.run(run())  # wait_for cancelled the sleeping model: TimeoutError above


def test_scripted_error_times_then_recovers():
    model = ScriptedModel({"steps": [{"error": "boom", "times": 2, "text": "recovered"}]})
    request = ModelRequest(messages=user("go"))
    for _ in range(2):
        with pytest.raises(ModelError, match="boom"):
            collect(model, request)
    assert text_of(collect(model, request)) == "recovered"
    forever = ScriptedModel({"steps": [{"error": "down"}]})
    for _ in range(3):
        with pytest.raises(ModelError, match="down"):
            collect(forever, request)


def test_scripted_echo_input_sees_user_messages_since_last_assistant():
    messages = user("old") + [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                                                             "function": {"name": "t.x", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "tool says hi"},
        {"role": "user", "content": "steered one"},
        {"role": "user", "content": [{"type": "text", "text": "steered two"}]},
    ]
    (events,) = run_script([{"echo_input": True}], messages=messages)
    assert text_of(events) == "steered one\nsteered two"
    (events,) = run_script([{"text_from_last_tool_result": True}], messages=messages)
    assert text_of(events) == "tool says hi"
    (events,) = run_script([{"echo_input": True}])
    assert text_of(events) == "go"


def test_scripted_usage_override_and_steps_file(tmp_path):
    path = tmp_path / "steps.json"
    path.write_text(json.dumps([{"text": "hi there", "usage": {"cost_usd": 0.5, "input_tokens": 7}}]))
    events = collect(ScriptedModel({"steps_file": str(path)}), ModelRequest(messages=user("go")))
    assert events[-1] == UsageReport(input_tokens=7, output_tokens=2, cost_usd=0.5)


@pytest.mark.parametrize("options, message", [
    ({"steps": {"text": "x"}}, "must be a list"),
    ({"steps": [{"txt": "x"}]}, r"step 0 has unknown key\(s\) \['txt'\]"),
    ({"steps": ["ok", 5]}, "step 1 must be a dict"),
    ({"steps": [{"text": "a", "echo_input": True}]}, "only one of"),
    ({"steps": [{"sleep_ms": -1}]}, "sleep_ms must be a finite number"),
    ({"steps": [{"kill": "everyone"}]}, "kill must be"),
    ({"steps": [{"times": 2}]}, "times only applies to error"),
    ({"steps": [{"tool_calls": [{"arguments": {}}]}]}, "needs a non-empty string 'name'"),
    ({"steps": [{"tool_calls": [{"name": "a.b", "arguments": "{nope"}]}]}, "not valid JSON"),
    ({"steps": [{"tool_calls": [{"name": "a.b", "arguments": [1]}]}]}, "must be a JSON object"),
    ({"steps": [{"usage": {"tokens": 1}}]}, "usage must be a dict"),
    ({}, "exactly one of 'steps' or 'steps_file'"),
    ({"steps_file": "/nonexistent/steps.json"}, "cannot read steps_file"),
    ({"steps": [], "bogus": 1}, "unknown option"),
])
def test_scripted_validation(options, message):
    with pytest.raises(ValueError, match=message):
        ScriptedModel(options)


KILL_CHILD = """
import asyncio, sys
from agent_sidecar.models.base import ModelRequest
from agent_sidecar.models.scripted import ScriptedModel
model = ScriptedModel({"steps": [{"text": "bye now", "kill": sys.argv[1]}]})
async def main():
    async for event in model.stream(ModelRequest(messages=[{"role": "user", "content": "x"}])):
        print(type(event).__name__, flush=True)
asyncio.run(main())
print("child survived", flush=True)
"""


def test_scripted_kill_worker_and_sidecar():
    # Each kill runs in throwaway subprocesses: "worker" kills the process running
    # the step (after streaming its text); "sidecar" kills its parent, then itself.
    worker = subprocess.run([sys.executable, "-c", KILL_CHILD, "worker"], capture_output=True, text=True, timeout=60)
    assert worker.returncode == -9
    assert worker.stdout.split() == ["TextDelta", "TextDelta"]
    parent_code = ("import subprocess, sys, time; subprocess.run([sys.executable, '-c', sys.argv[1], 'sidecar']); "
                   "time.sleep(30); print('parent survived')")
    sidecar = subprocess.run([sys.executable, "-c", parent_code, KILL_CHILD], capture_output=True, text=True,
                             timeout=60)
    assert sidecar.returncode == -9
    assert "survived" not in sidecar.stdout


# -- registry ----------------------------------------------------------------

def test_registry_builtins_and_unknown():
    assert {"echo", "scripted", "openai"} <= set(backend_names())
    assert isinstance(load_backend("echo", {}), EchoModel)
    assert isinstance(load_backend("scripted", {"steps": []}), ScriptedModel)
    assert isinstance(load_backend("openai", {"model": "m"}), OpenAIModel)
    with pytest.raises(ValueError, match="unknown model backend 'nope'"):
        load_backend("nope", {})


def test_models_package_imports_no_grpc_or_httpx():
    code = ("import sys, agent_sidecar.models.registry as r; r.load_backend('echo', {}); "
            "r.load_backend('scripted', {'steps': []}); r.load_backend('openai', {'model': 'm'}); "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('grpc', 'google', 'httpx')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# -- openai ------------------------------------------------------------------

FAST = {"backoff_initial_s": 0.001, "backoff_max_s": 0.01}
TOOLS = [{"name": "test.add", "description": "add two numbers",
          "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}]


def openai_events(fake, request=None, **options):
    model = OpenAIModel({"base_url": fake.url, "model": "fake-model", **FAST, **options})
    return collect(model, request or ModelRequest(messages=user("hello"), tools=TOOLS))


def test_openai_streams_text_and_usage():
    with FakeOpenAI([{"text": "hello there world",
                      "usage": {"prompt_tokens": 12, "completion_tokens": 3,
                                "prompt_tokens_details": {"cached_tokens": 8}}}]) as fake:
        events = openai_events(fake, temperature=0.2)
    assert [e.text for e in of_type(events, TextDelta)] == ["hello ", "there ", "world"]
    # prompt_tokens 12 includes the 8 cached ones: the counters are disjoint
    assert events[-1] == UsageReport(input_tokens=4, output_tokens=3, cache_read_tokens=8)
    (body,) = fake.requests
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["model"] == "fake-model" and body["temperature"] == 0.2
    assert body["messages"] == user("hello")
    assert body["tools"] == [{"type": "function", "function": {
        "name": "test__add", "description": "add two numbers", "parameters": TOOLS[0]["parameters"]}}]


def test_openai_streamed_tool_call_dotted_name_round_trip():
    history = user("add") + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c0", "type": "function", "function": {"name": "test.add", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c0", "name": "test.add", "content": "3"},
    ]
    script = [{"text": "adding", "tool_calls": [
        {"name": "test.add", "arguments": {"a": 1, "b": 2}, "id": "call_abc"},
        {"name": "test.add", "arguments": {"a": 10, "b": 20}, "id": "call_def"}]}]
    with FakeOpenAI(script) as fake:
        events = openai_events(fake, ModelRequest(messages=history, tools=TOOLS))
    assert text_of(events) == "adding"
    calls = of_type(events, ToolCallRequest)
    assert [(c.call_id, c.name, json.loads(c.arguments_json)) for c in calls] == [
        ("call_abc", "test.add", {"a": 1, "b": 2}), ("call_def", "test.add", {"a": 10, "b": 20})]
    sent = fake.requests[0]["messages"]
    assert sent[2]["tool_calls"][0]["function"]["name"] == "test__add"
    assert sent[3]["name"] == "test__add"
    assert history[2]["tool_calls"][0]["function"]["name"] == "test.add"  # input not mutated


def test_openai_retries_500_then_succeeds():
    with FakeOpenAI([{"status": 500}, {"status": 503}, {"text": "fine"}]) as fake:
        events = openai_events(fake)
    assert text_of(events) == "fine"
    assert len(fake.requests) == 3


def test_openai_honours_retry_after():
    with FakeOpenAI([{"status": 429, "headers": {"Retry-After": "0.3"}}, {"text": "ok"}]) as fake:
        events = openai_events(fake)
    assert text_of(events) == "ok"
    assert len(fake.requests) == 2
    # Protocol behaviour, not speed: the retry came no sooner than the server asked.
    assert fake.arrivals[1] - fake.arrivals[0] >= 0.3


def test_openai_permanent_failure_after_max_retries():
    with FakeOpenAI([{"status": 500, "body": "upstream exploded"}]) as fake:
        with pytest.raises(ModelError, match=r"HTTP 500.*upstream exploded"):
            openai_events(fake, max_retries=2)
    assert len(fake.requests) == 3


def test_openai_400_fails_without_retry():
    with FakeOpenAI([{"status": 400, "body": '{"error": {"message": "bad tool schema"}}'}]) as fake:
        with pytest.raises(ModelError, match=r"HTTP 400.*bad tool schema"):
            openai_events(fake)
    assert len(fake.requests) == 1


def test_openai_api_key_and_extra_headers(monkeypatch):
    monkeypatch.setenv("FAKE_OPENAI_KEY", "sk-test-123")
    with FakeOpenAI([{"text": "ok"}]) as fake:
        openai_events(fake, api_key_env="FAKE_OPENAI_KEY", extra_headers={"X-Title": "sidecar"})
    assert fake.headers[0]["authorization"] == "Bearer sk-test-123"
    assert fake.headers[0]["x-title"] == "sidecar"
    monkeypatch.delenv("FAKE_OPENAI_KEY")
    with pytest.raises(ValueError, match="FAKE_OPENAI_KEY"):
        OpenAIModel({"model": "m", "api_key_env": "FAKE_OPENAI_KEY"})
    with pytest.raises(ValueError, match="'model' is required"):
        OpenAIModel({})
    with pytest.raises(ValueError, match="max_retries must be a number"):
        OpenAIModel({"model": "m", "max_retries": "lots"})
    with pytest.raises(ValueError, match="temperature must be a number >= 0, got 'hot'"):
        OpenAIModel({"model": "m", "temperature": "hot"})
    with pytest.raises(ValueError, match="base_url must be an http:// or https:// URL, got 'api.openai.com/v1'"):
        OpenAIModel({"model": "m", "base_url": "api.openai.com/v1"})
    assert OpenAIModel({"model": "m", "temperature": 0}).temperature == 0.0


def test_openai_connect_error_retries_then_fails():
    with FakeOpenAI() as fake:
        url = fake.url
    model = OpenAIModel({"base_url": url, "model": "m", "max_retries": 1, **FAST})
    with pytest.raises(ModelError, match="giving up after 2 attempts"):
        collect(model, ModelRequest(messages=user("hi")))


def test_openai_truncated_stream_after_output_is_not_retried():
    with FakeOpenAI([{"text": "partial answer", "truncate": True}, {"text": "never"}]) as fake:
        with pytest.raises(ModelError, match="after output started"):
            openai_events(fake)
    assert len(fake.requests) == 1


def test_openai_non_streaming_reply_is_accepted():
    model = OpenAIModel({"model": "m"})
    body, names = model.build_body(ModelRequest(messages=user("x"), tools=TOOLS))
    assert names == {"test__add": "test.add"} and safe_tool_name("discord.send-it") == "discord__send-it"
    # one to one: names that could map alike carry a hash of themselves
    odd = ["a.b-c d", "a.b-c_d", "t.a.b", "t.a__b", "t.a:b"]
    safe = [safe_tool_name(n) for n in odd]
    assert len(set(safe)) == len(odd) and all(re.fullmatch(r"[A-Za-z0-9_-]+", x) for x in safe), safe
    assert safe_tool_name("t.a.b") == "t__a__b"
    reply = {"choices": [{"message": {"content": "hi", "tool_calls": [
        {"id": "c", "function": {"name": "test__add", "arguments": '{"a": 1}'}}]}}],
             "usage": {"prompt_tokens": 1, "completion_tokens": 2}}
    assert events_from_message(reply, "t0", names) == [
        TextDelta("hi"), ToolCallRequest("c", "test.add", '{"a": 1}'), UsageReport(1, 2)]


def test_stream_parser_fragments_without_index_and_error_chunks():
    parser = StreamParser(tag="t3", names={})
    lines = [
        ": keepalive comment", "",
        'data: {"choices": [{"delta": {"tool_calls": [{"id": "a", "function": '
        '{"name": "x__", "arguments": "{\\"k\\""}}]}}]}',
        'data: {"choices": [{"delta": {"tool_calls": [{"function": {"name": "y", "arguments": ": 1}"}}]}}]}',
        'data: {"choices": [{"delta": {"tool_calls": [{"function": {"name": "z"}}]}, "finish_reason": "tool_calls"}]}',
    ]
    for line in lines:
        assert parser.feed(line) == []
    assert parser.finish() == [ToolCallRequest("a", "x.yz", '{"k": 1}')]
    with pytest.raises(ModelError, match="rate limited"):
        StreamParser("t0", {}).feed('data: {"error": {"message": "rate limited"}}')


def test_fallback_call_ids_are_unique_across_turns():
    """A server that sends no call ids: the ids made up for it differ between
    turns (a transcript with two 'call_0_0' is refused by stricter backends)."""
    reply = {"choices": [{"message": {"content": "", "tool_calls": [
        {"function": {"name": "test__add", "arguments": "{}"}}]}}]}
    ids = {events_from_message(reply, call_tag(rid, 0), {})[0].call_id for rid in ("r-1", "r-2")}
    assert len(ids) == 2 and all(i.startswith("call_") for i in ids), ids

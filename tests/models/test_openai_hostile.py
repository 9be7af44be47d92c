"""The openai backend against a hostile endpoint (a buggy proxy, a misconfigured
gateway): whatever comes back, the call ends with a ModelError naming the cause
-- never reading an endless or inflated body to its end, never a TypeError.

Each answer here is served for real by FakeOpenAI over loopback. Memory is
checked by what the backend does with an oversized answer (it stops at a named
cap) rather than by measuring it.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from helpers.fake_openai import FakeOpenAI

from agent_sidecar.models import ModelError, ModelRequest, TextDelta, ToolCallRequest
from agent_sidecar.models.base import MAX_CALL_ID_CHARS, MAX_TOOL_NAME_CHARS
from agent_sidecar.models.openai import OpenAIModel
from agent_sidecar.models.openai_wire import ANSWER_CAP, IDLE_CAP, LINE_CAP, MAX_TOOL_CALLS

pytestmark = pytest.mark.store_free("the openai backend against a local HTTP server")

FAST = {"backoff_initial_s": 0.001, "backoff_max_s": 0.01}


def ask(script, **options):
    """One model call against a FakeOpenAI playing ``script``: its events, and the fake."""
    with FakeOpenAI(script) as fake:
        model = OpenAIModel({"base_url": fake.url, "model": "m", "max_retries": 0, **FAST, **options})

        async def run():
            try:
                return [e async for e in model.stream(ModelRequest(messages=[{"role": "user", "content": "hi"}]))]
            finally:
                await model.aclose()

        return asyncio.run(run()), fake


def fails(script, match, **options):
    with pytest.raises(ModelError, match=match) as info:
        ask(script, **options)
    return str(info.value)


def chunk(delta=None, **fields):
    body = {"choices": [{"index": 0, "delta": delta or {}, "finish_reason": None}], **fields}
    return "data: " + json.dumps(body) + "\n\n"


END = 'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'


@pytest.mark.parametrize("status", [400, 500])
def test_an_endless_error_body_gives_an_excerpt(status):
    """The error's body never ends: only its start is read, for the message."""
    message = fails([{"status": status, "content_type": "text/plain", "prefix": "upstream says no ",
                      "endless": "blah "}], rf"HTTP {status} from .*: upstream says no blah blah")
    assert len(message) < 1000


def test_a_gzip_bomb_error_body_gives_an_excerpt():
    fails([{"status": 400, "gzip_mb": 256, "prefix": "quota exceeded "}], r"HTTP 400 .*: quota exceeded aaaa")


@pytest.mark.parametrize("entry", [
    {"content_type": "application/json", "endless": " "},
    {"content_type": "application/json", "gzip_mb": 64},
], ids=["endless", "gzip-bomb"])
def test_an_oversized_whole_reply_stops_at_the_cap(entry):
    """A reply that is not an event stream is read whole -- up to the cap."""
    fails([entry], rf"HTTP 200 .*application/json.* is larger than {ANSWER_CAP} bytes")


@pytest.mark.parametrize("entry", [
    {"prefix": "data: ", "endless": "a"},
    {"prefix": 'data: {"choices": [], "pad": "', "gzip_mb": 64},
], ids=["endless", "gzip-bomb"])
def test_an_oversized_event_stream_line_stops_at_the_cap(entry):
    fails([entry], rf"an event-stream line is longer than {LINE_CAP} bytes")


def test_endless_tool_call_arguments_stop_at_the_cap():
    start = chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "t__x", "arguments": ""}}]})
    more = chunk({"tool_calls": [{"index": 0, "function": {"arguments": "a" * 4000}}]})
    fails([{"prefix": start, "endless": more}], rf"streamed answer is longer than {ANSWER_CAP} characters")


def test_an_endless_text_stream_stops_at_the_cap():
    fails([{"endless": chunk({"content": "blah " * 800})}], "streamed answer is longer than")


def test_too_many_tool_calls_in_one_answer():
    calls = "".join(chunk({"tool_calls": [{"index": n, "id": f"c{n}", "function": {"name": "t__x"}}]})
                    for n in range(MAX_TOOL_CALLS + 1))
    fails([{"raw": calls + END}], rf"more than {MAX_TOOL_CALLS} tool calls")
    reply = {"choices": [{"message": {"tool_calls": [{"id": f"c{n}", "function": {"name": "t__x"}}
                                                     for n in range(MAX_TOOL_CALLS + 1)]}}]}
    fails([{"body": json.dumps(reply)}], rf"more than {MAX_TOOL_CALLS} tool calls")


@pytest.mark.parametrize("line, match", [
    ("data: {not json", "invalid JSON from server: {not json"),
    ("data: [1, 2]", "server sent a JSON array, not an object"),
    ('data: {"choices": "abc"}', r'chunk.choices is a JSON string \("abc"\), expected array'),
    ('data: {"choices": [5]}', r"chunk.choices\[0\] is a JSON integer \(5\), expected object"),
    ('data: {"choices": [{"delta": "hello"}]}', r"chunk.choices\[0\].delta is a JSON string"),
    ('data: {"choices": [{"delta": {"content": 5}}]}', r"delta.content is a JSON integer \(5\), expected string"),
    ('data: {"choices": [{"delta": {"tool_calls": [{"index": [1]}]}}]}',
     r"tool_calls\[0\].index is a JSON array \(\[1\]\), expected integer"),
    ('data: {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": 7}]}}]}',
     r"tool_calls\[0\].id is a JSON integer \(7\), expected string"),
    ('data: {"choices": [{"delta": {"tool_calls": [{"function": {"arguments": {}}}]}}]}',
     r"function.arguments is a JSON object \({}\), expected string"),
    ('data: {"choices": [], "usage": {"prompt_tokens": "lots"}}',
     r'usage.prompt_tokens is a JSON string \("lots"\), expected number'),
    ('data: {"choices": [], "usage": {"completion_tokens": 100000000000000000000000}}',
     "usage.completion_tokens is 100000000000000000000000, expected a number from 0"),
    ('data: {"choices": [], "usage": {"cost": NaN}}', "usage.cost is nan, expected a number from 0"),
])
def test_a_malformed_chunk_names_what_is_wrong(line, match):
    fails([{"raw": line + "\n\n" + END}], match)


def test_a_malformed_whole_reply_names_what_is_wrong():
    fails([{"body": '{"choices": [{"message": "hi"}]}'}], r"reply.choices\[0\].message is a JSON string")
    fails([{"body": '{"choices": [{"message": {"content": 5}}]}'}],
          r"reply.choices\[0\].message.content is a JSON integer")


def test_tool_call_indexes_need_not_count_from_zero():
    """Negative or huge indexes only order the calls."""
    frags = [(10**30, "late", "{}"), (-5, "early", '{"a": 1}')]
    raw = "".join(chunk({"tool_calls": [{"index": i, "id": c, "function": {"name": "t__x", "arguments": a}}]})
                  for i, c, a in frags)
    events, _ = ask([{"raw": raw + END}])
    assert events == [ToolCallRequest("early", "t.x", '{"a": 1}'), ToolCallRequest("late", "t.x", "{}")]


def test_invalid_utf8_in_a_chunk_is_replaced():
    events, _ = ask([{"raw": 'data: {"choices": [{"delta": {"content": "bad \udcff bytes"}}]}\n\n' + END}])
    assert events[0] == TextDelta("bad \ufffd bytes")


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_is_not_followed_and_says_where(status):
    with FakeOpenAI([{"text": "stolen"}]) as elsewhere:
        message = fails([{"status": status, "body": "", "headers": {"Location": elsewhere.url}}],
                        rf"HTTP {status} from .*: a redirect to {elsewhere.url}, which is not followed")
        assert "base_url" in message
        assert elsewhere.requests == []  # the API key went nowhere else


def test_an_html_page_names_status_and_content_type():
    fails([{"body": "<html><h1>Welcome to nginx!</h1></html>", "content_type": "text/html"}],
          r"HTTP 200 .*Content-Type 'text/html', not an event stream.*Welcome to nginx")


def test_an_unknown_content_encoding_is_refused():
    fails([{"body": "x", "headers": {"Content-Encoding": "br"}}], "Content-Encoding 'br'")


# -- what a reviewer's hostile server found --------------------------------------------------------

def _call(index=None, call_id=None, name=None, args=None):
    frag = {k: v for k, v in (("index", index), ("id", call_id)) if v is not None}
    fn = {k: v for k, v in (("name", name), ("arguments", args)) if v is not None}
    return chunk({"tool_calls": [{**frag, "function": fn}]})


@pytest.mark.parametrize("what", ["id", "name"])
def test_a_runaway_call_id_or_name_stops_at_its_cap(what):
    """A 6 MiB id or name made frames no client could read, for good (replays
    and transcript pages too); a name streamed in endless fragments was joined
    quadratically, holding the worker's loop."""
    big = "x" * (MAX_CALL_ID_CHARS + 1)
    cap = MAX_CALL_ID_CHARS if what == "id" else MAX_TOOL_NAME_CHARS
    raw = _call(0, big, "t__x", "{}") if what == "id" else _call(0, "c", big, "{}")
    fails([{"raw": raw + END}], rf"tool call 0's {what} is longer than {cap} characters")
    if what == "name":
        fails([{"prefix": _call(0, "c", "t", ""), "endless": _call(name="y" * 200)}],
              rf"tool call 0's name is longer than {cap} characters")


def test_a_call_without_a_name_is_a_malformed_reply():
    """It was taken as a call of the tool '' and ended the turn TOOL_SCOPE_VIOLATION."""
    fails([{"raw": _call(0, "c", None, "{}") + END}], "tool call 0 has no name")


def test_a_server_that_repeats_the_call_id_on_every_fragment_without_index_makes_one_call():
    raw = _call(call_id="c1", name="t__add", args='{"a": 1,') + _call(call_id="c1", args=' "b": 2}')
    events, _ = ask([{"raw": raw + END}])
    assert events == [ToolCallRequest("c1", "t.add", '{"a": 1, "b": 2}')]


@pytest.mark.parametrize("nothing", [": keepalive\n", 'data: {"choices": []}\n\n'], ids=["comments", "empty"])
def test_a_stream_of_nothing_stops_at_its_cap(nothing):
    """Keepalives or empty chunks forever: they spent the worker's CPU until the
    turn's timeout, every other session on the worker with it."""
    fails([{"prefix": chunk({"content": "hi "}), "endless": nothing}],
          rf"more than {IDLE_CAP} bytes in a row with nothing of the answer")


def test_a_lone_surrogate_is_a_malformed_reply():
    """JSON's \\ud800 escape is no Unicode: the worker could not send the text on."""
    fails([{"raw": 'data: {"choices": [{"delta": {"content": "hi \\ud800"}}]}\n\n' + END}],
          r"delta.content holds a lone UTF-16 surrogate")


def test_a_connection_closed_in_the_middle_of_a_line_is_a_stream_cut_short():
    """The cut line was parsed as JSON ("invalid JSON from server"); it is
    dropped, as the SSE format says, and the stream ended early."""
    cut = 'data: {"choices": [{"delta": {"cont'
    fails([{"raw": cut}], r"giving up after 1 attempts: stream ended before \[DONE\]")
    fails([{"raw": chunk({"content": "hi "}) + cut}], "stream broke after output started")
    events, _ = ask([{"raw": chunk({"content": "hi"}) + "data: [DONE]"}])  # a whole [DONE] counts
    assert events == [TextDelta("hi")]


def test_a_retry_after_past_the_cap_fails_at_once_saying_so():
    """Waiting the cap and asking again would be refused again: the turn ended
    AGENT_TIMEOUT with no word of the 429."""
    message = fails([{"status": 429, "headers": {"Retry-After": "999999"}}, {"text": "never"}],
                    r"HTTP 429 .*asks to retry after 999999 s, more than retry_after_max_s \(60\)", max_retries=3)
    assert "HTTP 429" in message


def test_nesting_too_deep_is_invalid_json_not_a_recursion_error():
    fails([{"raw": "data: " + "[" * 100_000 + "\n\n" + END}], "invalid JSON from server")


def test_a_zero_timeout_is_refused_where_it_is_given():
    with pytest.raises(ValueError, match="timeout_s must be a number > 0"):
        OpenAIModel({"model": "m", "timeout_s": 0})


def test_an_id_repeated_in_one_answer_is_made_unique():
    """Two calls of one answer with one id collapsed into one open call: after
    a worker crash only one got its synthetic result."""
    raw = _call(0, "dup", "t__x", "{}") + _call(1, "dup", "t__x", '{"a": 1}')
    events, _ = ask([{"raw": raw + END}])
    assert [e.call_id for e in events] == ["dup", "dup_2"]
    same = {"id": "d", "function": {"name": "t__x", "arguments": "{}"}}
    reply = {"choices": [{"message": {"tool_calls": [same] * 3}}]}
    events, _ = ask([{"body": json.dumps(reply)}])
    assert [e.call_id for e in events] == ["d", "d_2", "d_3"]


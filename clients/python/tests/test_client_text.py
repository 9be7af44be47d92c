"""A string protobuf cannot encode (a lone surrogate such as "\\ud800", which
UTF-8 cannot carry) is refused up front as InvalidArgument naming its field,
for every string a public call sends; before, protobuf raised
UnicodeEncodeError ("'utf-8' codec can't encode character '\\ud800' in
position 1: surrogates not allowed") naming no field. No sidecar is needed:
nothing is sent, so the dead socket is never dialled."""

import asyncio

import pytest
from _refusal import client, refusal

import agent_sidecar_client as asc
from agent_sidecar_client._proto import tool_service_pb2 as tool_pb

BAD = "a\ud800b"
OK = {"role": "user", "content": "fine"}

# (call, field it must name); each call gets a client to a socket nobody listens on.
SYNC_CASES = [
    (lambda c: c.prompt(BAD, session_key="k"), "text"),
    (lambda c: c.prompt("hi", session_key=BAD), "session_key"),
    (lambda c: c.prompt("hi", source={"platform": "x", "chat_id": BAD}), "source.chat_id"),
    (lambda c: c.prompt("hi", session_key="k", request_id=BAD), "request_id"),
    (lambda c: c.prompt("hi", session_key="k", profile=BAD), "profile"),
    (lambda c: c.prompt("hi", session_key="k", attachments=[{"name": "n", "mime_type": BAD}]),
     "attachments[0].mime_type"),
    (lambda c: c.watch(request_id=BAD), "request_id"),
    (lambda c: c.watch(session_key=BAD), "session_key"),
    (lambda c: c.watch(platform=BAD), "platform"),
]

ASYNC_CASES = [
    (lambda c: c.get_or_create_session({"platform": BAD}), "source.platform"),
    (lambda c: c.get_or_create_session({"platform": "x"}, profile=BAD), "profile"),
    (lambda c: c.get_session(session_key=BAD), "session_key"),
    (lambda c: c.get_session(session_id=BAD), "session_id"),
    (lambda c: c.list_sessions(platform=BAD), "platform"),
    (lambda c: c.list_sessions(page_token=BAD), "page_token"),
    (lambda c: c.reset_session(BAD), "session_key"),
    (lambda c: c.reset_session("k", display_name=BAD), "display_name"),
    (lambda c: c.switch_session("k", BAD), "target_session_id"),
    (lambda c: c.suspend_session(BAD), "session_key"),
    (lambda c: c.mark_resume_pending("k", BAD), "reason"),
    (lambda c: c.delete_session(BAD), "session_key"),
    (lambda c: c.clear_all_sessions(BAD), "confirm"),
    (lambda c: c.seed_session([OK, {"role": "user", "content": BAD}], session_key="k"), "messages[1].content"),
    (lambda c: c.seed_session(iter([OK, {"role": BAD}]), session_key="k"), "messages[1].role"),
    (lambda c: c.seed_session([OK], source={"user_name": BAD}), "source.user_name"),
    (lambda c: c.seed_session([OK], session_key="k", profile=BAD), "profile"),
    (lambda c: c.get_transcript(BAD), "session_id"),
    (lambda c: c.get_transcript("s", page_token=BAD), "page_token"),
    (lambda c: c.append_messages("s", [{"role": "tool", "tool_name": BAD}]), "messages[0].tool_name"),
    (lambda c: c.append_messages(BAD, [OK]), "session_id"),
    (lambda c: c.rewrite_transcript("s", (OK, {"role": "tool", "tool_call_id": BAD})), "messages[1].tool_call_id"),
    (lambda c: c.rewind_session(BAD), "session_id"),
    (lambda c: c.search_messages(BAD), "query"),
    (lambda c: c.search_messages("q", session_key=BAD), "session_key"),
    (lambda c: c.update_usage(BAD, {}), "session_key"),
    (lambda c: c.update_usage("k", {}, cost_status=BAD), "cost_status"),
    (lambda c: c.get_session_context({"chat_id": BAD}), "source.chat_id"),
    (lambda c: c.get_session_context({"chat_id": "c"}, profile=BAD), "profile"),
    (lambda c: c.cancel(session_key=BAD), "session_key"),
    (lambda c: c.cancel(request_id=BAD), "request_id"),
    (lambda c: c.get_queue(BAD), "session_key"),
    (lambda c: anext(c.iter_sessions(platform=BAD)), "platform"),
]


def assert_names(err: asc.InvalidArgument, field: str) -> None:
    assert err.field_violations == [(field, "has a lone surrogate at index 1 (UTF-8 cannot carry it)")]
    assert err.message == f"{field}: has a lone surrogate at index 1 (UTF-8 cannot carry it)"
    assert err.reason == "INVALID_ARGUMENT"


@pytest.mark.parametrize(("call", "field"), SYNC_CASES, ids=[f for _, f in SYNC_CASES])
def test_prompt_and_watch_refuse_a_lone_surrogate_naming_the_field(call, field):
    assert_names(refusal(call), field)


@pytest.mark.parametrize(("call", "field"), ASYNC_CASES, ids=[f"{i}-{f}" for i, (_, f) in enumerate(ASYNC_CASES)])
def test_unary_calls_refuse_a_lone_surrogate_naming_the_field(call, field):
    assert_names(refusal(call), field)


def test_tool_host_refuses_a_lone_surrogate_in_a_tool_name_or_description():
    host = asc.ToolHost("ns")
    with pytest.raises(asc.InvalidArgument) as info:
        host.tool(lambda: 1, name="ns.x" + BAD)
    assert info.value.field_violations[0][0] == "name"
    with pytest.raises(asc.InvalidArgument) as info:
        host.tool(lambda: 1, name="ns.y", description=BAD)
    assert info.value.field_violations[0][0] == "description"
    assert host.tools == {}


def test_tool_host_answers_when_the_tool_error_holds_a_lone_surrogate_or_the_result_is_no_json():
    """The error text and the result must reach the sidecar: an exception's
    message with a lone surrogate made invoke() raise (the answer task died,
    the sidecar waited out its timeout), and NaN went out as ``NaN``, no JSON."""
    host = asc.ToolHost("ns")

    @host.tool
    def fails() -> None:
        raise OSError("cannot open " + BAD)

    @host.tool
    def nan() -> float:
        return float("nan")

    def invoke(name: str):
        inv = tool_pb.ToolInvocation(invocation_id="i", tool_name=name, arguments_json="{}")
        result = asyncio.run(host.invoke(inv))
        result.SerializeToString()  # what sending it does: raised on the old code's result
        return result

    failed = invoke("ns.fails")
    assert not failed.ok and failed.error == "OSError: cannot open a\\ud800b"
    not_json = invoke("ns.nan")
    assert not not_json.ok and "ValueError" in not_json.error


def test_text_that_is_unicode_passes():
    async def body():
        async with client() as c:
            stream = c.prompt("é 😀 \U0010ffff", source={"platform": "x", "chat_id": "ü"}, request_id="r")
            assert stream.request_id == "r"
            with pytest.raises(asc.SidecarError) as info:  # sent: the dead socket answers UNAVAILABLE
                await c.append_messages("s", [{"role": "user", "content": "日本語 😀"}])
            assert not isinstance(info.value, asc.InvalidArgument)

    asyncio.run(body())

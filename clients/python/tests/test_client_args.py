"""A value of the wrong kind is refused up front as InvalidArgument naming
its field: a dict key the message lacks, a value its field cannot take
(``{"content": 5}``), an argument that should be a string and is not
(``session_key=5``). Before, protobuf raised TypeError "bad argument type for
built-in operation" or ValueError 'Protocol message Message has no "bogus"
field.', naming none. No sidecar is needed: nothing is sent."""

import asyncio

import pytest
from _refusal import client, refusal

import agent_sidecar_client as asc

OK = {"role": "user", "content": "fine"}

SYNC_CASES = [
    (lambda c: c.prompt("hi", source={"platform": "x", "chat_id": 42}), "source.chat_id", "int does not fit"),
    (lambda c: c.prompt("hi", source={"platform": "x", "chat": "c"}), "source.chat", "no such field"),
    (lambda c: c.prompt("hi", source=["x"]), "source", "expected a dict or SessionSource, got list"),
    (lambda c: c.prompt(5, session_key="k"), "text", "expected a string, got int"),
    (lambda c: c.prompt("hi", session_key=7), "session_key", "expected a string, got int"),
    (lambda c: c.prompt("hi", session_key="k", attachments=[{"name": "n", "data": "not bytes"}]),
     "attachments[0].data", "str does not fit"),
    (lambda c: c.prompt("hi", session_key="k", attachments=["a.png"]),
     "attachments[0]", "expected a dict or Attachment, got str"),
    (lambda c: c.watch(platform="p", after_cursor=1 << 64), "after_cursor", "out of the int64 range"),
    # The resume point the watch does not use: the sidecar refuses it too, never ignores it.
    (lambda c: c.watch(session_key="k", after_seq=5), "after_seq", "applies only with request_id"),
    (lambda c: c.watch(request_id="r", after_cursor=5), "after_cursor", "applies only with session_key"),
]

ASYNC_CASES = [
    (lambda c: c.append_messages("s", [OK, {"role": "user", "content": 5}]), "messages[1].content",
     "int does not fit"),
    (lambda c: c.append_messages("s", [{"role": "user", "text": "hi"}]), "messages[0].text", "no such field"),
    (lambda c: c.seed_session([{"role": "user", "seq": "1"}], session_key="k"), "messages[0].seq",
     "str does not fit"),
    (lambda c: c.rewrite_transcript("s", [OK, "hello"]), "messages[1]", "expected a dict or Message, got str"),
    (lambda c: c.update_usage("k", {"input_tokens": "3"}), "delta.input_tokens", "str does not fit"),
    (lambda c: c.get_session(session_key=1), "session_key", "expected a string, got int"),
    (lambda c: c.search_messages(b"q"), "query", "expected a string, got bytes"),
    # Numbers: protobuf's ValueError "Value out of range" / TypeError named no field.
    (lambda c: c.rewind_session("s", n=1 << 32), "n", "out of the int32 range"),
    (lambda c: c.rewind_session("s", n="2"), "n", "expected an integer, got str"),
    (lambda c: c.search_messages("q", limit=1 << 40), "limit", "out of the int32 range"),
    (lambda c: c.get_transcript("s", page_size=2.5), "page_size", "expected an integer, got float"),
    (lambda c: c.list_sessions(active_within_seconds=1 << 63), "active_within_seconds", "out of the int64 range"),
    (lambda c: c.prune_sessions(True), "max_age_days", "expected an integer, got bool"),
    (lambda c: c.update_usage("k", {}, last_prompt_tokens=-(1 << 64)), "last_prompt_tokens", "int64"),
]


def assert_names(err: asc.InvalidArgument, field: str, why: str) -> None:
    assert err.reason == "INVALID_ARGUMENT"
    assert [f for f, _ in err.field_violations] == [field], err.field_violations
    assert why in err.field_violations[0][1] and err.message.startswith(f"{field}: "), err.message


@pytest.mark.parametrize(("call", "field", "why"), SYNC_CASES + ASYNC_CASES,
                         ids=[f for _, f, _ in SYNC_CASES + ASYNC_CASES])
def test_a_value_of_the_wrong_kind_is_refused_naming_the_field(call, field, why):
    assert_names(refusal(call), field, why)


def test_messages_of_every_kind_still_build():
    async def body():
        async with client() as c:
            with pytest.raises(asc.SidecarError) as info:  # sent: the dead socket answers UNAVAILABLE
                await c.append_messages("s", [OK, asc.Message(role="assistant", content="a"),
                                              {"role": "tool", "content": "{}", "tool_call_id": "1", "seq": 3}])
            assert not isinstance(info.value, asc.InvalidArgument)

    asyncio.run(body())


class _Count:
    """An integer of a type of its own (as numpy's int64 is): protobuf takes it."""

    def __index__(self) -> int:
        return 5


def test_an_integer_of_another_type_is_sent():
    """An integer that is no ``int`` (numpy's int64, from a DataFrame, say) was
    taken by protobuf before the range checks, which then refused it."""
    async def body():
        async with client() as c:
            for call in (lambda: c.search_messages("q", limit=_Count()), lambda: c.rewind_session("s", n=_Count()),
                         lambda: c.list_sessions(page_size=_Count())):
                with pytest.raises(asc.SidecarError) as info:  # sent: the dead socket answers UNAVAILABLE
                    await call()
                assert not isinstance(info.value, asc.InvalidArgument), info.value

    asyncio.run(body())

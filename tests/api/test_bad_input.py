"""Bad input over gRPC: every malformed, oversized or unknown request gets the
documented status (docs/semantics.md "Errors": INVALID_ARGUMENT with a field violation
naming the field, NOT_FOUND/SESSION_NOT_FOUND, …) and the sidecar keeps serving."""

from __future__ import annotations

import base64

import grpc
import orjson
import pytest
from helpers.ids import source as src
from helpers.sessions import assert_serving, create, msg, rpc_error, seed, turns
from sidecar_proc import error_info

from agent_sidecar.v1 import common_pb2 as c
from agent_sidecar.v1 import session_service_pb2 as pb

INVALID = (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")
NOT_FOUND = (grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND")
KIB256 = 256 * 1024
UNKNOWN_KEY = "agent:main:telegram:dm:nobody-here"
UNKNOWN_ID = "20200101_000000_deadbeef"


@pytest.fixture(scope="module")
def known(shared_sidecar):
    """(stub, session) with a short transcript, for requests that need a real target."""
    stub = shared_sidecar.sessions()
    return stub, seed(stub, src(), turns("hello", "hi"))


def _token(d: dict) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(d)).decode().rstrip("=")


S = pb  # short alias for the table below

# Tool calls every later turn would fail on (each a JSON array): an item
# that is not {"id", "type": "function", "function": {"name", "arguments"}}.
BAD_TOOL_CALLS = {
    "number-item": "[1]",
    "function-text": '[{"id": "c", "function": "f"}]',
    "no-id": '[{"function": {"name": "f", "arguments": "{}"}}]',
    "arguments-object": '[{"id": "c", "function": {"name": "f", "arguments": {}}}]',
    "other-type": '[{"id": "c", "type": "x", "function": {"name": "f", "arguments": ""}}]',
    # 65 levels (the array, its item, 63 arrays): before, up to 1023 were taken, and past
    # about 990 every later turn of an OpenAI profile failed writing its request
    "nested-too-deep": '[{"id": "c", "function": {"name": "f", "arguments": "{}"}, "x": '
                       + "[" * 63 + "]" * 63 + "}]",
}


def _cases():
    big = "x" * (KIB256 + 1)
    return [
        # -- sources -----------------------------------------------------------------------
        ("empty-platform", lambda st, k: st.GetOrCreateSession(S.GetOrCreateSessionRequest(
            source=c.SessionSource(chat_id="1"))), INVALID, "source.platform"),
        ("no-source", lambda st, k: st.GetOrCreateSession(S.GetOrCreateSessionRequest()),
         INVALID, "source.platform"),
        ("platform-with-colon", lambda st, k: st.GetOrCreateSession(S.GetOrCreateSessionRequest(
            source=c.SessionSource(platform="tele:gram", chat_id="1"))), INVALID, "source.platform"),
        ("bad-chat-type", lambda st, k: st.GetOrCreateSession(S.GetOrCreateSessionRequest(
            source=src(chat_type="room"))), INVALID, "source.chat_type"),
        ("chat-id-too-long", lambda st, k: st.GetOrCreateSession(S.GetOrCreateSessionRequest(
            source=src(chat_id="9" * 257))), INVALID, "source.chat_id"),
        ("chat-name-too-long", lambda st, k: st.GetOrCreateSession(S.GetOrCreateSessionRequest(
            source=src(chat_name="n" * 5000))), INVALID, "source.chat_name"),
        ("context-empty-platform", lambda st, k: st.GetSessionContext(S.GetSessionContextRequest(
            source=c.SessionSource(chat_id="1"))), INVALID, "source.platform"),
        ("seed-empty-platform", lambda st, k: st.SeedSession(S.SeedSessionRequest(
            source=c.SessionSource(chat_id="1"))), INVALID, "source.platform"),
        ("seed-source-and-key", lambda st, k: st.SeedSession(S.SeedSessionRequest(
            source=src(), session_key=k.session_key)), INVALID, "source"),
        ("seed-neither", lambda st, k: st.SeedSession(S.SeedSessionRequest()), INVALID, "source"),
        ("seed-key-unknown-profile", lambda st, k: st.SeedSession(S.SeedSessionRequest(
            session_key=k.session_key, profile="nope", messages=[msg("user", "x")])), INVALID, "profile"),
        # -- messages ------------------------------------------------------------------------
        ("oversized-append", lambda st, k: st.AppendMessages(S.AppendMessagesRequest(
            session_id=k.session_id, messages=[msg("user", big)])), INVALID, "messages[0].content"),
        ("oversized-second", lambda st, k: st.AppendMessages(S.AppendMessagesRequest(
            session_id=k.session_id, messages=[msg("user", "ok"), msg("assistant", big)])),
         INVALID, "messages[1].content"),
        ("oversized-seed", lambda st, k: st.SeedSession(S.SeedSessionRequest(
            source=src(), messages=[msg("user", big)])), INVALID, "messages[0].content"),
        ("oversized-rewrite", lambda st, k: st.RewriteTranscript(S.RewriteTranscriptRequest(
            session_id=k.session_id, messages=[msg("user", big)])), INVALID, "messages[0].content"),
        ("bad-role", lambda st, k: st.AppendMessages(S.AppendMessagesRequest(
            session_id=k.session_id, messages=[msg("robot", "beep")])), INVALID, "messages[0].role"),
        ("empty-role", lambda st, k: st.AppendMessages(S.AppendMessagesRequest(
            session_id=k.session_id, messages=[msg("user", "a"), msg("", "b")])),
         INVALID, "messages[1].role"),
        ("bad-tool-calls-json", lambda st, k: st.AppendMessages(S.AppendMessagesRequest(
            session_id=k.session_id, messages=[msg("assistant", "", tool_calls_json="{nope")])),
         INVALID, "messages[0].tool_calls_json"),
        ("tool-calls-not-array", lambda st, k: st.AppendMessages(S.AppendMessagesRequest(
            session_id=k.session_id, messages=[msg("assistant", "", tool_calls_json='{"a":1}')])),
         INVALID, "messages[0].tool_calls_json"),
        *[(f"tool-calls-{name}", lambda st, k, calls=calls: st.AppendMessages(S.AppendMessagesRequest(
            session_id=k.session_id, messages=[msg("assistant", "", tool_calls_json=calls)])),
           INVALID, "messages[0].tool_calls_json")
          for name, calls in BAD_TOOL_CALLS.items()],
        ("tool-calls-on-user", lambda st, k: st.AppendMessages(S.AppendMessagesRequest(
            session_id=k.session_id, messages=[msg("user", "hi", tool_calls_json="[]")])),
         INVALID, "messages[0].tool_calls_json"),
        ("no-messages", lambda st, k: st.AppendMessages(S.AppendMessagesRequest(
            session_id=k.session_id)), INVALID, "messages"),
        ("too-many-messages", lambda st, k: st.AppendMessages(S.AppendMessagesRequest(
            session_id=k.session_id, messages=[msg("user", "m")] * 1001)), INVALID, "messages"),
        # -- unknown sessions -------------------------------------------------------------------
        ("get-unknown-key", lambda st, k: st.GetSession(S.GetSessionRequest(
            session_key=UNKNOWN_KEY)), NOT_FOUND, None),
        ("get-unknown-id", lambda st, k: st.GetSession(S.GetSessionRequest(
            session_id=UNKNOWN_ID)), NOT_FOUND, None),
        ("transcript-unknown-id", lambda st, k: st.GetTranscript(S.GetTranscriptRequest(
            session_id=UNKNOWN_ID)), NOT_FOUND, None),
        ("append-unknown-id", lambda st, k: st.AppendMessages(S.AppendMessagesRequest(
            session_id=UNKNOWN_ID, messages=[msg("user", "x")])), NOT_FOUND, None),
        ("rewrite-unknown-id", lambda st, k: st.RewriteTranscript(S.RewriteTranscriptRequest(
            session_id=UNKNOWN_ID, messages=[msg("user", "x")])), NOT_FOUND, None),
        ("rewind-unknown-id", lambda st, k: st.RewindSession(S.RewindSessionRequest(
            session_id=UNKNOWN_ID)), NOT_FOUND, None),
        ("reset-unknown", lambda st, k: st.ResetSession(S.ResetSessionRequest(
            session_key=UNKNOWN_KEY)), NOT_FOUND, None),
        ("suspend-unknown", lambda st, k: st.SuspendSession(S.SuspendSessionRequest(
            session_key=UNKNOWN_KEY)), NOT_FOUND, None),
        ("mark-unknown", lambda st, k: st.MarkResumePending(S.MarkResumePendingRequest(
            session_key=UNKNOWN_KEY, reason="restart_timeout")), NOT_FOUND, None),
        ("usage-unknown", lambda st, k: st.UpdateUsage(S.UpdateUsageRequest(
            session_key=UNKNOWN_KEY, delta=c.Usage(input_tokens=1))), NOT_FOUND, None),
        ("switch-unknown-key", lambda st, k: st.SwitchSession(S.SwitchSessionRequest(
            session_key=UNKNOWN_KEY, target_session_id=k.session_id)), NOT_FOUND, None),
        ("seed-unknown-key", lambda st, k: st.SeedSession(S.SeedSessionRequest(
            session_key=UNKNOWN_KEY, messages=[msg("user", "x")])), NOT_FOUND, None),
        # -- malformed keys, ids and missing fields ------------------------------------------
        ("get-malformed-key", lambda st, k: st.GetSession(S.GetSessionRequest(
            session_key="not-a-key")), INVALID, "session_key"),
        ("get-short-key", lambda st, k: st.GetSession(S.GetSessionRequest(
            session_key="agent:main:telegram")), INVALID, "session_key"),
        ("reset-empty-part-key", lambda st, k: st.ResetSession(S.ResetSessionRequest(
            session_key="agent::telegram:dm")), INVALID, "session_key"),
        ("delete-malformed-key", lambda st, k: st.DeleteSession(S.DeleteSessionRequest(
            session_key="agent:main:telegram:dm:")), INVALID, "session_key"),
        ("delete-empty-key", lambda st, k: st.DeleteSession(S.DeleteSessionRequest()),
         INVALID, "session_key"),
        ("suspend-malformed-key", lambda st, k: st.SuspendSession(S.SuspendSessionRequest(
            session_key="sessions/1")), INVALID, "session_key"),
        ("usage-malformed-key", lambda st, k: st.UpdateUsage(S.UpdateUsageRequest(
            session_key="x:y:z:w")), INVALID, "session_key"),
        ("search-malformed-key", lambda st, k: st.SearchMessages(S.SearchMessagesRequest(
            query="hello", session_key="nope")), INVALID, "session_key"),
        ("key-too-long", lambda st, k: st.GetSession(S.GetSessionRequest(
            session_key="agent:main:telegram:dm:" + "1" * 2000)), INVALID, "session_key"),
        ("get-key-and-id", lambda st, k: st.GetSession(S.GetSessionRequest(
            session_key=k.session_key, session_id=k.session_id)), INVALID, "session_key"),
        ("get-neither", lambda st, k: st.GetSession(S.GetSessionRequest()), INVALID, "session_key"),
        ("transcript-no-id", lambda st, k: st.GetTranscript(S.GetTranscriptRequest()),
         INVALID, "session_id"),
        ("switch-no-target", lambda st, k: st.SwitchSession(S.SwitchSessionRequest(
            session_key=k.session_key)), INVALID, "target_session_id"),
        ("mark-no-reason", lambda st, k: st.MarkResumePending(S.MarkResumePendingRequest(
            session_key=k.session_key)), INVALID, "reason"),
        ("rewind-negative", lambda st, k: st.RewindSession(S.RewindSessionRequest(
            session_id=k.session_id, n=-1)), INVALID, "n"),
        # -- paging and search --------------------------------------------------------------------
        ("list-bad-token", lambda st, k: st.ListSessions(S.ListSessionsRequest(
            page_token="not a token")), INVALID, "page_token"),
        ("transcript-bad-token", lambda st, k: st.GetTranscript(S.GetTranscriptRequest(
            session_id=k.session_id, page_token="%%%")), INVALID, "page_token"),
        ("transcript-token-of-list", lambda st, k: st.GetTranscript(S.GetTranscriptRequest(
            session_id=k.session_id, page_token=_token({"k": "sessions", "u": 1.0, "s": "a"}))),
         INVALID, "page_token"),
        ("list-token-of-transcript", lambda st, k: st.ListSessions(S.ListSessionsRequest(
            page_token=_token({"k": "transcript", "after": 1}))), INVALID, "page_token"),
        ("list-negative-page-size", lambda st, k: st.ListSessions(S.ListSessionsRequest(
            page_size=-1)), INVALID, "page_size"),
        ("transcript-negative-page-size", lambda st, k: st.GetTranscript(S.GetTranscriptRequest(
            session_id=k.session_id, page_size=-5)), INVALID, "page_size"),
        ("list-platform-colon", lambda st, k: st.ListSessions(S.ListSessionsRequest(
            platform="tele:gram")), INVALID, "platform"),
        ("list-negative-active", lambda st, k: st.ListSessions(S.ListSessionsRequest(
            active_within_seconds=-1)), INVALID, "active_within_seconds"),
        ("search-empty", lambda st, k: st.SearchMessages(S.SearchMessagesRequest()),
         INVALID, "query"),
        ("search-blank", lambda st, k: st.SearchMessages(S.SearchMessagesRequest(query="  \t")),
         INVALID, "query"),
        ("search-too-long", lambda st, k: st.SearchMessages(S.SearchMessagesRequest(
            query="a" * 1025)), INVALID, "query"),
        ("search-negative-limit", lambda st, k: st.SearchMessages(S.SearchMessagesRequest(
            query="a", limit=-1)), INVALID, "limit"),
        ("prune-zero", lambda st, k: st.PruneSessions(S.PruneSessionsRequest()),
         INVALID, "max_age_days"),
        ("usage-negative", lambda st, k: st.UpdateUsage(S.UpdateUsageRequest(
            session_key=k.session_key, delta=c.Usage(output_tokens=-3))),
         INVALID, "delta.output_tokens"),
        ("clear-all-no-confirm", lambda st, k: st.ClearAllSessions(S.ClearAllSessionsRequest()),
         (grpc.StatusCode.FAILED_PRECONDITION, "FAILED_PRECONDITION"), None),
    ]


CASES = _cases()


@pytest.mark.parametrize("name,call,expect,field", CASES, ids=[x[0] for x in CASES])
def test_bad_request(shared_sidecar, known, name, call, expect, field):
    stub, session = known
    code, reason = expect
    with rpc_error(code, reason, field):
        call(stub, session)
    assert_serving(shared_sidecar)


def test_bad_requests_change_nothing(shared_sidecar, known):
    stub, session = known
    got = stub.GetTranscript(pb.GetTranscriptRequest(session_id=session.session_id), timeout=10)
    assert [m.content for m in got.messages] == ["hello", "hi"]
    s = stub.GetSession(pb.GetSessionRequest(session_key=session.session_key), timeout=10).session
    assert s.session_id == session.session_id and s.total_tokens == 0 and not s.resume_pending


def test_text_size_boundary(shared_sidecar):
    stub = shared_sidecar.sessions()
    s, _ = create(stub)
    exact = "é" * (KIB256 // 2)  # 256 KiB of UTF-8, two bytes a character
    r = stub.AppendMessages(pb.AppendMessagesRequest(
        session_id=s.session_id, messages=[msg("user", exact)]), timeout=10)
    assert r.first_seq == r.last_seq == 1
    with rpc_error(*INVALID, "messages[0].content"):
        stub.AppendMessages(pb.AppendMessagesRequest(
            session_id=s.session_id, messages=[msg("user", exact + "a")]), timeout=10)
    got = stub.GetTranscript(pb.GetTranscriptRequest(session_id=s.session_id), timeout=10)
    assert [len(m.content) for m in got.messages] == [KIB256 // 2]


# A token of the right kind with missing or mistyped fields is still "not a token
# this call returned": it must be INVALID_ARGUMENT, not an internal error.
FORGED = [
    ("list-missing-fields", lambda st, k: st.ListSessions(S.ListSessionsRequest(
        page_token=_token({"k": "sessions"})))),
    ("list-list-field", lambda st, k: st.ListSessions(S.ListSessionsRequest(
        page_token=_token({"k": "sessions", "u": [1], "s": "x"})))),
    ("transcript-missing-after", lambda st, k: st.GetTranscript(S.GetTranscriptRequest(
        session_id=k.session_id, page_token=_token({"k": "transcript"})))),
    ("transcript-list-after", lambda st, k: st.GetTranscript(S.GetTranscriptRequest(
        session_id=k.session_id, page_token=_token({"k": "transcript", "after": [1]})))),
]


@pytest.mark.parametrize("name,call", FORGED, ids=[x[0] for x in FORGED])
def test_forged_page_token(shared_sidecar, known, name, call):
    stub, session = known
    with rpc_error(*INVALID, "page_token"):
        call(stub, session)
    assert_serving(shared_sidecar)


# -- values that slip past validation ------------------------------------------------------------

@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_usage_non_finite_cost_invalid(sidecar, value):
    stub = sidecar.sessions()
    s, _ = create(stub)
    with rpc_error(*INVALID, "delta.cost_usd"):
        stub.UpdateUsage(pb.UpdateUsageRequest(session_key=s.session_key,
                                               delta=c.Usage(cost_usd=value)), timeout=10)
    got = stub.GetSession(pb.GetSessionRequest(session_key=s.session_key), timeout=10).session
    assert got.estimated_cost_usd == 0


def test_usage_overflow_does_not_poison_the_store(sidecar):
    stub = sidecar.sessions()
    s, _ = create(stub)
    for _ in range(2):
        try:
            stub.UpdateUsage(pb.UpdateUsageRequest(session_key=s.session_key,
                                                   delta=c.Usage(input_tokens=2 ** 62)), timeout=10)
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e.details()
    got = stub.GetSession(pb.GetSessionRequest(session_key=s.session_key), timeout=10).session
    assert 0 <= got.total_tokens < 2 ** 63
    assert len(stub.ListSessions(pb.ListSessionsRequest(), timeout=10).sessions) == 1


def test_created_at_out_of_range_invalid(shared_sidecar, known):
    stub, session = known
    from google.protobuf.timestamp_pb2 import Timestamp
    bad = msg("user", "x", created_at=Timestamp(seconds=-99_999_999_999))
    with rpc_error(*INVALID, "messages[0].created_at"):
        stub.AppendMessages(pb.AppendMessagesRequest(session_id=session.session_id,
                                                     messages=[bad]), timeout=10)
    assert_serving(shared_sidecar)


MIB = "x" * (1024 * 1024)
UNBOUNDED = [
    ("tool_calls_json", lambda st, s: st.AppendMessages(pb.AppendMessagesRequest(
        session_id=s.session_id, messages=[msg("assistant", "", tool_calls_json=f'["{MIB}"]')])),
     "messages[0].tool_calls_json"),
    ("tool_name", lambda st, s: st.AppendMessages(pb.AppendMessagesRequest(
        session_id=s.session_id, messages=[msg("tool", "r", tool_name=MIB)])), "messages[0].tool_name"),
    ("tool_call_id", lambda st, s: st.AppendMessages(pb.AppendMessagesRequest(
        session_id=s.session_id, messages=[msg("tool", "r", tool_call_id=MIB)])),
     "messages[0].tool_call_id"),
    ("cost_status", lambda st, s: st.UpdateUsage(pb.UpdateUsageRequest(
        session_key=s.session_key, cost_status=MIB)), "cost_status"),
    ("display_name", lambda st, s: st.ResetSession(pb.ResetSessionRequest(
        session_key=s.session_key, display_name=MIB)), "display_name"),
]


@pytest.mark.parametrize("name,call,field", UNBOUNDED, ids=[x[0] for x in UNBOUNDED])
def test_oversized_other_fields_invalid(sidecar, name, call, field):
    stub = sidecar.sessions()
    s, _ = create(stub)
    with rpc_error(*INVALID, field):
        call(stub, s)
    assert_serving(sidecar)


def _append_big(stub, sid: str, n: int) -> None:
    big = "y" * KIB256
    for i in range(0, n, 10):
        stub.AppendMessages(pb.AppendMessagesRequest(
            session_id=sid, messages=[msg("user", big)] * min(10, n - i)), timeout=30)


def test_transcript_page_of_max_size_messages(sidecar):
    stub = sidecar.sessions()
    s, _ = create(stub)
    _append_big(stub, s.session_id, 130)  # 32.5 MiB of content
    ch = grpc.insecure_channel(sidecar.target, options=[("grpc.max_receive_message_length", -1)])
    from agent_sidecar.v1 import session_service_pb2_grpc as pb_grpc
    big_client = pb_grpc.SessionServiceStub(ch)
    seen, token = 0, ""
    while True:
        r = big_client.GetTranscript(pb.GetTranscriptRequest(
            session_id=s.session_id, page_size=1000, page_token=token), timeout=60)
        seen += len(r.messages)
        token = r.next_page_token
        if not token:
            break
    ch.close()
    assert seen == 130


def test_transcript_default_client_can_page_big_messages(sidecar):
    stub = sidecar.sessions()
    s, _ = create(stub)
    _append_big(stub, s.session_id, 20)  # 5 MiB of content
    from helpers.sessions import transcript
    got = transcript(stub, s.session_id)
    assert len(got) == 20 and all(len(m.content) == KIB256 for m in got)


# Any query is searched or refused as INVALID_ARGUMENT naming it; NUL used to
# end FTS5's reading of the phrase fallback mid-quote: INTERNAL (issue 14 item 11).
ODD_QUERIES = ["\x00", "a\x00b", "hello\x00", '"\x00"', "\x00\x00 hello", 'NEAR("x"\x00',
               '"', "*", "-", "AND", "hello OR", "^", "\U0001f600", "\x01\x7f"]


@pytest.mark.parametrize("query", ODD_QUERIES, ids=[repr(q) for q in ODD_QUERIES])
def test_any_search_query_is_searched_or_refused(shared_sidecar, known, query):
    stub, session = known
    try:
        hits = stub.SearchMessages(pb.SearchMessagesRequest(
            query=query, session_key=session.session_key), timeout=10).hits
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.code(), e.details())
        assert error_info(e) == ("INVALID_ARGUMENT", "query"), e.details()
        return
    if query.replace("\x00", " ").split() == ["hello"]:  # NUL reads as a space
        assert session.session_id in {h.session_id for h in hits}

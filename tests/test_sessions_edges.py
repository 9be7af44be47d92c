"""SessionService at the edges of its input and of a lane's history: page
tokens that decode but do not fit SQLite, a timestamp at the end of the
Timestamp range, transcript pages of multi-byte text read by a client with
gRPC's default 4 MiB receive limit, and SwitchSession's fresh entry."""

from __future__ import annotations

import base64

import grpc
import orjson
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from agent_sidecar.v1 import session_service_pb2 as pb
from helpers_sessions import create, msg, rpc_error, seed, transcript
from sidecar_proc import Sidecar


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    s = Sidecar(tmp_path_factory.mktemp("edges") / "data").start()
    yield s
    s.stop()


def token(data: dict) -> str:
    """A page token as the server encodes them (base64url of JSON)."""
    return base64.urlsafe_b64encode(orjson.dumps(data)).decode().rstrip("=")


def test_transcript_page_token_beyond_int64_is_invalid_argument(sc):
    s = seed(sc.sessions(), messages=[msg("user", "hi")])
    with rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "page_token"):
        sc.sessions().GetTranscript(pb.GetTranscriptRequest(
            session_id=s.session_id, page_token=token({"k": "transcript", "after": 2**64 - 1})),
            timeout=10)


def test_list_sessions_page_token_beyond_int64_is_invalid_argument(sc):
    with rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "page_token"):
        sc.sessions().ListSessions(pb.ListSessionsRequest(
            page_token=token({"k": "sessions", "u": 2**64 - 1, "s": "x"})), timeout=10)


def test_message_at_the_last_valid_timestamp_reads_back(sc):
    """Stored as a float, 9999-12-31T23:59:59.999999999Z rounds up past the range;
    reading it back clamps instead of failing every GetTranscript."""
    last = Timestamp(seconds=253402300799, nanos=999_999_999)
    s = seed(sc.sessions(), messages=[msg("user", "hi", created_at=last)])
    got = transcript(sc.sessions(), s.session_id)
    assert len(got) == 1 and got[0].created_at.seconds == 253402300799, got


def test_transcript_pages_count_bytes_not_characters(sc):
    """20 messages of 256 KiB of 4-byte characters (5 MiB): every page fits a
    client with the default 4 MiB receive limit, and paging returns them all."""
    big = "\U0001F600" * (256 * 1024 // 4)
    stub = sc.sessions()
    s = seed(stub, messages=[msg("user", big) for _ in range(10)])
    stub.AppendMessages(pb.AppendMessagesRequest(
        session_id=s.session_id, messages=[msg("user", big) for _ in range(10)]), timeout=30)
    got, tok, pages = 0, "", 0
    while True:
        r = stub.GetTranscript(pb.GetTranscriptRequest(session_id=s.session_id, page_token=tok),
                               timeout=30)
        got += len(r.messages)
        pages += 1
        tok = r.next_page_token
        if not tok:
            break
    assert got == 20 and pages >= 2, (got, pages)


def test_switch_session_starts_a_fresh_entry(sc):
    """/resume to an earlier incarnation: the lane's counters are not the ones
    the incarnation it left spent (seed 001: switch_session makes a new entry)."""
    stub = sc.sessions()
    first, _ = create(stub)
    key = first.session_key
    usage = pb.UpdateUsageRequest(session_key=key)
    usage.delta.input_tokens = 100
    stub.UpdateUsage(usage, timeout=10)
    second = stub.ResetSession(pb.ResetSessionRequest(session_key=key), timeout=10).session
    assert second.input_tokens == 0
    usage.delta.input_tokens = 5
    stub.UpdateUsage(usage, timeout=10)
    back = stub.SwitchSession(pb.SwitchSessionRequest(
        session_key=key, target_session_id=first.session_id), timeout=10).session
    assert back.session_id == first.session_id
    assert (back.input_tokens, back.total_tokens) == (0, 0), back
    assert not back.is_fresh_reset and not back.suspended

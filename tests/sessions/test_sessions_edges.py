"""SessionService at the edges of its input and of a lane's history: page
tokens that decode but do not fit SQLite, a timestamp at the end of the
Timestamp range, transcript pages of multi-byte text read by a client with
gRPC's default 4 MiB receive limit, SwitchSession's fresh entry, and the
lifecycle of the entry's flags (seed 001 §2: what a new incarnation's first
turn consumes, the resume marker's time going with the marker)."""

from __future__ import annotations

import base64

import grpc
import orjson
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from helpers.config import scripted
from helpers.ids import source as src
from helpers.sessions import create, get_session, msg, rpc_error, seed, transcript
from helpers.store import local_store
from helpers.streams import PromptRun, start
from sidecar_proc import Sidecar

from agent_sidecar.sessions import lifecycle as life
from agent_sidecar.sessions.source import SessionSource
from agent_sidecar.store.records import MAX_TOKEN_DELTA, TOKEN_TOTAL_CAP, RoutingPatch, UsageDelta
from agent_sidecar.v1 import session_service_pb2 as pb


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


@pytest.mark.parametrize("page_size", [1, 31, 32, 33, 64, 1000])
def test_transcript_pages_read_in_chunks_return_each_message_once(sc, page_size):
    """A page is read from the store a chunk at a time (so a page of large
    messages stops reading at its byte budget): pages of any size across
    the chunks' edges return every live message once, in order."""
    stub = sc.sessions()
    s = seed(stub, messages=[msg("user", f"m{i}") for i in range(70)])
    stub.RewindSession(pb.RewindSessionRequest(session_id=s.session_id, n=1), timeout=10)  # m69 hidden
    live = [m.content for m in transcript(stub, s.session_id, page_size=page_size)]
    assert live == [f"m{i}" for i in range(69)]
    everything = transcript(stub, s.session_id, include_rewound=True, page_size=page_size)
    assert [m.seq for m in everything] == list(range(1, 71))


def test_session_pages_end_before_a_default_receive_limit(sc):
    """120 sessions whose chat name and topic are 4,096 four-byte characters
    each (~4 MiB of sessions): a page of page_size 1000 ends at the byte
    budget, every page fits a client with the default 4 MiB receive limit,
    and paging returns each session once, most recent first."""
    big = "\U0001F600" * 4096
    stub = sc.sessions()
    platform = "bigpages"
    made = [stub.GetOrCreateSession(pb.GetOrCreateSessionRequest(
        source=src(platform, chat_type="group", chat_name=big, chat_topic=big)), timeout=10).session
        for _ in range(120)]
    seen, times, tok, pages = [], [], "", 0
    while True:
        r = stub.ListSessions(pb.ListSessionsRequest(platform=platform, page_size=1000, page_token=tok),
                              timeout=30)
        assert r.ByteSize() < 4 * 1024 * 1024
        seen += [x.session_key for x in r.sessions]
        times += [x.updated_at.ToNanoseconds() for x in r.sessions]
        pages += 1
        tok = r.next_page_token
        if not tok:
            break
    assert pages >= 2 and sorted(seen) == sorted(m.session_key for m in made)
    assert times == sorted(times, reverse=True)


def test_names_and_labels_are_capped_in_characters_whatever_their_bytes(sc):
    """Before, ResetSession's display_name and MarkResumePending's reason were
    capped at 256 bytes by their handlers (the caps say characters): 100 CJK
    characters were refused. A display name takes what a chat name takes."""
    stub = sc.sessions()
    s, _ = create(stub)
    wide = "名" * 100  # 300 bytes
    reset = stub.ResetSession(pb.ResetSessionRequest(session_key=s.session_key, display_name=wide * 40),
                              timeout=10).session
    assert reset.display_name == wide * 40
    with rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "display_name"):
        stub.ResetSession(pb.ResetSessionRequest(session_key=s.session_key, display_name="x" * 4097),
                          timeout=10)
    marked = stub.MarkResumePending(pb.MarkResumePendingRequest(session_key=s.session_key, reason=wide),
                                    timeout=10).session
    assert marked.resume_reason == wide


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


def test_resuming_the_current_incarnation_of_a_stopped_lane_keeps_it(sc):
    """/stop, then /resume of the conversation it stopped: the next access
    keeps that incarnation (the switch used to return at once for the
    current id, leaving ``suspended`` set: the next message started a new one)."""
    stub = sc.sessions()
    source = src()
    first, _ = create(stub, source)
    key = first.session_key
    stub.SuspendSession(pb.SuspendSessionRequest(session_key=key), timeout=10)
    back = stub.SwitchSession(pb.SwitchSessionRequest(
        session_key=key, target_session_id=first.session_id), timeout=10).session
    assert back.session_id == first.session_id and not back.suspended
    again, created = create(stub, source)
    assert (again.session_id, created) == (first.session_id, False)


def test_seed_by_key_into_a_stopped_lane_lands_where_the_next_turn_runs(sc):
    """SeedSession by key on a suspended lane starts it over first, as a
    Prompt by key does (the messages used to go into the suspended
    incarnation, which the next access replaced)."""
    stub = sc.sessions()
    source = src()
    first, _ = create(stub, source)
    stub.SuspendSession(pb.SuspendSessionRequest(session_key=first.session_key), timeout=10)
    seeded = stub.SeedSession(pb.SeedSessionRequest(
        session_key=first.session_key, messages=[msg("user", "q"), msg("assistant", "a")]), timeout=10).session
    assert seeded.session_id != first.session_id and not seeded.suspended
    assert seeded.was_auto_reset and seeded.auto_reset_reason == "suspended"
    nxt, created = create(stub, source)
    assert (nxt.session_id, created) == (seeded.session_id, False)
    assert [m.content for m in transcript(stub, nxt.session_id)] == ["q", "a"]


def test_usage_counters_stop_at_their_cap(tmp_path):
    """Each call's delta is bounded, the running totals are not: they stop at
    the cap instead of overflowing int64 (on SQLite the column became a REAL
    and every read of the lane failed)."""
    near = TOKEN_TOTAL_CAP - 5
    biggest = UsageDelta(MAX_TOKEN_DELTA, MAX_TOKEN_DELTA, MAX_TOKEN_DELTA, MAX_TOKEN_DELTA, 1.0)
    with local_store(tmp_path / "cap") as store:
        entry, _ = store.job(life.get_or_create, "agent:main:telegram:dm:cap",
                             SessionSource(platform="telegram", chat_id="cap"), "main", False)
        key = entry.session_key
        store.job(lambda uow: uow.routing.patch(key, RoutingPatch(
            input_tokens=near, output_tokens=near, cache_read_tokens=near, cache_write_tokens=near,
            total_tokens=near)))
        for _ in range(2):
            entry = store.job(life.update_usage, key, biggest)
            assert (entry.input_tokens, entry.output_tokens, entry.cache_read_tokens,
                    entry.cache_write_tokens, entry.total_tokens) == (TOKEN_TOTAL_CAP,) * 5
        assert store.read("entry", key).total_tokens == TOKEN_TOTAL_CAP


def test_a_turns_usage_stays_with_the_incarnation_it_ran_on(tmp_path):
    """SwitchSession while a turn runs: the lane's counters are the target
    incarnation's from then on; the turn's usage, reported as it ends, is
    not charged to them."""
    model = scripted("main", [{"text": "late answer", "delay_ms": 1500, "repeat": True,
                               "usage": {"input_tokens": 1000, "output_tokens": 500}}])
    sc = Sidecar(tmp_path / "data", config=model).start()
    try:
        stub = sc.sessions()
        first, _ = create(stub)
        key = first.session_key
        stub.ResetSession(pb.ResetSessionRequest(session_key=key), timeout=10)
        running = start(sc.prompts(), text="hi", key=key)
        running.wait_for("started")
        stub.SwitchSession(pb.SwitchSessionRequest(session_key=key, target_session_id=first.session_id),
                           timeout=10)
        assert running.result(20).end == "completed"
        back = get_session(stub, key)
        assert back.session_id == first.session_id
        assert (back.input_tokens, back.output_tokens, back.total_tokens) == (0, 0, 0), back
        _turn(sc, key)  # a turn on the lane's own incarnation is charged to it
        assert get_session(stub, key).input_tokens == 1000
    finally:
        sc.stop()


def _turn(sc, key: str) -> None:
    run = PromptRun(sc.prompts(), text="hello", key=key).result(20)
    assert run.end == "completed", (run.kinds(), run.error)


def _marked(stub, key: str):
    return stub.MarkResumePending(pb.MarkResumePendingRequest(
        session_key=key, reason="restart_timeout"), timeout=10).session


def test_the_first_completed_turn_consumes_the_new_incarnations_flags(sc):
    """was_auto_reset (with its reason) and is_fresh_reset are for the first
    turn of the new incarnation; once it has completed they are gone."""
    stub = sc.sessions()
    source = src()
    first, _ = create(stub, source)
    stub.SuspendSession(pb.SuspendSessionRequest(session_key=first.session_key), timeout=10)
    auto, created = create(stub, source)
    assert created and auto.was_auto_reset and auto.auto_reset_reason == "suspended"
    _turn(sc, auto.session_key)
    after = stub.GetSession(pb.GetSessionRequest(session_key=auto.session_key), timeout=10).session
    assert (after.session_id, after.turn_count) == (auto.session_id, 1)
    assert not after.was_auto_reset and after.auto_reset_reason == "", after
    fresh = stub.ResetSession(pb.ResetSessionRequest(session_key=auto.session_key), timeout=10).session
    assert fresh.is_fresh_reset
    _turn(sc, fresh.session_key)
    after = stub.GetSession(pb.GetSessionRequest(session_key=fresh.session_key), timeout=10).session
    assert not after.is_fresh_reset and not after.was_auto_reset, after


def test_last_resume_marked_at_goes_with_resume_pending(sc):
    """Cleared by the completed turn that clears resume_pending, and a reset or
    a switch starts the lane's flags clean."""
    stub = sc.sessions()
    s, _ = create(stub)
    key = s.session_key
    assert _marked(stub, key).last_resume_marked_at.seconds > 0
    _turn(sc, key)
    done = stub.GetSession(pb.GetSessionRequest(session_key=key), timeout=10).session
    assert not done.resume_pending and done.last_resume_marked_at.seconds == 0, done
    _marked(stub, key)
    reset = stub.ResetSession(pb.ResetSessionRequest(session_key=key), timeout=10).session
    assert not reset.resume_pending and reset.last_resume_marked_at.seconds == 0, reset
    assert reset.reset_had_activity and reset.is_fresh_reset
    _marked(stub, key)
    back = stub.SwitchSession(pb.SwitchSessionRequest(
        session_key=key, target_session_id=s.session_id), timeout=10).session
    assert back.session_id == s.session_id
    assert not (back.resume_pending or back.is_fresh_reset or back.was_auto_reset
                or back.reset_had_activity), back
    assert back.last_resume_marked_at.seconds == 0 and back.resume_reason == "", back

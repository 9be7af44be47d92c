"""SessionService lifecycle and transcripts over gRPC against the real sidecar
(seed 001 §2–§3): get_or_create priority, reset/switch/suspend/mark, rewind,
rewrite, append, search, usage, delete."""

from __future__ import annotations

import time

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from helpers.ids import SESSION_ID_RE, uniq
from helpers.ids import source as src
from helpers.sessions import create, msg, rpc_error, seed, transcript, turns

from agent_sidecar.v1 import common_pb2 as c
from agent_sidecar.v1 import session_service_pb2 as pb

NOT_FOUND = grpc.StatusCode.NOT_FOUND


@pytest.fixture(scope="module")
def stub(shared_sidecar):
    return shared_sidecar.sessions()


def _get(stub, key):
    return stub.GetSession(pb.GetSessionRequest(session_key=key), timeout=10).session


# -- get_or_create priority ------------------------------------------------------

def test_fresh_key_creates_then_keeps_and_bumps(stub):
    source = src("telegram", chat_name="Team chat", user_id="u1")
    s, created = create(stub, source)
    assert created
    assert SESSION_ID_RE.match(s.session_id)
    assert s.session_key == f"agent:main:telegram:dm:{source.chat_id}"
    assert (s.platform, s.chat_type, s.profile) == ("telegram", "dm", "main")
    assert s.state == c.SESSION_STATE_IDLE and s.turn_count == 0
    assert s.origin.chat_id == source.chat_id and s.origin.user_id == "u1"
    assert s.display_name == "Team chat"
    assert not (s.suspended or s.resume_pending or s.was_auto_reset or s.is_fresh_reset)
    assert s.cost_status == "unknown"
    time.sleep(0.01)
    again, created2 = create(stub, source)
    assert not created2
    assert again.session_id == s.session_id
    assert again.created_at == s.created_at
    assert again.updated_at.ToNanoseconds() > s.updated_at.ToNanoseconds()
    assert _get(stub, s.session_key).session_id == s.session_id


def test_force_new_gives_new_id(stub):
    source = src()
    s, _ = create(stub, source)
    s2, created = create(stub, source, force_new=True)
    assert created and s2.session_id != s.session_id
    assert s2.session_key == s.session_key
    assert not s2.was_auto_reset and not s2.is_fresh_reset
    assert _get(stub, s.session_key).session_id == s2.session_id


def test_a_new_incarnation_is_named_as_the_chat_is_now(stub):
    """A chat renamed, then force_new or /stop and the next access: the new
    incarnation's display_name is the source's chat name, as a kept lane's
    is (it kept the old name while origin.chat_name had the new one)."""
    first = src(chat_name="Before")
    s, _ = create(stub, first)
    renamed = c.SessionSource(platform=first.platform, chat_id=first.chat_id, chat_name="After")
    fresh, created = create(stub, renamed, force_new=True)
    assert created and (fresh.display_name, fresh.origin.chat_name) == ("After", "After")
    assert _get(stub, s.session_key).display_name == "After"
    stub.SuspendSession(pb.SuspendSessionRequest(session_key=s.session_key), timeout=10)
    again = c.SessionSource(platform=first.platform, chat_id=first.chat_id, chat_name="Later")
    restarted, created = create(stub, again)
    assert created and restarted.auto_reset_reason == "suspended"
    assert (restarted.display_name, _get(stub, s.session_key).display_name) == ("Later", "Later")
    unnamed, _ = create(stub, c.SessionSource(platform=first.platform, chat_id=first.chat_id), force_new=True)
    assert unnamed.display_name == "Later"  # a source without a chat name keeps the one there is


def test_suspended_beats_resume_pending(stub):
    source = src()
    s, _ = create(stub, source)
    marked = stub.MarkResumePending(pb.MarkResumePendingRequest(
        session_key=s.session_key, reason="restart_timeout"), timeout=10).session
    assert marked.resume_pending
    sus = stub.SuspendSession(pb.SuspendSessionRequest(session_key=s.session_key), timeout=10).session
    assert sus.suspended and sus.resume_pending and sus.session_id == s.session_id
    s2, created = create(stub, source)
    assert created
    assert s2.session_id != s.session_id
    assert s2.was_auto_reset and s2.auto_reset_reason == "suspended"
    assert not s2.suspended and not s2.resume_pending and not s2.is_fresh_reset
    # The next access keeps the replacement.
    s3, created3 = create(stub, source)
    assert not created3 and s3.session_id == s2.session_id


def test_resume_pending_keeps_id(stub):
    source = src()
    s, _ = create(stub, source)
    m = stub.MarkResumePending(pb.MarkResumePendingRequest(
        session_key=s.session_key, reason="shutdown_timeout"), timeout=10).session
    assert m.resume_pending and m.resume_reason == "shutdown_timeout"
    assert m.last_resume_marked_at.seconds > 0
    for _ in range(2):
        s2, created = create(stub, source)
        assert not created
        assert s2.session_id == s.session_id
        assert s2.resume_pending  # cleared only by the next successful turn
        assert not s2.was_auto_reset


def test_mark_never_overrides_suspended(stub):
    source = src()
    s, _ = create(stub, source)
    stub.SuspendSession(pb.SuspendSessionRequest(session_key=s.session_key), timeout=10)
    m = stub.MarkResumePending(pb.MarkResumePendingRequest(
        session_key=s.session_key, reason="restart_timeout"), timeout=10).session
    assert m.suspended and not m.resume_pending and m.resume_reason == ""
    assert not _get(stub, s.session_key).resume_pending
    s2, created = create(stub, source)
    assert created and s2.session_id != s.session_id and s2.auto_reset_reason == "suspended"


def test_reset_then_switch_back(stub):
    source = src()
    old = seed(stub, source, turns("hello", "hi there"))
    r = stub.ResetSession(pb.ResetSessionRequest(session_key=old.session_key), timeout=10).session
    assert r.session_id != old.session_id and SESSION_ID_RE.match(r.session_id)
    assert r.is_fresh_reset and not r.was_auto_reset
    assert r.reset_had_activity
    assert _get(stub, old.session_key).session_id == r.session_id
    assert transcript(stub, r.session_id) == []
    # The old incarnation's transcript is still readable by its id.
    assert [m.content for m in transcript(stub, old.session_id)] == ["hello", "hi there"]
    # A reset of a lane without activity says so.
    r2 = stub.ResetSession(pb.ResetSessionRequest(session_key=old.session_key), timeout=10).session
    assert r2.session_id not in (r.session_id, old.session_id) and not r2.reset_had_activity
    # /resume: back to the first incarnation.
    sw = stub.SwitchSession(pb.SwitchSessionRequest(
        session_key=old.session_key, target_session_id=old.session_id), timeout=10).session
    assert sw.session_id == old.session_id and not sw.is_fresh_reset
    assert _get(stub, old.session_key).session_id == old.session_id
    s, created = create(stub, source)
    assert not created and s.session_id == old.session_id
    # Appending continues the switched-to transcript.
    stub.AppendMessages(pb.AppendMessagesRequest(session_id=old.session_id,
                                                 messages=[msg("user", "back again")]), timeout=10)
    assert [m.seq for m in transcript(stub, old.session_id)] == [1, 2, 3]


def test_switch_to_foreign_or_unknown_id(stub):
    a, _ = create(stub)
    b, _ = create(stub)
    with rpc_error(NOT_FOUND, "SESSION_NOT_FOUND"):  # it exists, under a key the caller did not name
        stub.SwitchSession(pb.SwitchSessionRequest(session_key=a.session_key,
                                                   target_session_id=b.session_id), timeout=10)
    with rpc_error(NOT_FOUND, "SESSION_NOT_FOUND"):
        stub.SwitchSession(pb.SwitchSessionRequest(
            session_key=a.session_key, target_session_id="20200101_000000_deadbeef"), timeout=10)
    assert _get(stub, a.session_key).session_id == a.session_id


def test_reset_clears_usage(stub):
    s, _ = create(stub)
    stub.UpdateUsage(pb.UpdateUsageRequest(session_key=s.session_key,
                                           delta=c.Usage(input_tokens=5, cost_usd=0.5)), timeout=10)
    r = stub.ResetSession(pb.ResetSessionRequest(session_key=s.session_key), timeout=10).session
    assert r.input_tokens == 0 and r.total_tokens == 0 and r.estimated_cost_usd == 0


# -- transcripts ---------------------------------------------------------------------

def test_rewind_one_then_more_than_exist_then_nothing(stub):
    msgs = [msg("system", "be brief")] + turns("u1", "a1", "u2", "a2", "u3", "a3")
    s = seed(stub, src(), msgs)
    sid = s.session_id
    r = stub.RewindSession(pb.RewindSessionRequest(session_id=sid, n=1), timeout=10)
    assert (r.rewound_count, r.turns_undone, r.target_text) == (2, 1, "u3")
    assert [m.content for m in transcript(stub, sid)] == ["be brief", "u1", "a1", "u2", "a2"]
    r = stub.RewindSession(pb.RewindSessionRequest(session_id=sid, n=10), timeout=10)
    assert (r.rewound_count, r.turns_undone, r.target_text) == (4, 2, "u1")
    assert [m.content for m in transcript(stub, sid)] == ["be brief"]
    r = stub.RewindSession(pb.RewindSessionRequest(session_id=sid, n=3), timeout=10)
    assert (r.rewound_count, r.turns_undone, r.target_text) == (0, 0, "")
    # The audit trail: every row is still there, hidden ones inactive.
    full = transcript(stub, sid, include_rewound=True)
    assert [m.seq for m in full] == list(range(1, 8))
    assert [m.active for m in full] == [True] + [False] * 6
    assert all(m.active for m in transcript(stub, sid))


def test_rewind_n_zero_means_one(stub):
    s = seed(stub, src(), turns("q1", "r1", "q2", "r2"))
    r = stub.RewindSession(pb.RewindSessionRequest(session_id=s.session_id), timeout=10)
    assert (r.rewound_count, r.turns_undone, r.target_text) == (2, 1, "q2")


def test_rewind_does_not_count_a_synthetic_note_as_a_user_turn(stub):
    """After an auto-resume the transcript holds the sidecar's own note as a
    synthetic "user" message: /undo takes back the user's last message (and
    the continuation with it), and hands back the text the user wrote, not
    the note (it used to undo only the resume turn and return the note)."""
    s = seed(stub, src(), turns("u1", "a1", "u2", "cut off") + [
        msg("user", "[your previous turn was cut off]", synthetic=True), msg("assistant", "where was I")])
    r = stub.RewindSession(pb.RewindSessionRequest(session_id=s.session_id, n=1), timeout=10)
    assert (r.rewound_count, r.turns_undone, r.target_text) == (4, 1, "u2")
    assert [m.content for m in transcript(stub, s.session_id)] == ["u1", "a1"]


def test_rewrite_keeps_audit_trail(stub):
    s = seed(stub, src(), turns("one", "two", "three", "four"))
    stub.RewriteTranscript(pb.RewriteTranscriptRequest(
        session_id=s.session_id, messages=[msg("system", "summary"), msg("user", "five")]),
        timeout=10)
    live = transcript(stub, s.session_id)
    assert [(m.seq, m.content, m.active) for m in live] == [(5, "summary", True), (6, "five", True)]
    full = transcript(stub, s.session_id, include_rewound=True)
    assert [(m.content, m.active) for m in full] == [
        ("one", False), ("two", False), ("three", False), ("four", False),
        ("summary", True), ("five", True)]
    # Rewind after rewrite only touches live rows.
    r = stub.RewindSession(pb.RewindSessionRequest(session_id=s.session_id, n=1), timeout=10)
    assert (r.rewound_count, r.turns_undone, r.target_text) == (1, 1, "five")


def test_append_contiguous_seqs_and_fields_roundtrip(stub):
    s, _ = create(stub)
    r1 = stub.AppendMessages(pb.AppendMessagesRequest(session_id=s.session_id, messages=turns(
        "a", "b", "c")), timeout=10)
    assert (r1.first_seq, r1.last_seq) == (1, 3)
    at = Timestamp(seconds=1_700_000_000, nanos=123_000_000)
    calls = '[{"id":"call_1","type":"function","function":{"name":"lookup","arguments":"{}"}}]'
    extra = [msg("assistant", "", tool_calls_json=calls),
             msg("tool", '{"ok":true}', tool_call_id="call_1", tool_name="lookup", created_at=at)]
    r2 = stub.AppendMessages(pb.AppendMessagesRequest(session_id=s.session_id, messages=extra),
                             timeout=10)
    assert (r2.first_seq, r2.last_seq) == (4, 5)
    got = transcript(stub, s.session_id)
    assert [m.seq for m in got] == [1, 2, 3, 4, 5]
    assert [m.role for m in got] == ["user", "assistant", "user", "assistant", "tool"]
    assert got[3].tool_calls_json == calls
    assert (got[4].tool_call_id, got[4].tool_name, got[4].content) == ("call_1", "lookup", '{"ok":true}')
    assert got[4].created_at.seconds == 1_700_000_000
    assert abs(got[4].created_at.nanos - 123_000_000) < 1000
    assert got[0].created_at.seconds > 1_700_000_000 and all(m.active for m in got)
    # a message the adapter marks as nobody's (its own note) reads back so
    stub.AppendMessages(pb.AppendMessagesRequest(session_id=s.session_id, messages=[
        msg("user", "[adapter note]", synthetic=True)]), timeout=10)
    assert [m.synthetic for m in transcript(stub, s.session_id)] == [False] * 5 + [True]


def test_transcript_paging(stub):
    s = seed(stub, src(), turns(*[f"m{i}" for i in range(5)]))
    pages, token = [], ""
    while True:
        r = stub.GetTranscript(pb.GetTranscriptRequest(
            session_id=s.session_id, page_size=2, page_token=token), timeout=10)
        pages.append([m.content for m in r.messages])
        token = r.next_page_token
        if not token:
            break
    assert pages == [["m0", "m1"], ["m2", "m3"], ["m4"]]


def test_seed_by_session_key_appends(stub):
    s = seed(stub, src(), turns("first"))
    s2 = stub.SeedSession(pb.SeedSessionRequest(session_key=s.session_key,
                                                messages=turns("second")), timeout=10).session
    assert s2.session_id == s.session_id
    assert [m.content for m in transcript(stub, s.session_id)] == ["first", "second"]


# -- search --------------------------------------------------------------------------

def test_search_live_not_rewound_with_snippet(stub):
    live_word, gone_word = uniq("quokka"), uniq("wombat")
    s = seed(stub, src(), turns(f"where do {live_word} live", "in Australia",
                               f"and {gone_word} too?", "yes"))
    hits = stub.SearchMessages(pb.SearchMessagesRequest(query=live_word), timeout=10).hits
    assert len(hits) == 1
    h = hits[0]
    assert (h.session_key, h.session_id, h.seq, h.role) == (s.session_key, s.session_id, 1, "user")
    assert live_word in h.snippet and h.created_at.seconds > 0
    assert len(stub.SearchMessages(pb.SearchMessagesRequest(query=gone_word), timeout=10).hits) == 1
    stub.RewindSession(pb.RewindSessionRequest(session_id=s.session_id, n=1), timeout=10)
    assert stub.SearchMessages(pb.SearchMessagesRequest(query=gone_word), timeout=10).hits == []
    assert len(stub.SearchMessages(pb.SearchMessagesRequest(query=live_word), timeout=10).hits) == 1


def test_search_session_key_filter_and_limit(stub):
    word = uniq("platypus")
    a = seed(stub, src(), turns(f"{word} one", f"{word} two"))
    b = seed(stub, src(), turns(f"{word} three"))
    all_hits = stub.SearchMessages(pb.SearchMessagesRequest(query=word), timeout=10).hits
    assert {h.session_key for h in all_hits} == {a.session_key, b.session_key} and len(all_hits) == 3
    only_b = stub.SearchMessages(pb.SearchMessagesRequest(query=word, session_key=b.session_key),
                                 timeout=10).hits
    assert [(h.session_key, h.seq) for h in only_b] == [(b.session_key, 1)]
    shouted = b.session_key.replace(":telegram:", ":TELEGRAM:")  # keys fold their platform's case
    assert shouted != b.session_key
    assert stub.SearchMessages(pb.SearchMessagesRequest(query=word, session_key=shouted),
                               timeout=10).hits == only_b
    limited = stub.SearchMessages(pb.SearchMessagesRequest(query=word, limit=2), timeout=10).hits
    assert len(limited) == 2


@pytest.mark.parametrize("query", ['foo"bar(', "AND", "*", '"', "a:b", "NEAR(", "(", "OR OR",
                                   "^", "'", "💥 ünïcode"])
def test_search_weird_query_does_not_crash(stub, query):
    stub.SearchMessages(pb.SearchMessagesRequest(query=query), timeout=10)


# The fruit messages' seqs each query finds: words all appear, "phrase", or, -word
# (websearch syntax); AND, NOT, OR in capitals and * are words, never operators.
FRUIT = ["{w} apple banana", "{w} apple cherry", "{w} banana split", "{w} pineapple pie",
         "{w} lunch at 12:00", "{w} from 00 to 12"]
SYNTAX = {"apple": [1, 2], "apple banana": [1], '"banana apple"': [], '"apple banana"': [1],
          "apple or cherry": [1, 2], "banana OR pie": [1, 3, 4], "apple -banana": [2],
          'banana -"banana split"': [1], "apple NOT banana": [], "apple AND banana": [],
          "app*": [], "apple or -cherry banana": [1, 2, 3], "--apple": [1, 2], "pie or": [],
          # One parse for both: PostgreSQL's own reading of the text differed here
          # (12 AND 00; "or," an operator, leaving an alternative of only -cherry).
          "12:00": [5], "apple or, -cherry": []}


def test_search_speaks_one_syntax_on_both_backends(stub):
    """docs/api.md SearchMessagesRequest.query: the same query finds the same
    messages on SQLite and PostgreSQL (SQLite read it as FTS5, where `apple
    -banana` found the messages with banana)."""
    w = uniq("fruit")
    s = seed(stub, src(), [msg("user", f.format(w=w)) for f in FRUIT])
    for query, seqs in SYNTAX.items():
        hits = stub.SearchMessages(pb.SearchMessagesRequest(query=f"{w} {query}", session_key=s.session_key),
                                   timeout=10).hits
        assert sorted(h.seq for h in hits) == seqs, query


# Words as both backends find them: letters and digits between punctuation,
# whatever the punctuation makes of them (a URL, an e-mail address, a dotted
# number, a name with underscores); a NUL separates words too.
WORDY = ["see https://github.com/agent-sidecar/agent-sidecar", "write to bob.smith@example.com",
         "pi is 3.14159", "call make_session_key", "hello\x00world", "left \ufdd0 \ufdd1 right",
         "un café crème, thé ou chocolat"]
WORDS_FOUND = {"github": [1], "https": [1], "sidecar": [1], "agent-sidecar": [1], "example": [2],
               "bob": [2], "example.com": [2], "14159": [3], "3.14159": [3], "session": [4],
               "session_key": [4], "world": [5], "hello": [5], "right": [6], "CRÈME": [7]}


def test_search_finds_words_within_urls_addresses_and_numbers_on_both_backends(stub):
    """PostgreSQL's parser read "https://github.com/x" as a URL, a host and a
    path, "bob@example.com" as one address, "3.14159" as one number, and the
    escape of a NUL as part of the next word: SearchMessages found "github",
    "example", "14159" or "world" there on SQLite only. And its snippet took
    the message's own U+FDD0 and U+FDD1 for its highlight marks. Its
    snippets marked each word of a phrase on its own, also outside the
    phrase and in an excluded one, where SQLite marks the phrase."""
    w = uniq("wordy")
    s = seed(stub, src(), [msg("user", f"{w} {t}") for t in WORDY])

    def hits(query):
        return stub.SearchMessages(pb.SearchMessagesRequest(query=f"{w} {query}", session_key=s.session_key),
                                   timeout=10).hits
    for query, seqs in WORDS_FOUND.items():
        assert sorted(h.seq for h in hits(query)) == seqs, query
    assert [h.snippet for h in hits("github")] == [f"[{w}] see https://[github].com/agent-sidecar/agent-sidecar"]
    assert [h.snippet for h in hits("right")] == [f"[{w}] left \ufdd0 \ufdd1 [right]"]
    # Marked as SQLite marks them: a phrase (also one the punctuation makes) as one span, each of its
    # instances, never an excluded word.
    assert [h.snippet for h in hits("bob.smith")] == [f"[{w}] write to [bob.smith]@example.com"]
    assert [h.snippet for h in hits("agent-sidecar")] == \
        [f"[{w}] see https://github.com/[agent-sidecar]/[agent-sidecar]"]
    assert [h.snippet for h in hits('thé -"thé vert"')] == [f"[{w}] un café crème, [thé] ou chocolat"]


@pytest.mark.parametrize("query", ["-x", "-apple or banana", '-"a b"'])
def test_search_that_only_excludes_is_refused(stub, query):
    with rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "query"):
        stub.SearchMessages(pb.SearchMessagesRequest(query=query), timeout=10)


def test_search_weird_query_falls_back_to_phrase(stub):
    word = uniq("foo")
    s = seed(stub, src(), turns(f'{word} bar baz'))
    hits = stub.SearchMessages(pb.SearchMessagesRequest(query=f'{word}"bar(',
                                                        session_key=s.session_key), timeout=10).hits
    assert [h.seq for h in hits] == [1]


# -- usage and delete -----------------------------------------------------------------

def test_update_usage_accumulates(stub):
    s, _ = create(stub)
    d1 = c.Usage(input_tokens=100, output_tokens=20, cache_read_tokens=5, cache_write_tokens=1,
                 cost_usd=0.25)
    d2 = c.Usage(input_tokens=50, output_tokens=10, cost_usd=0.125)
    stub.UpdateUsage(pb.UpdateUsageRequest(session_key=s.session_key, delta=d1), timeout=10)
    u = stub.UpdateUsage(pb.UpdateUsageRequest(session_key=s.session_key, delta=d2,
                                               last_prompt_tokens=77, cost_status="estimated"),
                         timeout=10).session
    assert (u.input_tokens, u.output_tokens, u.cache_read_tokens, u.cache_write_tokens) == (150, 30, 5, 1)
    assert u.total_tokens == 186
    assert u.estimated_cost_usd == pytest.approx(0.375)
    assert u.last_prompt_tokens == 77 and u.cost_status == "estimated"
    # Zero last_prompt_tokens / empty cost_status leave them alone.
    u = stub.UpdateUsage(pb.UpdateUsageRequest(session_key=s.session_key, delta=c.Usage()),
                         timeout=10).session
    assert u.last_prompt_tokens == 77 and u.cost_status == "estimated" and u.total_tokens == 186
    assert _get(stub, s.session_key).input_tokens == 150


@pytest.mark.parametrize("field", ["input_tokens", "output_tokens", "cache_read_tokens",
                                   "cache_write_tokens", "cost_usd"])
def test_update_usage_negative_invalid(stub, field):
    s, _ = create(stub)
    delta = c.Usage(**{field: -1})
    with rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", f"delta.{field}"):
        stub.UpdateUsage(pb.UpdateUsageRequest(session_key=s.session_key, delta=delta), timeout=10)
    assert _get(stub, s.session_key).total_tokens == 0


def test_delete_true_then_false(stub):
    source = src()
    s = seed(stub, source, turns("secret"))
    old = s.session_id
    stub.ResetSession(pb.ResetSessionRequest(session_key=s.session_key), timeout=10)
    assert stub.DeleteSession(pb.DeleteSessionRequest(session_key=s.session_key), timeout=10).deleted
    assert not stub.DeleteSession(pb.DeleteSessionRequest(session_key=s.session_key),
                                  timeout=10).deleted
    with rpc_error(NOT_FOUND, "SESSION_NOT_FOUND"):
        _get(stub, s.session_key)
    with rpc_error(NOT_FOUND, "SESSION_NOT_FOUND"):  # every incarnation went with it
        transcript(stub, old)
    word = "secret"
    hits = stub.SearchMessages(pb.SearchMessagesRequest(query=word), timeout=10).hits
    assert all(h.session_key != s.session_key for h in hits)
    s2, created = create(stub, source)
    assert created and s2.session_id != old

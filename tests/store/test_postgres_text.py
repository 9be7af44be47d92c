"""The PostgreSQL backend's text (store/postgres/), on a real server: text
PostgreSQL cannot hold as is (NUL, the escape mark) through every kind of
column, the full-text index (web-search syntax, snippets, doctor's rebuild,
also after an interrupted one) and the prefix and retention cuts. A test of a
backend may use its SQL; the behaviour of the sidecar on PostgreSQL is the
behavioural suite's (``--backend postgres``)."""

from __future__ import annotations

import json
import threading
import time

import orjson
import pytest
from helpers.store import local_store
from test_doctor import doctor

from agent_sidecar.store.postgres.connection import connect
from agent_sidecar.store.records import Append, LedgerEntry, Message, SessionEntry

pytestmark = pytest.mark.postgres_only("the PostgreSQL backend's text and full-text index")

NOW = time.time()


# -- text PostgreSQL cannot hold as is ---------------------------------------------------------------

ODD = ["a\x00b", "\x00", "\uffff", "\uffff0", "x\uffff\x00\uffff\uffff0", "\\u0000", "plain é"]


def test_nul_and_the_escape_mark_round_trip_through_every_kind_of_column(tmp_path):
    with local_store(tmp_path / "odd") as s:
        key, sid = "agent:main:t:dm:\x00odd\uffff", "sid\x00\uffff"
        s.job(lambda uow: uow.routing.insert(SessionEntry(key, sid, "main", "t", "dm", NOW, NOW,
                                                            origin={"chat_name": "\x00\uffff0"})))
        s.job(lambda uow: uow.incarnations.insert(sid, key, NOW))
        msgs = tuple(Message(role="user", content=t, tool_calls_json=json.dumps([{"id": t}])) for t in ODD)
        # an append of several items, then of one item of several messages, then of one message
        s.job(lambda uow: uow.messages.append([Append(sid, msgs[:2], request_id="r\x00"),
                                               Append(sid, msgs[2:3], request_id="r\x00")]))
        s.job(lambda uow: uow.messages.append([Append(sid, msgs[3:-1], request_id="r\x00")]))
        s.job(lambda uow: uow.messages.append([Append(sid, msgs[-1:], request_id="r\x00")]))
        s.job(lambda uow: uow.ledger.insert(LedgerEntry("r\x00", key, sid, "t", "completed", 1, "\x00",
                                                        {"absorbed_from": "\x00\uffff"}, NOW)))
        body = orjson.dumps({"text": "\x00 and \uffff and \\u0000"})
        cursor = s.job(lambda uow: uow.frames.insert([("r\x00", 1, key, sid, "t", NOW, "text_delta", body),
                                                      ("r\x00", 2, key, sid, "t\uffff", NOW, "x\x00", None)]))
        s.job(lambda uow: uow.ledger.set_first_frame("r\x00", cursor, 1))

        entry = s.read("entry", key)
        assert (entry.session_id, entry.origin) == (sid, {"chat_name": "\x00\uffff0"})
        got = s.read("transcript", sid, False, 0, None)
        assert [m.content for m in got] == ODD
        assert [json.loads(m.tool_calls_json)[0]["id"] for m in got] == ODD
        row = s.read("ledger", "r\x00")
        assert (row.text, row.payload) == ("\x00", {"absorbed_from": "\x00\uffff"})
        assert [(f.seq, f.platform, f.kind, f.body, f.at) for f in s.read("request_frames", "r\x00", 0)] == \
            [(1, "t", "text_delta", orjson.loads(body), NOW), (2, "t\uffff", "x\x00", {}, NOW)]
        assert [h.session_key for h in s.read("search", "plain", "", 10)] == [key]


# -- the full-text index ---------------------------------------------------------------------------

def test_search_is_websearch_syntax_with_snippets(tmp_path):
    with local_store(tmp_path / "fts") as s:
        s.job(lambda uow: uow.incarnations.insert("s1", "k1", NOW))
        texts = ["the quick brown fox", "a lazy dog sleeps", "quick thinking saves the day",
                 " ".join(["far"] * 30) + " needle " + " ".join(["away"] * 30)]
        s.job(lambda uow: uow.messages.append([Append("s1", tuple(Message(role="user", content=t)
                                                                  for t in texts))]))

        def snippets(q):
            return sorted(h.snippet for h in s.read("search", q, "", 10))
        assert snippets("quick") == ["[quick] thinking saves the day", "the [quick] brown fox"]
        assert snippets('"brown fox"') == ["the quick [brown fox]"]  # a phrase as one span, as on SQLite
        assert snippets("quick -fox") == ["[quick] thinking saves the day"]
        assert snippets("dog or day") == ["a lazy [dog] sleeps", "quick thinking saves the [day]"]
        (long,) = snippets("needle")
        assert long.startswith("…") and long.endswith("…") and "[needle]" in long, long
        assert snippets("nothing-here") == []


def test_doctor_rebuilds_a_missing_fts_index(tmp_path):
    from sidecar_proc import Sidecar
    data = tmp_path / "data"
    sc = Sidecar(data)
    env = sc.store_env()
    with local_store(sc) as s:
        s.job(lambda uow: uow.incarnations.insert("s1", "k1", NOW))
        s.job(lambda uow: uow.messages.append([Append("s1", (Message(role="user", content="zebra crossing"),))]))
        r = doctor(data, env=env)
        assert r.returncode == 0 and "full-text index: ok" in r.stdout, r.stdout + r.stderr
        s.conn.execute("DROP INDEX messages_fts")
        r = doctor(data, env=env)
        assert r.returncode == 1 and "messages_fts is missing" in r.stdout, r.stdout + r.stderr
        r = doctor(data, "--rebuild-fts", env=env)
        assert r.returncode == 0 and "rebuilt full-text index from 1 messages: ok" in r.stdout, r.stdout + r.stderr
        assert [h.snippet for h in s.read("search", "zebra", "", 10)] == ["[zebra] crossing"]


def _interrupted_rebuild(dsn: str) -> None:
    """A ``REINDEX … CONCURRENTLY`` of the full-text index cancelled while it
    waits for a writer's transaction (as an operator's Ctrl-C of doctor, or
    its connection lost, would stop it): its invalid copy stays behind."""
    from helpers.waiting import wait_until
    with connect(dsn, autocommit=True) as admin, connect(dsn) as writer, connect(dsn, autocommit=True) as rebuild:
        writer.execute("LOCK TABLE messages IN ROW EXCLUSIVE MODE")
        pid, errors = rebuild.info.backend_pid, []

        def reindex() -> None:
            try:
                rebuild.execute("REINDEX INDEX CONCURRENTLY messages_fts")
            except Exception as e:  # the cancel, asserted below
                errors.append(e)
        stopped = threading.Thread(target=reindex)
        stopped.start()
        wait_until(lambda: admin.execute("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                                         (pid,)).fetchone()[0], 30, what="the rebuild waiting for the writer")
        admin.execute("SELECT pg_cancel_backend(%s)", (pid,))
        stopped.join()
        writer.rollback()
        assert [type(e).__name__ for e in errors] == ["QueryCanceled"], errors


def test_doctor_drops_what_an_interrupted_rebuild_left_and_rebuilds(tmp_path):
    """A rebuild of the full-text index was interrupted and left its invalid
    copy (``messages_fts_ccnew``): doctor says so and that ``--rebuild-fts``
    mends it, which it does, and doctor is healthy again. The copy used to
    fail every integrity check for ever: a rebuild left it where it was
    (and added no repair hint)."""
    from sidecar_proc import Sidecar
    data = tmp_path / "data"
    sc = Sidecar(data)
    with local_store(sc) as s:
        s.job(lambda uow: uow.incarnations.insert("s1", "k1", NOW))
        s.job(lambda uow: uow.messages.append([Append("s1", (Message(role="user", content="zebra crossing"),))]))
        _interrupted_rebuild(sc.store_dsn)
        r = doctor(data, env=sc.store_env())
        assert r.returncode == 1, r.stdout + r.stderr
        assert "index messages_fts_ccnew is not valid (left by an interrupted rebuild: --rebuild-fts drops it)" \
            in r.stdout, r.stdout + r.stderr
        r = doctor(data, "--rebuild-fts", env=sc.store_env())
        assert r.returncode == 0 and "integrity after rebuild: ok" in r.stdout, r.stdout + r.stderr
        r = doctor(data, env=sc.store_env())
        assert r.returncode == 0 and "integrity: ok" in r.stdout, r.stdout + r.stderr
        assert [h.snippet for h in s.read("search", "zebra", "", 10)] == ["[zebra] crossing"]


def test_prefix_lookups_and_retention_cut_exactly(tmp_path):
    """``ids_with_prefix`` is a LIKE on byte-ordered ids (no locale, wildcards
    in the prefix taken literally, any character after it); retention's cut
    is found by binary search over frame ids."""
    ids = ["resume:s1:1", "resume:s1:2", "resume:s1:\U0001f600", "resume:s1_x", "resume:s10:1", "resume%s1"]
    with local_store(tmp_path / "cut") as s:
        for rid in ids:
            s.job(lambda uow, rid=rid: uow.ledger.insert(LedgerEntry(rid, "k", "s", "t", "completed", 1, "x", {}, NOW)))
        assert sorted(s.job(lambda uow: uow.ledger.ids_with_prefix("resume:s1:"))) == sorted(ids[:3])
        assert s.job(lambda uow: uow.ledger.ids_with_prefix("resume%")) == ["resume%s1"]
        assert s.job(lambda uow: uow.ledger.ids_with_prefix("resume:s1_")) == ["resume:s1_x"]
        s.job(lambda uow: uow.frames.insert([("r", n, "k", "s", "t", 100.0 + n, "text_delta", None)
                                             for n in range(10)]))
        assert s.job(lambda uow: uow.frames.delete_before(105.0, 3)) == 3
        assert s.job(lambda uow: uow.frames.delete_before(105.0, 100)) == 2
        assert s.job(lambda uow: uow.frames.delete_before(105.0, 100)) == 0
        assert [f.at for f in s.read("frames_after", 0, "k", "", 100)] == [105.0 + n for n in range(5)]

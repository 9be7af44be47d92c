"""The full-text index is filled in batches (sessions/transcripts.py), not by a
trigger per message. What a user must not notice: a search sees every message
written before it, after a crash too; deleting the newest messages (whose ids
SQLite then hands out again) leaves no message unsearchable and no stale hit;
the index is complete on disk after a clean stop; doctor finds it consistent.
The searches run on both backends (PostgreSQL indexes on insert); what the
deferred index left on disk is the SQLite backend's own."""

from __future__ import annotations

from helpers.ids import source
from helpers.store import query
from sidecar_proc import Sidecar
from test_doctor import doctor

from agent_sidecar.v1 import common_pb2 as c
from agent_sidecar.v1 import session_service_pb2 as spb


def seed(sc, key: str, *texts: str) -> str:
    sid = sc.sessions().GetSession(spb.GetSessionRequest(session_key=key), timeout=10).session.session_id
    sc.sessions().AppendMessages(spb.AppendMessagesRequest(
        session_id=sid, messages=[c.Message(role="user", content=t) for t in texts]), timeout=10)
    return sid


def new_session(sc) -> str:
    return sc.sessions().GetOrCreateSession(spb.GetOrCreateSessionRequest(source=source()),
                                            timeout=10).session.session_key


def hits(sc, q: str) -> list[str]:
    return sorted(h.snippet for h in sc.sessions().SearchMessages(
        spb.SearchMessagesRequest(query=q, limit=50), timeout=10).hits)


def indexed_up_to(sc) -> int:
    return query(sc, "SELECT value FROM meta WHERE key = 'fts_indexed_id'")[0][0]


def test_a_search_sees_every_message_written_before_it(tmp_path):
    with Sidecar(tmp_path / "data").start() as sc:
        key = new_session(sc)
        for i in range(5):  # no pause: the periodic indexer has not run in between
            seed(sc, key, f"walrus number{i}")
            assert len(hits(sc, "walrus")) == i + 1


def test_deleting_the_newest_messages_leaves_the_index_exact(tmp_path):
    data = tmp_path / "data"
    with Sidecar(data).start() as sc:
        keep, drop = new_session(sc), new_session(sc)
        seed(sc, keep, "alpha one")
        seed(sc, drop, "bravo two", "bravo three")  # the newest ids
        assert hits(sc, "bravo") == ["[bravo] three", "[bravo] two"]
        sc.sessions().DeleteSession(spb.DeleteSessionRequest(session_key=drop), timeout=10)
        assert hits(sc, "bravo") == []
        seed(sc, keep, "charlie four", "charlie five")  # SQLite reuses the freed ids
        assert hits(sc, "charlie") == ["[charlie] five", "[charlie] four"]
        assert hits(sc, "alpha") == ["[alpha] one"]
    if sc.backend == "sqlite":
        assert indexed_up_to(sc) == query(sc, "SELECT max(id) FROM messages")[0][0], \
            "a clean stop leaves every message indexed"
    r = doctor(data, env=sc.store_env())
    assert r.returncode == 0 and "full-text index: ok" in r.stdout, r.stdout + r.stderr


def test_messages_not_yet_indexed_survive_a_crash(tmp_path):
    data = tmp_path / "data"
    sc = Sidecar(data).start()
    key = new_session(sc)
    seed(sc, key, "kiwi before the crash")
    sc.kill9()  # within the indexer's second: the message may not be indexed yet
    with Sidecar(data).start() as again:
        assert hits(again, "kiwi") == ["[kiwi] before the crash"]
        seed(again, key, "kiwi after the crash")
        assert len(hits(again, "kiwi")) == 2
    r = doctor(data, env=sc.store_env())
    assert r.returncode == 0 and "full-text index: ok" in r.stdout, r.stdout + r.stderr


def test_clear_all_then_new_messages_are_searchable(tmp_path):
    with Sidecar(tmp_path / "data").start() as sc:
        seed(sc, new_session(sc), "mango old")
        sc.sessions().ClearAllSessions(spb.ClearAllSessionsRequest(confirm=_confirm()), timeout=10)
        assert hits(sc, "mango") == []
        seed(sc, new_session(sc), "mango new")
        assert hits(sc, "mango") == ["[mango] new"]


def _confirm() -> str:
    from agent_sidecar.api.session_service import CLEAR_ALL_CONFIRM
    return CLEAR_ALL_CONFIRM

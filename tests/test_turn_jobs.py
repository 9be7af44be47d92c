"""The turn's writer jobs (turns/jobs.py) run directly on a real SQLite store:
the interleavings that gRPC timing rarely produces."""

from __future__ import annotations

import time

import pytest

from agent_sidecar.errors import SidecarError
from agent_sidecar.sessions import lifecycle as life
from agent_sidecar.sessions.source import SessionSource
from agent_sidecar.store.db import open_writer
from agent_sidecar.store.migrations import migrate
from agent_sidecar.turns import jobs

KEY = "agent:main:telegram:dm:42"


def _flags(conn) -> tuple:
    return conn.execute("SELECT is_fresh_reset, resume_pending, resume_reason FROM routing"
                        " WHERE session_key = ?", (KEY,)).fetchone()


def test_a_turn_finishing_after_a_reset_leaves_the_new_incarnations_flags(tmp_path):
    """A turn of the old incarnation completes just after /new: the fresh-reset
    flag and a resume marker belong to the new incarnation and stay; the new
    incarnation's own completed turn clears them."""
    conn = open_writer(str(tmp_path / "s.db"))
    migrate(conn)
    with conn:
        old, _ = life.get_or_create(conn, KEY, SessionSource(platform="telegram", chat_id="42"), "main")
        new = life.reset(conn, KEY)
        life.mark_resume_pending(conn, KEY, "restart_interrupted")
    assert new.session_id != old.session_id
    assert _flags(conn) == (1, 1, "restart_interrupted")
    with conn:
        jobs.finish(conn, "r-old", KEY, old.session_id, "completed", "", 5, False, True, {})
    assert _flags(conn) == (1, 1, "restart_interrupted"), "another incarnation's turn cleared them"
    with conn:
        jobs.finish(conn, "r-new", KEY, new.session_id, "completed", "", 5, False, True, {})
    assert _flags(conn) == (0, 0, "")
    conn.close()


def test_restore_gives_a_lane_whose_continue_turn_is_queued_no_second_one(tmp_path):
    """A crash after a continue turn was accepted but before it started: the
    restore runs that turn in its place and plans no second continue turn for
    the lane, under either auto-resume rule that would pick it."""
    from agent_sidecar.recovery.startup import restore
    conn = open_writer(str(tmp_path / "s.db"))
    migrate(conn)
    with conn:
        entry, _ = life.get_or_create(conn, KEY, SessionSource(platform="telegram", chat_id="42"), "main")
        rid = f"resume:{entry.session_id}:1"
        jobs.accept(conn, (rid, KEY, "telegram", "main", 4, "the note", {"resume": "restart_interrupted"},
                           time.time()), None, 300.0, None, 0)
        life.mark_resume_pending(conn, KEY, "restart_interrupted")
    for mode in ("recent", "interrupted"):
        with conn:
            plan = restore(conn, False, 3600.0, mode)
        assert [q["rid"] for q in plan.queued] == [rid] and plan.resume == [], (mode, plan)
    conn.close()


def test_accept_refuses_a_request_id_of_another_session_before_writing(tmp_path):
    """The ledger's answer when the dedup index does not know an id: the same key is a twin
    (DuplicateRequest), another key INVALID_ARGUMENT on request_id, and nothing is written."""
    conn = open_writer(str(tmp_path / "s.db"))
    migrate(conn)
    other = "agent:main:discord:dm:7"

    def accept(key, platform):
        t = ("r1", key, platform, "main", 2, "hi", {"queue_position": 0}, time.time())
        with conn:
            return jobs.accept(conn, t, SessionSource(platform=platform, chat_id=key.rsplit(":", 1)[1]),
                               300.0, None, 1)
    accept(KEY, "telegram")
    with pytest.raises(jobs.DuplicateRequest):
        accept(KEY, "telegram")
    with pytest.raises(SidecarError) as e:
        accept(other, "discord")
    assert (e.value.reason, e.value.field) == ("INVALID_ARGUMENT", "request_id")
    assert KEY not in e.value.message
    assert conn.execute("SELECT count(*) FROM routing WHERE session_key = ?", (other,)).fetchone()[0] == 0
    assert conn.execute("SELECT session_key FROM prompts WHERE request_id = 'r1'").fetchall() == [(KEY,)]
    conn.close()


def _prompt(rid: str, text: str, at: float, absorb: list[str] | None = None) -> tuple:
    """``Turn.ledger_fields()`` of a follow-up (``absorb``: burst.candidates)."""
    payload = {"queue_position": 1, **({"absorb": absorb} if absorb else {})}
    return (rid, KEY, "telegram", "main", 2, text, payload, at)


def test_an_absorbing_accept_skips_a_refused_prompt_and_closes_the_open_one(tmp_path):
    """Burst collapse when the middle follow-up's own accept was refused: ``c``
    absorbed ``b``, which had absorbed ``a``; ``b`` never reached the ledger, so
    ``c``'s accept closes ``a`` (superseded by ``c``, with its terminal frame, in
    the same transaction) and links to it. The chain reads back oldest first."""
    conn = open_writer(str(tmp_path / "s.db"))
    migrate(conn)
    with conn:
        life.get_or_create(conn, KEY, SessionSource(platform="telegram", chat_id="42"), "main")
        jobs.accept(conn, _prompt("a", "first", 1.0), None, 300, "pending", 1)
    with conn:
        absorbed = jobs.accept(conn, _prompt("c", "third", 3.0, ["b", "a"]), None, 300, "pending", 2)[4]
    assert absorbed["link"] == "a" and absorbed["closed"][:2] == ("a", 2)
    assert conn.execute("SELECT status FROM prompts WHERE request_id = 'a'").fetchone() == ("superseded",)
    frames = conn.execute("SELECT seq, kind, body, id FROM frames WHERE request_id = 'a' ORDER BY seq").fetchall()
    assert [(s, k, b) for s, k, b, _ in frames] == [(1, "accepted", b'{"queue_position":1}'),
                                                    (2, "superseded", b'{"by_request_id":"c"}')]
    assert frames[1][3] == absorbed["closed"][4]
    assert conn.execute("SELECT count(*) FROM prompt_queue WHERE request_id = 'a'").fetchone() == (0,)
    with conn:
        absorbed = jobs.accept(conn, _prompt("d", "fourth", 4.0, ["c"]), None, 300, "pending", 3)[4]
    assert absorbed["link"] == "c"
    assert jobs.absorbed_texts(conn, "c") == [{"text": "first", "at": 1.0}, {"text": "third", "at": 3.0}]
    conn.close()

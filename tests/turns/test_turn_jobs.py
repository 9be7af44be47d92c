"""The turn's store jobs (turns/jobs.py, recovery/startup.py) run directly on
a real SQLite store through its unit of work: the interleavings that gRPC
timing rarely produces. Assertions read through the store interface."""

from __future__ import annotations

import time

import pytest
from helpers.store import local_store

from agent_sidecar.errors import SidecarError
from agent_sidecar.recovery.startup import absorbed_texts, restore
from agent_sidecar.sessions import lifecycle as life
from agent_sidecar.sessions.source import SessionSource
from agent_sidecar.turns import jobs

KEY = "agent:main:telegram:dm:42"
SOURCE = SessionSource(platform="telegram", chat_id="42")


def _flags(s) -> tuple:
    e = s.uow.routing.get(KEY)
    return e.is_fresh_reset, e.resume_pending, e.resume_reason


def _end(rid: str, sid: str) -> jobs.TurnEnd:
    return jobs.TurnEnd(rid, KEY, sid, "completed", "", 5, False, True, {})


def _prompt(rid: str, text: str, at: float, key: str = KEY, platform: str = "telegram",
            delivery: int = 2, payload: dict | None = None) -> jobs.PromptRecord:
    return jobs.PromptRecord(rid, key, platform, "main", delivery, text,
                             {"queue_position": 1, **(payload or {})}, at)


def _accept(s, prompt, source=None, slot=None, position=0):
    return s.job(jobs.accept, jobs.AcceptRequest(prompt, source, 300.0, slot, position, False))


def test_a_turn_finishing_after_a_reset_leaves_the_new_incarnations_flags(tmp_path):
    """A turn of the old incarnation completes just after /new: the fresh-reset
    flag and a resume marker belong to the new incarnation and stay; the new
    incarnation's own completed turn clears them."""
    with local_store(tmp_path / "s.db") as s:
        old, _ = s.job(life.get_or_create, KEY, SOURCE, "main")
        new = s.job(life.reset, KEY)
        s.job(life.mark_resume_pending, KEY, "restart_interrupted")
        assert new.session_id != old.session_id
        assert _flags(s) == (True, True, "restart_interrupted")
        s.job(jobs.finish, _end("r-old", old.session_id))
        assert _flags(s) == (True, True, "restart_interrupted"), "another incarnation's turn cleared them"
        s.job(jobs.finish, _end("r-new", new.session_id))
        assert _flags(s) == (False, False, "")


def test_restore_gives_a_lane_whose_continue_turn_is_queued_no_second_one(tmp_path):
    """A crash after a continue turn was accepted but before it started: the
    restore runs that turn in its place and plans no second continue turn for
    the lane, under either auto-resume rule that would pick it."""
    with local_store(tmp_path / "s.db") as s:
        entry, _ = s.job(life.get_or_create, KEY, SOURCE, "main")
        rid = f"resume:{entry.session_id}:1"
        _accept(s, _prompt(rid, "the note", time.time(), delivery=4,
                           payload={"resume": "restart_interrupted"}))
        s.job(life.mark_resume_pending, KEY, "restart_interrupted")
        for mode in ("recent", "interrupted"):
            plan = s.job(restore, False, 3600.0, mode)
            assert [q.entry.request_id for q in plan.queued] == [rid] and plan.resume == [], (mode, plan)


def test_accept_refuses_a_request_id_of_another_session_before_writing(tmp_path):
    """The ledger's answer when the dedup index does not know an id: the same key is a twin
    (DuplicateRequest), another key INVALID_ARGUMENT on request_id, and nothing is written."""
    other = "agent:main:discord:dm:7"
    with local_store(tmp_path / "s.db") as s:
        def accept(key, platform):
            src = SessionSource(platform=platform, chat_id=key.rsplit(":", 1)[1])
            return _accept(s, _prompt("r1", "hi", time.time(), key, platform), src)
        accept(KEY, "telegram")
        with pytest.raises(jobs.DuplicateRequest):
            accept(KEY, "telegram")
        with pytest.raises(SidecarError) as e:
            accept(other, "discord")
        assert (e.value.reason, e.value.field) == ("INVALID_ARGUMENT", "request_id")
        assert KEY not in e.value.message
        assert s.uow.routing.get(other) is None
        assert s.uow.ledger.get("r1").session_key == KEY


def test_a_request_id_past_the_window_whose_turn_is_still_open_is_not_forgotten(tmp_path):
    """An open turn accepted longer ago than the dedup window (queued behind
    long turns, or running long on another node): its id sent again was
    forgotten, the open row and its frames deleted under a turn that goes on.
    It is a twin for its own key and refused for another, as inside the window."""
    other = "agent:main:discord:dm:7"
    with local_store(tmp_path / "s.db") as s:
        def accept(key, platform, at):
            src = SessionSource(platform=platform, chat_id=key.rsplit(":", 1)[1])
            return _accept(s, _prompt("r1", "hi", at, key, platform), src)
        accept(KEY, "telegram", time.time() - 3600)  # an hour ago: past the 300 s window, still open
        assert s.uow.ledger.get("r1").open
        with pytest.raises(jobs.DuplicateRequest):
            accept(KEY, "telegram", time.time())
        with pytest.raises(SidecarError) as e:
            accept(other, "discord", time.time())
        assert (e.value.reason, e.value.field) == ("INVALID_ARGUMENT", "request_id")
        assert s.uow.ledger.get("r1").session_key == KEY and s.uow.ledger.get("r1").open


def test_an_absorbing_accept_skips_a_refused_prompt_and_closes_the_open_one(tmp_path):
    """Burst collapse when the middle follow-up's own accept was refused: ``c``
    absorbed ``b``, which had absorbed ``a``; ``b`` never reached the ledger, so
    ``c``'s accept closes ``a`` (superseded by ``c``, with its terminal frame, in
    the same transaction) and links to it. The chain reads back oldest first."""
    with local_store(tmp_path / "s.db") as s:
        s.job(life.get_or_create, KEY, SOURCE, "main")
        _accept(s, _prompt("a", "first", 1.0), slot="pending", position=1)
        absorbed = _accept(s, _prompt("c", "third", 3.0, payload={"absorb": ["b", "a"]}),
                           slot="pending", position=2).absorbed
        assert absorbed.link == "a" and (absorbed.closed.request_id, absorbed.closed.seq) == ("a", 2)
        assert s.uow.ledger.get("a").status == "superseded"
        frames = s.read("request_frames", "a", 0)
        assert [(f.seq, f.kind, f.body) for f in frames] == [(1, "accepted", {"queue_position": 1}),
                                                             (2, "superseded", {"by_request_id": "c"})]
        assert frames[1].cursor == absorbed.closed.cursor
        assert [q.entry.request_id for q in s.job(restore, True, 3600.0).queued] == ["c"]
        absorbed = _accept(s, _prompt("d", "fourth", 4.0, payload={"absorb": ["c"]}),
                           slot="pending", position=3).absorbed
        assert absorbed.link == "c"
        assert s.job(absorbed_texts, "c") == [{"text": "first", "at": 1.0}, {"text": "third", "at": 3.0}]

"""The resume filter: every frame exactly once, in order, across reconnects."""

import pytest
from _client_fakes import frame

from agent_sidecar_client import CursorFilter, SeqFilter, SequenceGap


def test_in_order_frames_pass_and_terminal_is_remembered():
    f = SeqFilter()
    assert [f.admit(frame(1, "accepted")), f.admit(frame(2, "started")), f.admit(frame(3))] == [True] * 3
    assert not f.done
    assert f.admit(frame(4, "completed"))
    assert f.done and f.terminal.seq == 4 and f.last_seq == 4


def test_duplicates_and_keepalives_are_dropped():
    f = SeqFilter()
    for s in (1, 2, 3):
        f.admit(frame(s))
    assert not f.admit(frame(3, "keepalive"))
    assert not f.admit(frame(2))  # replayed by a resume that overlapped
    assert not f.admit(frame(3))
    assert f.admit(frame(4)) and f.last_seq == 4


def test_gap_raises_and_does_not_advance():
    f = SeqFilter()
    f.admit(frame(1))
    with pytest.raises(SequenceGap) as info:
        f.admit(frame(3))
    assert (info.value.expected, info.value.got) == (2, 3)
    assert f.last_seq == 1
    assert f.admit(frame(2))


def test_resume_point_and_after_terminal():
    f = SeqFilter(after_seq=5)
    assert not f.admit(frame(5))
    assert f.admit(frame(6, "failed"))
    assert not f.admit(frame(7))  # nothing after the terminal frame
    assert f.resume_point == 6


def test_cursor_filter():
    f = CursorFilter()
    a, b, c = frame(1, request_id="a"), frame(1, request_id="b"), frame(2, request_id="a")
    a.cursor, b.cursor, c.cursor = 10, 11, 12
    assert f.admit(a) and f.admit(b)
    assert not f.admit(a)  # replayed after a reconnect
    assert f.admit(c) and f.resume_point == 12
    ka = frame(2, "keepalive")
    assert not f.admit(ka)


def test_a_watch_keepalive_cursor_is_the_resume_point():
    """A live watch's first keepalive carries the cursor it starts after: a
    drop before any frame resumes there, not "live" again (after_cursor 0)."""
    f = CursorFilter()
    head = frame(0, "keepalive")
    head.cursor = 40
    assert not f.admit(head) and f.resume_point == 40
    stale = frame(0, "keepalive")
    stale.cursor = 30
    assert not f.admit(stale) and f.resume_point == 40  # never backwards
    a = frame(1, request_id="a")
    a.cursor = 41
    assert f.admit(a) and f.resume_point == 41


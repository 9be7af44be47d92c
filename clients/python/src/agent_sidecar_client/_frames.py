"""Frame bookkeeping for resumable streams, kept free of gRPC so it is unit-testable.

Why: after a dropped connection the client resumes with
``WatchActivity(request_id, after_seq=last seen)``. The server is supposed to
replay exactly the missing frames, but a retry can race (a frame may arrive on
both the old and the new stream, or a reconnect may land on a replica of the
store that is a frame behind). The caller must still see every frame exactly
once and in order, so every frame passes through one of these filters before
it is yielded:

- ``SeqFilter`` (one request: Prompt, WatchActivity by request_id): admits
  ``seq == last + 1``, drops ``seq <= last`` (duplicates) and keepalives, and
  raises ``SequenceGap`` for ``seq > last + 1`` so the stream resumes from the
  last good seq instead of yielding a hole. It remembers the terminal frame.
- ``CursorFilter`` (WatchActivity by session_key or platform): frames of many
  requests interleave, so order is the global ``cursor``; it drops keepalives
  and frames at or below the last cursor seen.
"""

from __future__ import annotations

from typing import Any

TERMINAL_KINDS = frozenset({"completed", "failed", "superseded"})


def frame_kind(frame: Any) -> str:
    """The name of the set ``event`` oneof field ('' when none is set)."""
    return frame.WhichOneof("event") or ""


class SequenceGap(Exception):
    """A frame skipped ahead of the next expected seq."""

    def __init__(self, expected: int, got: int) -> None:
        super().__init__(f"frame seq gap: expected {expected}, got {got}")
        self.expected = expected
        self.got = got


class SeqFilter:
    """Gap/duplicate filter for the frames of one request (seq from 1, gapless)."""

    def __init__(self, after_seq: int = 0) -> None:
        self.last_seq = after_seq
        self.terminal: Any = None

    @property
    def done(self) -> bool:
        return self.terminal is not None

    @property
    def resume_point(self) -> int:
        return self.last_seq

    def admit(self, frame: Any) -> bool:
        """True when ``frame`` is the next one to hand to the caller.

        Raises SequenceGap when frames are missing in between.
        """
        kind = frame_kind(frame)
        if kind == "keepalive" or self.terminal is not None:
            return False
        if frame.seq <= self.last_seq:
            return False
        if frame.seq != self.last_seq + 1:
            raise SequenceGap(self.last_seq + 1, frame.seq)
        self.last_seq = frame.seq
        if kind in TERMINAL_KINDS:
            self.terminal = frame
        return True


class CursorFilter:
    """Duplicate filter for a session or platform watch, ordered by cursor."""

    terminal = None
    done = False

    def __init__(self, after_cursor: int = 0) -> None:
        self.last_cursor = after_cursor

    @property
    def resume_point(self) -> int:
        return self.last_cursor

    def admit(self, frame: Any) -> bool:
        if frame_kind(frame) == "keepalive":
            # A watch's keepalive carries the cursor it has reached (a live
            # watch's first, the head it starts after): resume from there.
            self.last_cursor = max(self.last_cursor, frame.cursor)
            return False
        if frame.cursor:
            if frame.cursor <= self.last_cursor:
                return False
            self.last_cursor = frame.cursor
        return True

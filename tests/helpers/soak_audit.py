"""What a chaos soak (helpers/chaos.py) checks once it is over, read back
through gRPC and, for what the API does not show, the storage interface
(helpers/store.py ``StoreView``):

* every acknowledged request's frames: from seq 1 without a gap, exactly one
  terminal frame, at most one ``started``;
* no two turns of one lane ran at once: by their ``started`` and terminal
  frames, the acknowledged requests' and the auto-resume turns' alike (a
  continue turn is nobody's acknowledged request, yet it runs in the lane);
* no two turns of one lane interleave in its transcript: in every
  incarnation, the live rows each turn wrote (read by request id) come in
  one run, whoever ran the turns, on whichever node; this sees an overlap
  that the frames' times may not (a turn that went on writing after its
  lane moved on);
* every tool call in a tool lane's transcript has its result right after it.

Each check hands what it finds to ``soak._violation``."""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING

from agent_sidecar.v1 import prompt_service_pb2_grpc as ppb_grpc
from agent_sidecar.v1 import session_service_pb2_grpc as spb_grpc

from .sessions import transcript
from .store import StoreView
from .streams import TERMINAL, kind_of, watch
from .tools import call_ids, tool_calls_answered, unanswered_calls

if TYPE_CHECKING:
    from .chaos import Soak

CALL_TIMEOUT = 20
RESUME_PREFIX = "resume:"  # the auto-resume turns' request ids (recovery/startup.py)


def audit(soak: Soak) -> None:
    """Every check, in turn."""
    view = StoreView(soak.nodes[0])
    resumed = view.request_ids(RESUME_PREFIX)
    soak.report.resumed = len(resumed)
    started = check_ends(soak, resumed)
    check_turns_apart(soak, view, started)
    check_tool_calls_answered(soak)


def check_ends(soak: Soak, resumed: list[str]) -> list[str]:
    """Every acknowledged request's frames and the auto-resume turns', read
    back through one node; no two turns of a lane overlap in time. Returns
    the request ids of the turns that started."""
    reader = ppb_grpc.PromptServiceStub(soak.channels[0])
    deadline = time.monotonic() + 120
    lanes = {soak._key(lane): lane for lane in range(len(soak.sources))}
    turns: dict[int, list[tuple[float, float, str]]] = {}
    for request_id, lane in [*soak.acked.items(), *((r, None) for r in resumed)]:
        frames = _frames_to_end(reader, request_id, deadline)
        if lane is None:  # a continue turn: its lane by its key
            lane = next((lanes[f.session_key] for f in frames if f.session_key in lanes), None)
            if lane is None:
                continue
        _check_frames(soak, request_id, frames, turns.setdefault(lane, []), counted=request_id in soak.acked)
        soak.sessions.update((f.session_id, f.session_key) for f in frames if f.session_id)
    for lane_turns in turns.values():
        lane_turns.sort()
        for (_, end, first), (start, _, second) in zip(lane_turns, lane_turns[1:]):
            if end > start:
                soak._violation(f"{first} and {second} ran at once on one lane ({end - start:.3f} s)")
    return [rid for lane_turns in turns.values() for _, _, rid in lane_turns]


def _frames_to_end(reader, request_id: str, deadline: float) -> list:
    while True:
        frames = watch(reader, request_id=request_id, timeout=CALL_TIMEOUT).frames
        if any(kind_of(f) in TERMINAL for f in frames) or time.monotonic() > deadline:
            return frames
        time.sleep(0.5)


def _check_frames(soak: Soak, request_id: str, frames: list, lane_turns: list, counted: bool) -> None:
    kinds = [kind_of(f) for f in frames]
    ends = [f for f in frames if kind_of(f) in TERMINAL]
    if [f.seq for f in frames] != list(range(1, len(frames) + 1)) or len(ends) != 1 \
            or kinds.count("started") > 1:
        soak._violation(f"{request_id}: frames {kinds} seqs {[f.seq for f in frames]}")
        return
    end = ends[0]
    if counted:
        with soak.lock:
            soak.report.ends[f"failed/{end.failed.reason}" if kind_of(end) == "failed" else kind_of(end)] += 1
    started = [f for f in frames if kind_of(f) == "started"]
    if started:
        lane_turns.append((started[0].at.ToNanoseconds() / 1e9, end.at.ToNanoseconds() / 1e9, request_id))


def check_turns_apart(soak: Soak, view: StoreView, request_ids: list[str]) -> None:
    """In each incarnation, the live rows of each turn in one run: a turn's
    rows with another turn's between them mean the two wrote at once."""
    rows = view.turns_rows(request_ids)
    by_session: dict[str, list[tuple[int, str]]] = {}
    for rid, (session_id, messages) in rows.items():
        by_session.setdefault(session_id, []).extend((m.seq, rid) for m in messages if m.active)
    for session_id, seqs in sorted(by_session.items()):
        seqs.sort()
        runs = [rid for i, (_, rid) in enumerate(seqs) if i == 0 or seqs[i - 1][1] != rid]
        split = sorted(rid for rid, n in Counter(runs).items() if n > 1)
        if split:
            soak._violation(f"session {session_id} of {soak.sessions.get(session_id, '?')}: turns"
                            f" interleaved in its transcript ({', '.join(split)}):"
                            f" {_around(seqs, set(split))}")


def _around(seqs: list[tuple[int, str]], split: set[str]) -> str:
    """The rows from the first of a split turn's to its last, as "seq request_id"."""
    at = [i for i, (_, rid) in enumerate(seqs) if rid in split]
    return "[" + ", ".join(f"{seq} {rid}" for seq, rid in seqs[at[0]:at[-1] + 1]) + "]"


def check_tool_calls_answered(soak: Soak) -> None:
    """Every tool call in the tool lanes' transcripts has its result right
    after it (a turn cut off mid-call got a synthetic one): what the next
    model call needs."""
    sessions = spb_grpc.SessionServiceStub(soak.channels[0])
    tool_keys = {soak._key(lane) for lane in range(len(soak.sources)) if soak._profile(lane) == "tools"}
    for session_id, key in sorted(soak.sessions.items()):
        if key not in tool_keys:
            continue
        messages = transcript(sessions, session_id)
        soak.report.tool_calls += len(tool_calls_answered(messages)[0])
        unanswered = unanswered_calls(messages)
        if unanswered:
            soak._violation(f"session {session_id} of {key}: tool calls without a result {unanswered}"
                            f" in {shape(messages)}")


def shape(messages) -> str:
    """A transcript in brief: seq, role, and the tool call ids of each message."""
    def one(m) -> str:
        ids = call_ids(m) + ([m.tool_call_id] if m.tool_call_id else [])
        return f"{m.seq} {m.role}" + "".join(f" {x}" for x in ids)
    return "[" + ", ".join(one(m) for m in messages) + "]"

"""Transcripts' rules (seed 000, seed 001 §3): append-only message rows per
incarnation; rewind, rewrite and rollback never delete: they hide rows (the
store keeps why), so the audit trail stays and ``include_rewound`` can show it.
Every function taking ``uow`` is a store job.

A ``synthetic`` message is one nobody wrote: the sidecar's own note (the
continue note of an auto-resume turn) stored with the role the model must read
it in. It reaches clients as ``Message.synthetic``, so an adapter never shows
the note as something its user said.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from ..errors import SidecarError, excerpt, invalid
from ..store import UnitOfWork, batched
from ..store.records import Append, Message

__all__ = ["ROLES", "Message", "append", "append_messages", "check_answers", "from_model",
           "hide_request", "open_calls", "rewind", "rewrite"]

ROLES = ("system", "user", "assistant", "tool")


def _require(uow: UnitOfWork, session_id: str) -> None:
    if uow.incarnations.get(session_id) is None:
        raise SidecarError("SESSION_NOT_FOUND", f"no such session id: {session_id}")


def _call_ids(m: Message) -> set[str]:
    """The ids of an assistant message's tool calls (none for any other)."""
    if m.role != "assistant" or not m.tool_calls_json:
        return set()
    calls = orjson.loads(m.tool_calls_json)
    return {c["id"] for c in calls if isinstance(c, dict) and isinstance(c.get("id"), str)}


def check_answers(messages: Iterable[Message], opened: Iterable[str] = (),
                  field: str = "messages", turns: bool = False) -> set[str]:
    """Tool calls and their results stay together, as a model backend
    requires: every "tool" message answers a call of the last non-tool
    message before it (an assistant message with a call of that id) that no
    tool message answered already; and no other message comes while calls
    of that message are still unanswered. ``opened``: the calls still open
    where ``messages`` go (``open_calls``; a running turn's call waiting on
    its tool host is one); ``turns``: they are a running turn's, which its
    tool host answers, so no message may. Returns the calls open after them. An
    OpenAI-compatible backend refuses a transcript breaking either rule, so
    every later turn of the session would fail: the message is refused
    INVALID_ARGUMENT naming it."""
    pending, theirs = set(opened), turns
    for i, m in enumerate(messages):
        if m.role != "tool":
            if pending:
                raise invalid(f"{field}[{i}]", f"comes before the results of tool calls"
                              f" {excerpt(', '.join(sorted(pending)))} of the assistant message before it;"
                              " their tool messages must come first (a model backend refuses any other order)")
            pending, theirs = _call_ids(m), False
        elif m.tool_call_id in pending and theirs:
            raise invalid(f"{field}[{i}].tool_call_id", f"{excerpt(m.tool_call_id)} is a call of the turn"
                          " running in this session: its tool host answers it")
        elif m.tool_call_id in pending:
            pending.discard(m.tool_call_id)
        elif not m.tool_call_id:
            raise invalid(f"{field}[{i}].tool_call_id",
                          "is required on a tool message: the id of the assistant tool call it answers")
        else:
            raise invalid(f"{field}[{i}].tool_call_id",
                          f"{excerpt(m.tool_call_id)} answers no open tool call of the assistant"
                          " message before it (a model backend refuses such a transcript)")
    return pending


def open_calls(uow: UnitOfWork, session_id: str) -> set[str]:
    """The tool calls of the live transcript's last message that no tool
    message after it answers: what a tool message appended next may answer,
    and what must be answered before any other message is. Read under the
    incarnation's lock (``MessageRepo.lock``, which the caller may have taken
    already), held to the commit: another sidecar's writer checking an
    append to it at the same moment reads it after this job's append, so two
    answers to one call cannot both pass."""
    uow.messages.lock([session_id])
    pending: set[str] = set()
    for m in uow.messages.tail(session_id):
        pending = _call_ids(m) if m.role != "tool" else pending - {m.tool_call_id}
    return pending


def check_appended(uow: UnitOfWork, session_id: str, messages: list[Message],
                   opened: set[str] | None = None) -> set[str]:
    """``check_answers`` for messages appended to a live transcript, whose
    open calls are ``opened`` when the caller knows them, else read (with
    whether a running turn made them: the message it wrote last is its, and
    the ledger says it runs). Returns the calls open after them."""
    turns = False
    if opened is None:
        opened = open_calls(uow, session_id) if messages else set()
        rid = uow.messages.tail_request(session_id) if opened else None
        entry = uow.ledger.get(rid) if rid else None
        turns = entry is not None and entry.status == "running"
    return check_answers(messages, opened, turns=turns)


def append(uow: UnitOfWork, session_id: str, messages: Iterable[Message],
           request_id: str | None = None) -> tuple[int, int]:
    """Append rows with the next seqs; returns (first_seq, last_seq)."""
    result = uow.messages.append([Append(session_id, tuple(messages), request_id)])[0]
    if isinstance(result, BaseException):
        raise result
    return result[0], result[1]


def _append_messages_many(uow: UnitOfWork, calls: list[tuple]) -> list:
    """Many AppendMessages calls as one append: one executemany for all.
    Each call is checked (``check_answers``) against the transcript as the
    calls before it in the batch leave it; a refused call writes nothing."""
    opened: dict[str, set[str]] = {}  # session id -> calls open after the batch's calls so far
    refused: dict[int, BaseException] = {}
    uow.messages.lock(sorted({sid for sid, _ in calls}))  # all at once, in order: no deadlock with another writer's
    items = []
    for n, (sid, msgs) in enumerate(calls):
        try:
            opened[sid] = check_appended(uow, sid, msgs, opened.get(sid))
        except SidecarError as e:
            refused[n] = e
            continue
        items.append(Append(sid, tuple(msgs)))
    results = iter(uow.messages.append(items) if items else ())
    return [refused[n] if n in refused else _seqs(next(results)) for n in range(len(calls))]


def _seqs(r: Any) -> Any:
    return r if isinstance(r, BaseException) else (r[0], r[1])


@batched(_append_messages_many)
def append_messages(uow: UnitOfWork, session_id: str, messages: list[Message]) -> tuple[int, int]:
    """AppendMessages: concurrent callers' appends share one statement; a
    tool message must answer an open call (``check_answers``)."""
    result = _append_messages_many(uow, [(session_id, messages)])[0]
    if isinstance(result, BaseException):
        raise result
    return result


def rewrite(uow: UnitOfWork, session_id: str, messages: list[Message]) -> None:
    """Full replacement: hide every live row (kept as audit trail), append the
    new, whose tool messages must answer calls among them (``check_answers``)."""
    check_answers(messages)
    _require(uow, session_id)
    uow.messages.lock([session_id])  # an append checked on another node commits before this hides, or after
    uow.messages.hide_live(session_id, "rewrite")
    uow.incarnations.bump_rev(session_id)
    append(uow, session_id, messages)


def rewind(uow: UnitOfWork, session_id: str, n: int, taken: Iterable[str] = ()) -> dict[str, Any]:
    """Back up ``n`` user turns by soft delete: the n-th last live user message
    and everything after it become inactive. ``taken``: request ids of turns the
    lane already took back (turns/undo.py): what they wrote is hidden first, so
    it is neither counted nor left behind."""
    _require(uow, session_id)
    uow.messages.lock([session_id])  # as rewrite: no append checked elsewhere lands between the hides
    hidden = sum(uow.messages.hide_request(session_id, rid, "rewind") for rid in taken)
    users = uow.messages.last_user(session_id, n) if n > 0 else []
    count = 0
    if users:
        count = uow.messages.hide_from(session_id, users[-1][0], "rewind")
    if hidden or count:
        uow.incarnations.bump_rev(session_id)
    return {"rewound_count": hidden + count, "turns_undone": len(users),
            "target_text": users[-1][1] if users else ""}


def hide_request(uow: UnitOfWork, session_id: str, request_id: str, reason: str = "rollback") -> int:
    """ROLLBACK delivery: soft-delete what one turn wrote."""
    n = uow.messages.hide_request(session_id, request_id, reason)
    uow.incarnations.bump_rev(session_id)
    return n


def from_model(msg: dict[str, Any]) -> Message:
    """The agent loop's OpenAI-shaped message as a transcript row."""
    calls = msg.get("tool_calls")
    return Message(role=msg["role"], content=msg.get("content") or "",
                   tool_call_id=msg.get("tool_call_id", ""), tool_name=msg.get("name", ""),
                   tool_calls_json=orjson.dumps(calls).decode() if calls else "")

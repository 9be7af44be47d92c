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

from ..errors import SidecarError
from ..store import UnitOfWork, batched
from ..store.records import Append, Message

__all__ = ["ROLES", "Message", "append", "append_messages", "from_model", "hide_request",
           "rewind", "rewrite"]

ROLES = ("system", "user", "assistant", "tool")


def _require(uow: UnitOfWork, session_id: str) -> None:
    if uow.incarnations.get(session_id) is None:
        raise SidecarError("SESSION_NOT_FOUND", f"no such session id: {session_id}")


def append(uow: UnitOfWork, session_id: str, messages: Iterable[Message],
           request_id: str | None = None) -> tuple[int, int]:
    """Append rows with the next seqs; returns (first_seq, last_seq)."""
    result = uow.messages.append([Append(session_id, tuple(messages), request_id)])[0]
    if isinstance(result, BaseException):
        raise result
    return result[0], result[1]


def _append_messages_many(uow: UnitOfWork, calls: list[tuple]) -> list:
    """Many AppendMessages calls as one append: one executemany for all."""
    results = uow.messages.append([Append(sid, tuple(msgs)) for sid, msgs in calls])
    return [r if isinstance(r, BaseException) else (r[0], r[1]) for r in results]


@batched(_append_messages_many)
def append_messages(uow: UnitOfWork, session_id: str, messages: list[Message]) -> tuple[int, int]:
    """AppendMessages: concurrent callers' appends share one statement."""
    return append(uow, session_id, messages)


def rewrite(uow: UnitOfWork, session_id: str, messages: list[Message]) -> None:
    """Full replacement: hide every live row (kept as audit trail), append the new."""
    _require(uow, session_id)
    uow.messages.hide_live(session_id, "rewrite")
    uow.incarnations.bump_rev(session_id)
    append(uow, session_id, messages)


def rewind(uow: UnitOfWork, session_id: str, n: int, taken: Iterable[str] = ()) -> dict[str, Any]:
    """Back up ``n`` user turns by soft delete: the n-th last live user message
    and everything after it become inactive. ``taken``: request ids of turns the
    lane already took back (turns/undo.py): what they wrote is hidden first, so
    it is neither counted nor left behind."""
    _require(uow, session_id)
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

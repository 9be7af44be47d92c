"""Rows to records and back: the SQLite backend's one place for column lists
and payload encodings (orjson blobs for dicts, 0/1 for booleans)."""

from __future__ import annotations

from typing import Any

import orjson

from ..records import (
    ROUTING_FIELDS,
    FrameRecord,
    LedgerEntry,
    Message,
    SessionEntry,
)

_BOOLS = frozenset({"was_auto_reset", "reset_had_activity", "is_fresh_reset", "expiry_finalized",
                    "suspended", "resume_pending", "running"})
_ORIGIN = ROUTING_FIELDS.index("origin")

def entry(row: tuple) -> SessionEntry:
    values = dict(zip(ROUTING_FIELDS, row))
    values["turn_count"] = row[len(ROUTING_FIELDS)]
    origin = row[_ORIGIN]
    values["origin"] = orjson.loads(origin) if origin else None
    for b in _BOOLS:
        values[b] = bool(values[b])
    return SessionEntry(**values)


def column_value(name: str, value: Any) -> Any:
    """A record field as its column holds it."""
    if name == "origin":
        return orjson.dumps(value) if value else None
    if name in _BOOLS:
        return int(bool(value))
    return value


# -- messages -----------------------------------------------------------------------------

MESSAGE_SELECT = "SELECT seq, role, content, extra, created_at, active FROM messages"


def message_extra(m: Message) -> bytes | None:
    """The tool fields and the synthetic flag: one blob, only when set."""
    d = {k: v for k, v in (("tool_call_id", m.tool_call_id), ("tool_name", m.tool_name),
                           ("tool_calls_json", m.tool_calls_json),
                           ("synthetic", m.synthetic)) if v}
    return orjson.dumps(d) if d else None


def message(row: tuple) -> Message:
    seq, role, content, extra, created_at, active = row
    m = Message(role=role, content=content, created_at=created_at, seq=seq, active=bool(active))
    if extra:
        d = orjson.loads(extra)
        m.tool_call_id = d.get("tool_call_id", "")
        m.tool_name = d.get("tool_name", "")
        m.tool_calls_json = d.get("tool_calls_json", "")
        m.synthetic = bool(d.get("synthetic", False))
    return m


def model_message(role: str, content: str, extra: bytes | None) -> dict[str, Any]:
    """A row straight into the model's chat shape (no Message in between: this
    runs for every message of a transcript a worker rebuilds)."""
    m: dict[str, Any] = {"role": role, "content": content}
    if extra:
        d = orjson.loads(extra)
        if d.get("tool_calls_json"):
            m["tool_calls"] = orjson.loads(d["tool_calls_json"])
        if d.get("tool_call_id"):
            m["tool_call_id"] = d["tool_call_id"]
        if d.get("tool_name"):
            m["name"] = d["tool_name"]
    return m


# -- frames and the ledger ----------------------------------------------------------------------

# A frame row's columns in the order ``frame`` reads them.
FRAME_COLUMNS = ("id", "request_id", "seq", "session_key", "session_id", "platform", "at", "kind", "body")
FRAME_SELECT = f"SELECT {', '.join(FRAME_COLUMNS)} FROM frames"


def frame(row: tuple) -> FrameRecord:
    cursor, rid, seq, key, sid, platform, at, kind, body = row
    return FrameRecord(cursor, rid, seq, key, sid, platform, at, kind,
                       orjson.loads(body) if body else {})


LEDGER_COLUMNS = ("request_id", "session_key", "session_id", "platform", "status", "delivery",
                  "text", "payload", "created_at", "started_at", "finished_at", "reason",
                  "last_seq", "first_frame", "first_seq")
LEDGER_SELECT = "SELECT " + ", ".join(LEDGER_COLUMNS) + " FROM prompts"


def ledger(row: tuple) -> LedgerEntry:
    values = dict(zip(LEDGER_COLUMNS, row))
    values["payload"] = orjson.loads(values["payload"]) if values["payload"] else {}
    return LedgerEntry(**values)

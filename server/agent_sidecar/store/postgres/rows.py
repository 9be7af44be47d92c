"""Rows to records and back for PostgreSQL: column lists and conversions
(jsonb columns arrive as dicts through orjson, booleans as booleans)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from psycopg.types.json import Jsonb

from ..records import ROUTING_FIELDS, FrameRecord, LedgerEntry, Message, SessionEntry
from ..statements import one


def sender(conn: Any) -> Callable[..., Any]:
    """``send(sql, params)`` for a statement whose answer nobody reads: one
    cursor kept for them, its adapters looked up once (a cursor per statement,
    as ``conn.execute`` makes, costs more than some statements). Never for a
    statement whose rows are read: in the writer's pipeline a cursor shows the
    answer of the last of its statements to arrive, so each read takes a
    cursor of its own (``conn.execute``)."""
    return conn.cursor().execute


def count(conn: Any, sql: str, params: Any) -> int:
    """How many rows an UPDATE or DELETE (``sql``) touched, as a row of its
    own: in the writer's pipeline a cursor's rowcount is not known until the
    statement's answer arrived, and a fetch is what waits for it."""
    return one(conn.execute(f"WITH touched AS ({sql} RETURNING 1) SELECT count(*) FROM touched",
                            params).fetchone())[0]


def entry(row: tuple) -> SessionEntry:
    values = dict(zip(ROUTING_FIELDS, row))
    values["turn_count"] = row[len(ROUTING_FIELDS)]
    return SessionEntry(**values)


def column_value(name: str, value: Any) -> Any:
    if name == "origin":
        return Jsonb(value) if value else None
    return value


MESSAGE_SELECT = "SELECT seq, role, content, extra, created_at, active FROM messages"


def message_extra(m: Message) -> dict[str, Any] | None:
    """A message's optional fields (its ``extra`` column), None when it has none."""
    d = {k: v for k, v in (("tool_call_id", m.tool_call_id), ("tool_name", m.tool_name),
                           ("tool_calls_json", m.tool_calls_json),
                           ("synthetic", m.synthetic)) if v}
    return d or None


def message(row: tuple) -> Message:
    seq, role, content, extra, created_at, active = row
    m = Message(role=role, content=content, created_at=created_at, seq=seq, active=active)
    if extra:
        m.tool_call_id = extra.get("tool_call_id", "")
        m.tool_name = extra.get("tool_name", "")
        m.tool_calls_json = extra.get("tool_calls_json", "")
        m.synthetic = bool(extra.get("synthetic", False))
    return m


def model_message(role: str, content: str, extra: dict | None) -> dict[str, Any]:
    m: dict[str, Any] = {"role": role, "content": content}
    if extra:
        if extra.get("tool_calls_json"):
            m["tool_calls"] = orjson.loads(extra["tool_calls_json"])
        if extra.get("tool_call_id"):
            m["tool_call_id"] = extra["tool_call_id"]
        if extra.get("tool_name"):
            m["name"] = extra["tool_name"]
    return m


FRAME_COLS = "id, request_id, seq, session_key, session_id, platform, at, kind, body"


def frame(row: tuple) -> FrameRecord:
    cursor, rid, seq, key, sid, platform, at, kind, body = row
    return FrameRecord(cursor, rid, seq, key, sid, platform, at, kind, body or {})


LEDGER_COLUMNS = ("request_id", "session_key", "session_id", "platform", "status", "delivery",
                  "text", "payload", "created_at", "started_at", "finished_at", "reason",
                  "last_seq", "first_frame", "first_seq")
LEDGER_SELECT = "SELECT " + ", ".join(LEDGER_COLUMNS) + " FROM prompts"


def ledger(row: tuple) -> LedgerEntry:
    values = dict(zip(LEDGER_COLUMNS, row))
    values["payload"] = values["payload"] or {}
    return LedgerEntry(**values)

"""Conversions between protobuf messages and the domain types, plus validation
of everything a request may carry (INVALID_ARGUMENT naming the field)."""

from __future__ import annotations

import base64
import math
from typing import Any

import orjson
from google.protobuf.timestamp_pb2 import Timestamp

from ..config import Config
from ..errors import excerpt, invalid
from ..sessions.entry import SessionEntry, origin_of
from ..sessions.keys import canonical_session_key, split_session_key
from ..sessions.source import CHAT_TYPES, SessionSource
from ..sessions.transcripts import ROLES, Message
from ..v1 import common_pb2 as c
from .caps import KEY_FACTOR

_SOURCE_FIELDS = [f.name for f in c.SessionSource.DESCRIPTOR.fields]


# The range a Timestamp can hold (0001-01-01 .. 9999-12-31T23:59:59.999999999Z).
# A time stored as a float may round just past an end of it.
_MIN_NS, _MAX_NS = -62135596800 * 10**9, 253402300799 * 10**9 + 999999999


def ts(t: float | None) -> Timestamp | None:
    if not t:
        return None
    out = Timestamp()
    out.FromNanoseconds(min(max(int(t * 1e9), _MIN_NS), _MAX_NS))
    return out


def source_from_proto(p: c.SessionSource, cfg: Config, field: str = "source") -> SessionSource:
    if not p.platform:
        raise invalid(f"{field}.platform", "is required")
    limit = cfg.limits.max_id_length
    for name in _SOURCE_FIELDS:
        v = getattr(p, name)
        if isinstance(v, str) and len(v) > limit and name not in ("chat_topic", "chat_name"):
            raise invalid(f"{field}.{name}", f"longer than {limit} characters")
        if isinstance(v, str) and len(v) > 4096:
            raise invalid(f"{field}.{name}", "longer than 4096 characters")
    if p.chat_type and p.chat_type not in CHAT_TYPES:
        raise invalid(f"{field}.chat_type", f"must be one of {', '.join(CHAT_TYPES)}")
    values = {name: getattr(p, name) for name in _SOURCE_FIELDS}
    values["platform"] = p.platform.lower()  # platform names are case-insensitive (sessions/keys.py)
    if len(values["platform"]) > limit:  # "İ" lowers to two characters: the name returned must fit
        raise invalid(f"{field}.platform", f"longer than {limit} characters in lower case")
    return SessionSource(**values)


def source_to_proto(s: SessionSource | None) -> c.SessionSource | None:
    if s is None:
        return None
    return c.SessionSource(**{name: getattr(s, name) for name in _SOURCE_FIELDS})


def entry_to_proto(e: SessionEntry, queue_depth: int = 0) -> c.Session:
    return c.Session(
        session_key=e.session_key, session_id=e.session_id,
        created_at=ts(e.created_at), updated_at=ts(e.updated_at),
        origin=source_to_proto(origin_of(e) if e.origin else None), display_name=e.display_name,
        platform=e.platform, chat_type=e.chat_type,
        input_tokens=e.input_tokens, output_tokens=e.output_tokens,
        cache_read_tokens=e.cache_read_tokens, cache_write_tokens=e.cache_write_tokens,
        total_tokens=e.total_tokens, estimated_cost_usd=e.estimated_cost_usd,
        cost_status=e.cost_status, last_prompt_tokens=e.last_prompt_tokens,
        was_auto_reset=e.was_auto_reset, auto_reset_reason=e.auto_reset_reason,
        reset_had_activity=e.reset_had_activity, is_fresh_reset=e.is_fresh_reset,
        expiry_finalized=e.expiry_finalized, suspended=e.suspended,
        resume_pending=e.resume_pending, resume_reason=e.resume_reason,
        last_resume_marked_at=ts(e.last_resume_marked_at),
        state=c.SESSION_STATE_RUNNING if e.running else c.SESSION_STATE_IDLE,
        turn_count=e.turn_count, queue_depth=queue_depth, profile=e.profile,
    )


def check_size(value: str, field: str, limit: int) -> str:
    if len(value.encode()) > limit:
        raise invalid(field, f"larger than {limit} bytes")
    return value


# How deep a JSON value a request carries (a tool's parameter schema, a
# message's tool calls) may nest. Such a value goes on to the workers and the
# model inside messages of their own, and orjson writes no value nested past
# 254 levels: a deeper one would be taken here and then fail every turn that
# sends it. Real schemas and tool calls nest a few levels.
MAX_JSON_DEPTH = 64


def check_json_depth(value: Any, field: str) -> None:
    """Refuse (INVALID_ARGUMENT naming ``field``) a parsed JSON value nested
    deeper than MAX_JSON_DEPTH arrays and objects; walked without recursion."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            if depth > MAX_JSON_DEPTH:
                raise invalid(field, f"nests deeper than {MAX_JSON_DEPTH} levels of arrays and objects")
            stack.extend((x, depth + 1) for x in (item.values() if isinstance(item, dict) else item))


def check_tool_calls(role: str, text: str, field: str) -> None:
    """An assistant message's OpenAI-style tool calls, as every later turn
    sends them to its model: a list of ``{"id", "type": "function",
    "function": {"name", "arguments"}}`` with string id, name and arguments.
    Refused here, not taken: a malformed one would fail each later turn of
    the session until the transcript were rewritten."""
    if role != "assistant":
        raise invalid(field, "is only for assistant messages")
    try:
        calls = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise invalid(field, "is not valid JSON") from None
    if not isinstance(calls, list):
        raise invalid(field, "must be a JSON array")
    check_json_depth(calls, field)
    for n, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(call, dict) or not isinstance(call.get("id"), str) or not call["id"] \
                or call.get("type", "function") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str) or not fn["name"] \
                or not isinstance(fn.get("arguments"), str):
            raise invalid(field, f"item {n} must be {{\"id\": text, \"type\": \"function\","
                                 f" \"function\": {{\"name\": text, \"arguments\": JSON text}}}}")


def messages_from_proto(msgs, cfg: Config, field: str = "messages") -> list[Message]:
    if len(msgs) > cfg.limits.max_messages_per_request:
        raise invalid(field, f"more than {cfg.limits.max_messages_per_request} messages")
    out = []
    lim = cfg.limits
    for i, m in enumerate(msgs):
        if m.role not in ROLES:
            raise invalid(f"{field}[{i}].role", f"must be one of {', '.join(ROLES)}")
        check_size(m.content, f"{field}[{i}].content", lim.max_text_bytes)
        check_size(m.tool_calls_json, f"{field}[{i}].tool_calls_json", lim.max_text_bytes)
        if m.tool_calls_json:
            check_tool_calls(m.role, m.tool_calls_json, f"{field}[{i}].tool_calls_json")
        try:
            created = m.created_at.ToNanoseconds() / 1e9 if m.HasField("created_at") else 0.0
        except ValueError:
            raise invalid(f"{field}[{i}].created_at", "is outside the valid timestamp range") from None
        out.append(Message(role=m.role, content=m.content, tool_call_id=m.tool_call_id,
                           tool_name=m.tool_name, tool_calls_json=m.tool_calls_json,
                           created_at=created, synthetic=m.synthetic))
    return out


def message_to_proto(m: Message) -> c.Message:
    return c.Message(role=m.role, content=m.content, tool_call_id=m.tool_call_id,
                     tool_name=m.tool_name, tool_calls_json=m.tool_calls_json,
                     created_at=ts(m.created_at), seq=m.seq, active=m.active,
                     synthetic=m.synthetic)


# -- paging (AIP-158): opaque tokens, validated on the way back in ------------

def encode_page_token(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(data)).decode().rstrip("=")


def decode_page_token(token: str, kind: str, fields: dict[str, type | tuple]) -> dict[str, Any] | None:
    """Decode and type-check a token; ``fields`` maps each key to its type(s)."""
    if not token:
        return None
    try:
        data = orjson.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        if not isinstance(data, dict) or data.get("k") != kind:
            raise ValueError
        for name, kinds in fields.items():
            v = data.get(name)
            if not isinstance(v, kinds) or isinstance(v, bool):
                raise ValueError
            if isinstance(v, int) and not -2**63 <= v < 2**63:  # SQLite's integers
                raise ValueError
            if isinstance(v, float) and not math.isfinite(v):
                raise ValueError
        return data
    except (ValueError, TypeError):
        raise invalid("page_token", "is not a token this call returned") from None


def page_size(requested: int, cfg: Config) -> int:
    if requested < 0:
        raise invalid("page_size", "must not be negative")
    if requested == 0:
        return cfg.limits.default_page_size
    return min(requested, cfg.limits.max_page_size)


# What one answer carries at most (a list page, a queue): under the 4 MiB that
# gRPC clients accept by default, with room for what surrounds the items.
ANSWER_BYTES = 3 * 1024 * 1024


def equal_share(sizes: list[int], budget: int) -> int | None:
    """The largest share such that every size cut to it adds up to at most
    ``budget`` (sizes under the share stay whole); None when they fit as they are."""
    if sum(sizes) <= budget:
        return None
    left, ordered = max(budget, 0), sorted(sizes)
    for i, size in enumerate(ordered):
        share = left // (len(ordered) - i)
        if size > share:
            return share
        left -= size
    return None  # not reached: the sizes did not fit


def scoped_key(value: str, principal, cfg: Config, admin_any: bool = False) -> str:
    """A request's ``session_key`` in its one spelling (the platform in lower
    case), refused when it is missing or no key (INVALID_ARGUMENT) or names a
    platform outside the caller's (PERMISSION_DENIED), before anything looks
    the lane up: whether a lane exists or runs a turn is no answer to a call
    that may not ask. ``admin_any``: an admin credential may name a key of
    any platform (DeleteSession: docs/semantics.md)."""
    require(value, "session_key", cfg)
    try:
        key = canonical_session_key(value)
    except ValueError:
        raise invalid("session_key", "is not a session key (agent:{profile}:{platform}:…)") from None
    if not (admin_any and principal.admin):
        principal.require_platform(split_session_key(key)[1])
    return key


def key_profile(key: str, profile: str) -> str:
    """The profile of a request that names its lane by ``session_key``: the
    one in the key. A ``profile`` given as well must be that one, else the
    request is INVALID_ARGUMENT naming ``profile``: an unknown or another
    profile would otherwise be dropped without a word, and the turn (or
    seed) run under a profile its caller did not ask for."""
    own = split_session_key(key)[0]
    if profile and profile != own:
        raise invalid("profile", f"{excerpt(profile)} is not the profile of session_key"
                      f" ({excerpt(own)}); leave it empty or give that one")
    return own


def platform_filter(value: str) -> str:
    """A request's ``platform`` (lower case, "" for none). A name with ``:``
    is refused: no platform has one (``source.platform`` refuses it), so
    such a filter could only ever match nothing, or watch nothing forever."""
    if ":" in value:
        raise invalid("platform", f"must not contain ':' (got {excerpt(value)})")
    return value.lower()


def addressable(key: str, cfg: Config) -> str:
    """A session key built from a request's ``source``, refused (INVALID_ARGUMENT
    naming ``source``) when it is longer than a ``session_key`` field takes
    (``KEY_FACTOR`` ids): the session would exist, and no call by key could
    name it again (three ids at their cap, or a platform that grows when
    lowered, make such a key)."""
    limit = cfg.limits.max_id_length * KEY_FACTOR
    if len(key) > limit:
        raise invalid("source", f"makes a session key of {len(key)} characters;"
                                f" a session_key takes at most {limit}")
    return key


def require(value: str, field: str, cfg: Config | None = None) -> str:
    if not value:
        raise invalid(field, "is required")
    if cfg is not None and len(value) > cfg.limits.max_id_length * KEY_FACTOR:
        raise invalid(field, "is too long")
    return value

"""How large each field of each request may be, and so how large each request.

Every string, bytes and repeated field of every request message of our three
services has a cap here (``FIELD_CAPS``); building the caps for a message that
has a field without one raises, so a new proto field cannot slip in unbounded
(tests/test_boundary.py builds them for every RPC). From the same table:

* ``check(request)`` refuses, before any handler looks at the request, the
  first field over its cap with INVALID_ARGUMENT naming it (``messages[3].content``);
* ``max_wire_size(descriptor)`` is the most bytes a request within every cap can
  take on the wire; the boundary refuses a longer one before parsing it, and the
  server's receive limit is the largest of these (never above
  ``limits.max_request_bytes``).

Ids and keys are counted in characters (as the handlers always counted them),
texts and payloads in UTF-8 bytes (what they cost).
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from ..config import Limits
from ..errors import invalid

# Stated caps that no config key governs.
KEY_FACTOR = 4           # a session key: at most four ids long (as convert.require)
NAME_CHARS = 4096        # display names (chat_name, chat_topic, ResetSession's display_name)
URL_CHARS = 8192         # an attachment's url (signed URLs run long)
QUERY_CHARS = 1024       # SearchMessages.query
SHORT_CHARS = 64         # a fixed phrase (ClearAllSessions.confirm) or a status word
TOOLS_PER_REGISTER = 1000
PAGE_TOKEN_CHARS = 16 * 1024  # our tokens: base64 of a small JSON object holding one key

_TAG = 5         # tag plus length prefix, at most
_SCALAR = 16     # tag plus the longest varint or fixed64
_UTF8_MAX = 4    # bytes per character


@dataclass(frozen=True, slots=True)
class Cap:
    n: int
    unit: str  # "chars", "bytes" (UTF-8 of a string, or a bytes field), "items"

    def wire(self) -> int:
        """Most bytes a value within the cap takes on the wire (without its tag)."""
        return self.n * _UTF8_MAX if self.unit == "chars" else self.n


def _field_caps(lim: Limits) -> dict[str, dict[str, Cap]]:
    """Per message (full name), per field: its cap. "*" covers every other
    string field of that message."""
    ident = Cap(lim.max_id_length, "chars")
    key = Cap(lim.max_id_length * KEY_FACTOR, "chars")
    text = Cap(lim.max_text_bytes, "bytes")
    token = Cap(PAGE_TOKEN_CHARS, "chars")
    v1 = "agent_sidecar.v1."
    return {
        v1 + "SessionSource": {"*": ident, "chat_name": Cap(NAME_CHARS, "chars"),
                               "chat_topic": Cap(NAME_CHARS, "chars")},
        v1 + "Message": {"role": ident, "content": text, "tool_call_id": ident,
                         "tool_name": ident, "tool_calls_json": text},
        v1 + "Attachment": {"name": ident, "mime_type": ident, "url": Cap(URL_CHARS, "chars"),
                            "data": Cap(lim.max_attachment_bytes, "bytes")},
        v1 + "ToolSpec": {"name": ident, "description": text, "parameters_json_schema": text},
        v1 + "RegisterTools": {"namespace": ident, "tools": Cap(TOOLS_PER_REGISTER, "items")},
        # A host's result past max_text_bytes fails its call, not the host's stream
        # (ToolRegistry.invoke): only past the request cap is the message refused.
        v1 + "ToolInvocationResult": {"invocation_id": ident, "result_json": Cap(lim.max_request_bytes, "bytes"),
                                      "error": Cap(lim.max_request_bytes, "bytes")},
        # requests
        v1 + "GetOrCreateSessionRequest": {"profile": ident},
        v1 + "GetSessionRequest": {"session_key": key, "session_id": ident},
        v1 + "ListSessionsRequest": {"platform": ident, "page_token": token},
        v1 + "ResetSessionRequest": {"session_key": key, "display_name": Cap(NAME_CHARS, "chars")},
        v1 + "SwitchSessionRequest": {"session_key": key, "target_session_id": ident},
        v1 + "SuspendSessionRequest": {"session_key": key},
        v1 + "MarkResumePendingRequest": {"session_key": key, "reason": ident},
        v1 + "DeleteSessionRequest": {"session_key": key},
        v1 + "ClearAllSessionsRequest": {"confirm": Cap(SHORT_CHARS, "chars")},
        v1 + "SeedSessionRequest": {"session_key": key, "profile": ident,
                                    "messages": Cap(lim.max_messages_per_request, "items")},
        v1 + "GetTranscriptRequest": {"session_id": ident, "page_token": token},
        v1 + "AppendMessagesRequest": {"session_id": ident,
                                       "messages": Cap(lim.max_messages_per_request, "items")},
        v1 + "RewriteTranscriptRequest": {"session_id": ident,
                                          "messages": Cap(lim.max_messages_per_request, "items")},
        v1 + "RewindSessionRequest": {"session_id": ident},
        v1 + "SearchMessagesRequest": {"query": Cap(QUERY_CHARS, "chars"), "session_key": key},
        v1 + "UpdateUsageRequest": {"session_key": key, "cost_status": Cap(SHORT_CHARS, "chars")},
        v1 + "GetSessionContextRequest": {"profile": ident},
        v1 + "PromptRequest": {"request_id": ident, "session_key": key, "text": text,
                               "profile": ident, "attachments": Cap(lim.max_attachments, "items")},
        v1 + "WatchActivityRequest": {"request_id": ident, "session_key": key, "platform": ident},
        v1 + "CancelRequest": {"session_key": key, "request_id": ident},
        v1 + "GetQueueRequest": {"session_key": key},
    }


class Caps:
    """The caps of one configuration, resolved per field descriptor."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self._table = _field_caps(limits)
        self._plans: dict[str, tuple] = {}
        self._small: dict[str, tuple[int, tuple]] = {}

    def _cap(self, msg: Descriptor, f: FieldDescriptor) -> Cap | None:
        """The field's cap; None for a field that needs none (a scalar, a
        singular message). Raises for a field that needs one and has none."""
        if f.type in (f.TYPE_STRING, f.TYPE_BYTES) or f.is_repeated:
            table = self._table.get(msg.full_name, {})
            cap = table.get(f.name) or (table.get("*") if f.type == f.TYPE_STRING else None)
            if cap is None or (f.is_repeated and cap.unit != "items"):
                raise LookupError(f"no cap for {msg.full_name}.{f.name}")
            return cap
        return None

    def plan(self, msg: Descriptor) -> tuple:
        """(name, cap, sub-plan or None, is_repeated) per field that has
        something to check, built once per message type."""
        got = self._plans.get(msg.full_name)
        if got is None:
            fields = []
            for f in msg.fields:
                cap = self._cap(msg, f)
                sub = self.plan(f.message_type) if f.message_type is not None else None
                if cap is not None or sub:
                    fields.append((f.name, cap, sub, f.is_repeated))
            got = tuple(fields)
            self._plans[msg.full_name] = got
        return got

    def check(self, request, size: int | None = None) -> None:
        """Refuse the first field over its cap: INVALID_ARGUMENT naming it.
        With the request's wire ``size``, a request too small to break any
        string or bytes cap has only its top-level counts checked (see
        ``small``)."""
        desc = request.DESCRIPTOR
        if size is not None:
            floor, counts = self.small(desc)
            if size <= floor:
                for name, cap in counts:
                    if len(getattr(request, name)) > cap.n:
                        raise invalid(name, f"more than {cap.n} items")
                return
        _check(request, self.plan(desc), "")

    def small(self, msg: Descriptor) -> tuple[int, tuple]:
        """(floor, counts): a message of this type of at most ``floor`` bytes
        is within every cap but perhaps the item counts of its top-level
        repeated fields (``counts``: (name, cap)). A string or bytes value
        takes at least a byte per character on the wire, and an item of a
        nested repeated field at least two."""
        got = self._small.get(msg.full_name)
        if got is None:
            counts = tuple((name, cap) for name, cap, _, repeated in self.plan(msg)
                           if repeated and cap is not None)
            got = self._small[msg.full_name] = (self._floor(self.plan(msg), top=True), counts)
        return got

    def _floor(self, plan: tuple, top: bool) -> int:
        floor = 1 << 62
        for _, cap, sub, repeated in plan:
            if cap is not None and (not repeated or not top):
                floor = min(floor, 2 * cap.n if repeated else cap.n)
            if sub:
                floor = min(floor, self._floor(sub, top=False))
        return floor

    def max_wire_size(self, msg: Descriptor) -> int:
        """The most bytes a message of this type within every cap can take."""
        total = 0
        for f in msg.fields:
            cap = self._cap(msg, f)
            if f.message_type is not None:
                one = _TAG + self.max_wire_size(f.message_type)
                if f.is_repeated:
                    assert cap is not None  # _cap raises for a repeated field without one
                    one *= cap.n
                total += one
            elif cap is not None:
                total += _TAG + cap.wire()
            else:
                total += _SCALAR
        return total

    def request_limit(self, msg: Descriptor) -> int:
        """Bytes past which a request of this type is refused unread."""
        return min(self.max_wire_size(msg), self.limits.max_request_bytes)


def _check(message, plan: tuple, prefix: str) -> None:
    for name, cap, sub, repeated in plan:
        value = getattr(message, name)
        path = prefix + name
        if repeated:
            if cap is not None and len(value) > cap.n:
                raise invalid(path, f"more than {cap.n} items")
            if sub:
                for i, item in enumerate(value):
                    _check(item, sub, f"{path}[{i}].")
        elif sub:
            if message.HasField(name):
                _check(value, sub, path + ".")
        elif cap is not None:
            _check_value(value, cap, path)


def _check_value(value, cap: Cap, path: str) -> None:
    if cap.unit == "chars":
        if len(value) > cap.n:
            raise invalid(path, f"longer than {cap.n} characters")
    elif len(value) > cap.n or (isinstance(value, str) and len(value) * _UTF8_MAX > cap.n
                                and len(value.encode()) > cap.n):
        raise invalid(path, f"larger than {cap.n} bytes")

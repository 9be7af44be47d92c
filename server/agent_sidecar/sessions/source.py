"""SessionSource: where a message came from (seed 001 §1).

A frozen record attached to every incoming prompt. It drives session-key derivation
(:mod:`agent_sidecar.sessions.keys`), multi-user isolation and the system-prompt context
section (:mod:`agent_sidecar.sessions.context`).

Design choices:

* The 15 fields mirror seed 001 §1 and the proto ``SessionSource`` message one to one, in the
  same order, so converting between them is a plain field copy.
* ``platform`` and ``chat_type`` are plain strings (not an enum) so plugin platforms and chat
  types need no code change; this matches the proto.
* Absent strings are ``""`` rather than ``None``: proto3 strings cannot be null, so using the
  same "empty means not set" convention everywhere removes a whole class of
  ``None``-vs-``""`` mismatches (e.g. two keys for one chat).
* This module is pure (no grpc, no I/O): worker processes import it too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from ..store.record_type import record

__all__ = ["SessionSource", "CHAT_TYPES", "describe_source"]

#: The chat types seed 001 knows about. Others are accepted (plugins) and treated like groups.
CHAT_TYPES = ("dm", "group", "channel", "thread")

_BOOL_FIELDS = frozenset({"is_bot", "role_authorized"})


@record
class SessionSource:
    """Frozen descriptor of a message's origin (seed 001 §1).

    ``chat_type`` is one of ``"dm"``, ``"group"``, ``"channel"``, ``"thread"``; an empty string
    is read as ``"dm"`` by the key and isolation rules (proto3 default).
    """

    platform: str
    chat_id: str = ""
    chat_name: str = ""
    chat_type: str = "dm"
    user_id: str = ""
    user_name: str = ""
    thread_id: str = ""
    chat_topic: str = ""
    user_id_alt: str = ""
    chat_id_alt: str = ""
    is_bot: bool = False
    guild_id: str = ""
    parent_chat_id: str = ""
    message_id: str = ""
    role_authorized: bool = False

    # -- derived values ------------------------------------------------------------------

    @property
    def effective_chat_type(self) -> str:
        """``chat_type`` with the proto3 empty default mapped to ``"dm"``."""
        return self.chat_type or "dm"

    @property
    def participant_id(self) -> str:
        """Stable id of the sender: ``user_id_alt`` (Signal UUID, Feishu union_id) wins over
        ``user_id`` because the latter may be ephemeral on those platforms (seed 001 §4)."""
        return self.user_id_alt or self.user_id or ""

    @property
    def description(self) -> str:
        """Human-readable summary, e.g. ``"DM with Alice"``, ``"group: My Group, thread: 12345"``.

        See :func:`describe_source` for the exact rules.
        """
        return describe_source(self)

    # -- serialisation -------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Dict with only the set fields (non-empty strings, true booleans), in field order.

        ``platform`` is always present because it is required. Omitting defaults keeps
        persisted rows small and makes the output stable when fields are added later.
        """
        out: dict[str, Any] = {"platform": self.platform}
        for f in fields(self):
            if f.name == "platform":
                continue
            value = getattr(self, f.name)
            if value:
                out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SessionSource:
        """Inverse of :meth:`to_dict`, tolerant of older/newer writers.

        Unknown keys are ignored (forward compatibility), ``None`` reads as the default, and
        non-string ids (e.g. a numeric Telegram chat id stored as a JSON number) are turned into
        strings so the same chat always yields the same session key.
        """
        platform = data.get("platform")
        if not platform:
            raise ValueError("source.platform: required")
        kwargs: dict[str, Any] = {"platform": str(platform)}
        for f in fields(cls):
            if f.name == "platform" or f.name not in data:
                continue
            value = data[f.name]
            if value is None:
                continue
            kwargs[f.name] = bool(value) if f.name in _BOOL_FIELDS else str(value)
        return cls(**kwargs)

    def describe(self, *, user_label: str | None = None, chat_label: str | None = None) -> str:
        """Like :attr:`description` but with the user/chat labels overridden (used by the
        context prompt to describe a source with redacted ids)."""
        return describe_source(self, user_label=user_label, chat_label=chat_label)


def describe_source(
    source: SessionSource, *, user_label: str | None = None, chat_label: str | None = None
) -> str:
    """Describe *source* for humans and for the model.

    * ``dm``: ``"DM with <user>"`` where user is the display name, else the user id, else
      ``"unknown user"``.
    * ``group`` / ``channel`` / any plugin chat type: ``"<chat_type>: <chat>"`` where chat is the
      chat name, else the chat id, else ``"unknown chat"``.
    * ``thread`` (the chat itself is a thread) follows the group rule: ``"thread: <chat>"``.
      The parent channel is left out: it is an id the context prompt may need to redact.
    * A ``thread_id`` adds ``", thread: <thread_id>"`` (not repeated when a ``thread`` chat's
      label already is that id).

    *user_label* / *chat_label* replace the computed labels (e.g. with redacted ids).
    """
    chat_type = source.effective_chat_type
    if chat_label is None:
        chat_label = source.chat_name or source.chat_id or "unknown chat"
    if chat_type == "dm":
        if user_label is None:
            user_label = source.user_name or source.user_id or "unknown user"
        text = f"DM with {user_label}"
    else:
        text = f"{chat_type}: {chat_label}"
    if source.thread_id and not (chat_type == "thread" and chat_label == source.thread_id):
        text += f", thread: {source.thread_id}"
    return text

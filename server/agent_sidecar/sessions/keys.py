"""Session keys and multi-user isolation (seed 001 §4, §5; DECISIONS "Names and keys").

A session key names one conversation lane. It is deterministic so every adapter, the parent
process and every worker derive the same key from the same :class:`SessionSource`; the key
is also what maps a session to its worker (rendezvous hashing), so two spellings of one chat
must never give two keys. Layout::

    agent:{profile}:{platform}:{chat_type}[:{chat_id}][:{thread_id}][:{participant_id}]

With the default profile ``main`` the keys are exactly seed 001's.

Platform names are case-insensitive: the platform field of a key is always in lower case
(:func:`build_session_key` lowers it, :func:`canonical_session_key` lowers it in a key a
caller spelled), so ``agent:main:Telegram:dm:1`` and ``agent:main:telegram:dm:1`` name one
lane. The other fields keep their case: profiles are config names, ids are the platform's.

Only the leading fields (``agent``, profile, platform, chat_type) are guaranteed to be free of
``:`` and can be parsed back (:func:`split_session_key`); chat/thread/user ids are
platform-defined and may themselves contain ``:`` (a Matrix room id is ``!room:server``).

Pure module (no grpc, no I/O): worker processes import it too.
"""

from __future__ import annotations

import re

from ..errors import excerpt
from .source import SessionSource

__all__ = [
    "DEFAULT_PROFILE",
    "KEY_PREFIX",
    "canonical_whatsapp_identifier",
    "build_session_key",
    "canonical_session_key",
    "is_shared_multi_user_session",
    "split_session_key",
]

DEFAULT_PROFILE = "main"
KEY_PREFIX = "agent"

# JID servers of WhatsApp *people* (phone-number JIDs, legacy web JIDs, linked-identity ids).
_PERSON_SERVERS = frozenset({"s.whatsapp.net", "c.us", "lid", "hosted", "hosted.lid"})
# JID servers of things that are not a person: groups, broadcast lists, channels.
_NON_PERSON_SERVERS = frozenset({"g.us", "broadcast", "newsletter"})
_SEPARATORS = re.compile(r"[\s\-().\u00a0]")
_ASCII_DIGITS = re.compile(r"[0-9]{1,15}")  # E.164: at most 15 digits
_BARE_DEVICE = re.compile(r":[0-9]+$")


def canonical_whatsapp_identifier(value: str) -> str:
    """One canonical spelling for every alias of one WhatsApp identifier.

    WhatsApp bridges report the same person as ``15551234567@s.whatsapp.net``,
    ``15551234567@c.us``, ``15551234567:12@s.whatsapp.net`` (a device of the account),
    ``+1 (555) 123-4567`` or ``0015551234567`` depending on library and direction; keyed
    verbatim, one chat would split into several sessions. Rules, in order:

    * Surrounding whitespace is dropped; an empty value stays ``""``.
    * Non-person JIDs (``@g.us`` groups, ``@broadcast``, ``@newsletter``) keep their id
      unchanged, only without the server suffix: ``120363...@g.us`` -> ``120363...``; a legacy
      group id ``15551234567-1612345678`` keeps its dash (it is an id, not a formatted number).
    * Person JIDs (``@s.whatsapp.net``, ``@c.us``, ``@lid``, ``@hosted``) lose the suffix, the
      ``:device`` part and the ``.agent`` part of multi-device JIDs (``user.agent:device@server``).
      A bare value loses a trailing ``:device``.
    * Separators are removed (spaces, dashes, parentheses, dots), then a leading ``+`` or the
      ``00`` international call prefix.
    * If what is left is 1 to 15 ASCII digits (E.164's limit) the result is ``+`` followed by
      the digits: ``+15551234567``. The ``+`` makes the value visibly a phone number.
    * Anything else is not a phone number and is returned as the (suffix-less) id, untouched:
      modern group ids have 18 digits, so a bare group id and its ``@g.us`` form agree.

    Not handled, on purpose: a national trunk prefix (``0 555 ...``) needs the country, which
    we do not know; and an ``@lid`` id is an opaque linked-identity number, not the phone
    number -- it is normalised the same way but cannot be mapped to the phone alias without the
    bridge's table (adapters that know both should send the stable one as ``user_id_alt``).
    """
    text = str(value or "").strip()
    if not text:
        return ""
    local, at, server = text.partition("@")
    server = server.strip().lower()
    if at and server in _NON_PERSON_SERVERS:
        return local.strip()
    if at and server in _PERSON_SERVERS:
        local = local.split(":", 1)[0]
        head, dot, tail = local.partition(".")
        if dot and head.isdigit() and tail.isdigit():
            local = head  # multi-device "user.agent" form
        fallback = local.strip()
    else:
        local = _BARE_DEVICE.sub("", local) if not at else local
        fallback = text
    digits = _SEPARATORS.sub("", local)
    if digits.startswith("+"):
        digits = digits[1:]
    elif digits.startswith("00"):
        digits = digits[2:]
    if _ASCII_DIGITS.fullmatch(digits):
        return "+" + digits
    return fallback


def _check_key_part(name: str, value: str) -> str:
    """Validate a key field that must parse back: non-empty and without ``:``."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name}: must be a non-empty string")
    if ":" in value:
        raise ValueError(f"{name}: must not contain ':' (got {excerpt(value)})")
    return value


def _is_whatsapp(source: SessionSource) -> bool:
    return source.platform.lower() == "whatsapp"


def _participant(source: SessionSource) -> str:
    """``user_id_alt`` or ``user_id``; WhatsApp aliases canonicalised so an alias flip of one
    member cannot split their per-user session in two."""
    pid = source.participant_id
    if pid and _is_whatsapp(source):
        pid = canonical_whatsapp_identifier(pid) or pid
    return pid


def build_session_key(
    source: SessionSource,
    profile: str = DEFAULT_PROFILE,
    *,
    group_sessions_per_user: bool = True,
    thread_sessions_per_user: bool = False,
) -> str:
    """Derive the session key of *source* under *profile* (seed 001 §4).

    * DMs (``chat_type`` ``"dm"`` or empty): the chat id when present, then the thread id.
      Without a chat id the participant id (``user_id_alt`` or ``user_id``) stands in, then
      the thread id; with neither, every such DM of the platform shares one bare key.
    * Every other chat type (group, channel, thread, plugin types): chat id, then thread id,
      then the participant id when per-user isolation applies -- ``thread_sessions_per_user``
      when ``thread_id`` is set (threads are shared by default), else
      ``group_sessions_per_user`` (groups are isolated by default).
    * WhatsApp chat and participant ids go through :func:`canonical_whatsapp_identifier`.

    Empty parts are skipped, never written as ``::``. Raises :class:`ValueError` (message
    starting with the field path) when the profile, platform or chat type is empty or holds
    ``:``, as those could not be parsed back by :func:`split_session_key`.
    """
    _check_key_part("profile", profile)
    _check_key_part("source.platform", source.platform)
    chat_type = _check_key_part("source.chat_type", source.effective_chat_type)

    chat_id = source.chat_id or ""
    if chat_id and _is_whatsapp(source):
        chat_id = canonical_whatsapp_identifier(chat_id) or chat_id
    thread_id = source.thread_id or ""

    parts = [KEY_PREFIX, profile, source.platform.lower(), chat_type]
    if chat_type == "dm":
        # A DM chat id already names one private conversation; the sender id is only the
        # fallback so chat-id-less DMs of different users do not collapse together.
        parts.append(chat_id or _participant(source))
        parts.append(thread_id)
    else:
        per_user = thread_sessions_per_user if thread_id else group_sessions_per_user
        parts += [chat_id, thread_id, _participant(source) if per_user else ""]
    return ":".join(p for p in parts if p)


def is_shared_multi_user_session(
    source: SessionSource,
    *,
    group_sessions_per_user: bool = True,
    thread_sessions_per_user: bool = False,
) -> bool:
    """True when several users share this session (seed 001 §5).

    Mirrors :func:`build_session_key`: DMs are never shared; a thread is shared unless
    ``thread_sessions_per_user``; any other chat is shared only when
    ``group_sessions_per_user`` is off. Shared sessions get no fixed user name in the system
    prompt (sender names prefix each user message instead, which keeps the prompt cacheable).
    """
    if source.effective_chat_type == "dm":
        return False
    if source.thread_id:
        return not thread_sessions_per_user
    return not group_sessions_per_user


def split_session_key(key: str) -> tuple[str, str, str]:
    """Return ``(profile, platform, chat_type)`` of a session key.

    Only the leading fields are parsed: the rest holds platform ids that may contain ``:``.
    Raises :class:`ValueError` when *key* does not start with ``agent:`` followed by three
    non-empty fields.
    """
    if not isinstance(key, str):
        raise ValueError("session_key: must be a string")
    parts = key.split(":", 4)
    if len(parts) < 4 or parts[0] != KEY_PREFIX or not all(parts[1:4]):
        raise ValueError(
            f"session_key: malformed {excerpt(key)}, expected "
            "'agent:{profile}:{platform}:{chat_type}[:...]'"
        )
    if len(parts) == 5 and not parts[4]:
        raise ValueError(f"session_key: malformed {excerpt(key)}, empty part after chat_type")
    return parts[1], parts[2], parts[3]


def canonical_session_key(key: str) -> str:
    """*key* with its platform field in lower case: the one spelling of the lane.

    Raises :class:`ValueError` as :func:`split_session_key` does for a malformed key.
    """
    split_session_key(key)
    head, profile, platform, rest = key.split(":", 3)
    return ":".join((head, profile, platform.lower(), rest)) if platform != platform.lower() else key

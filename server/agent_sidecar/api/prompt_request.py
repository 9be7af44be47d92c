"""A PromptRequest checked before anything is read or written for it.

Every field is checked against its limit and refused INVALID_ARGUMENT naming
it (with ErrorInfo), and the session key is derived (from ``source`` and
``profile``) or read (``session_key``) in its one spelling, its platform then
checked against the caller's credential: a call that may not ask learns
nothing of the lane.
"""

from __future__ import annotations

from .. import errors as E
from ..config import Config
from ..sessions.context import with_sender
from ..sessions.keys import build_session_key, canonical_session_key, split_session_key
from ..sessions.source import SessionSource
from ..v1 import prompt_service_pb2 as pb
from . import convert as cv

_MODES = set(pb.DeliveryMode.values()) - {0}


def checked_prompt(request: pb.PromptRequest, principal,
                   cfg: Config) -> tuple[str, str, str, str, SessionSource | None]:
    """``(request_id, session_key, platform, profile, source or None)``."""
    rid = cv.require(request.request_id, "request_id")
    if len(rid) > cfg.limits.max_id_length:
        raise E.invalid("request_id", f"longer than {cfg.limits.max_id_length} characters")
    if len(request.text.encode()) > cfg.limits.max_text_bytes:
        raise E.invalid("text", f"larger than {cfg.limits.max_text_bytes} bytes")
    if request.delivery and request.delivery not in _MODES:
        raise E.invalid("delivery", "is not a known delivery mode")
    if len(request.attachments) > cfg.limits.max_attachments:
        raise E.invalid("attachments", f"more than {cfg.limits.max_attachments}")
    for i, a in enumerate(request.attachments):
        if len(a.data) > cfg.limits.max_attachment_bytes:
            raise E.invalid(f"attachments[{i}].data", f"larger than {cfg.limits.max_attachment_bytes} bytes")
    if request.HasField("source") == bool(request.session_key):
        raise E.invalid("source", "give exactly one of source and session_key")
    source = None
    if request.HasField("source"):
        source = cv.source_from_proto(request.source, cfg)
        profile = request.profile or "main"
        if cfg.profile(profile) is None:
            raise E.invalid("profile", f"unknown profile {E.excerpt(profile)}")
        try:
            key = build_session_key(source, profile,
                                    group_sessions_per_user=cfg.group_sessions_per_user,
                                    thread_sessions_per_user=cfg.thread_sessions_per_user)
        except ValueError as e:
            raise E.invalid(str(e).split(":", 1)[0], str(e)) from None
        key = cv.addressable(key, cfg)
        platform = source.platform
    else:
        try:
            key = canonical_session_key(request.session_key)
            profile, platform, _ = split_session_key(key)
        except ValueError:
            raise E.invalid("session_key", "is not a session key (agent:{profile}:{platform}:…)") from None
        if cfg.profile(profile) is None:
            raise E.invalid("session_key", f"names an unknown profile {E.excerpt(profile)}")
        cv.key_profile(key, request.profile)
    principal.require_platform(platform)
    return rid, key, platform, profile, source


def turn_text(request: pb.PromptRequest, source: SessionSource | None, cfg: Config) -> str:
    """The user message the turn runs with: the prompt's text, prefixed with
    its sender in a session several users share (sessions/context.with_sender).
    A prompt by session_key names no sender: its text goes as sent."""
    if source is None:
        return request.text
    return with_sender(request.text, source, redact_pii=cfg.redact_pii,
                       pii_safe_platforms=cfg.pii_safe_platforms(),
                       group_sessions_per_user=cfg.group_sessions_per_user,
                       thread_sessions_per_user=cfg.thread_sessions_per_user)

"""SessionService over gRPC: thin handlers that validate, run a writer job or a
read, and convert. The session logic itself lives in sessions/."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from ..config import Config
from ..errors import FAILED_PRECONDITION, SidecarError, excerpt, invalid, not_found
from ..sessions import lifecycle as life
from ..sessions import transcripts as tx
from ..sessions.context import build_session_context_prompt, shared_multi_user
from ..sessions.entry import SessionEntry
from ..sessions.keys import build_session_key
from ..store import Store
from ..store.records import MAX_COST_DELTA, MAX_TOKEN_DELTA, Message, UsageDelta
from ..turns import lane_admin, undo
from ..v1 import session_service_pb2 as pb
from ..v1 import session_service_pb2_grpc as pb_grpc
from . import convert as cv
from .rpc import unary

CLEAR_ALL_CONFIRM = "DELETE ALL SESSIONS"


def _within_page_bytes(items: list, size_of: Callable[[Any], int]) -> list:
    """The leading ``items`` whose ``size_of`` (bytes on the wire) add up to
    at most ``convert.ANSWER_BYTES``, and always the first: a page ends at page_size or at
    this budget, so a client with gRPC's default receive limit can read it."""
    page: list = []
    used = 0
    for item in items:
        used += size_of(item)
        if page and used > cv.ANSWER_BYTES:
            break
        page.append(item)
    return page


# GetTranscript reads a page's rows this many at a time, stopping once the
# page's byte budget is spent: a page of large messages never holds more than
# a chunk past its budget in the sidecar, whatever page_size asked for.
TRANSCRIPT_CHUNK = 32


def _message_bytes(m: Message) -> int:
    return 64 + sum(len(v.encode()) for v in (m.content, m.tool_calls_json, m.tool_name, m.tool_call_id))


def _proto_bytes(msg) -> int:
    return msg.ByteSize() + 8  # with its tag and length in the page


class SessionService(pb_grpc.SessionServiceServicer):
    def __init__(self, cfg: Config, store: Store, auth, turns, forward=None):
        self.cfg, self.store, self.auth, self.turns = cfg, store, auth, turns
        self.forward = forward  # a cluster: lane calls for lanes run elsewhere (cluster/forward.py)

    # -- helpers ------------------------------------------------------------

    def _session(self, entry: SessionEntry):
        return cv.entry_to_proto(entry, self.turns.queue_depth(entry.session_key))

    def key_for(self, source, profile: str, field: str = "source") -> tuple[str, str]:
        profile = profile or "main"
        if self.cfg.profile(profile) is None:
            raise invalid("profile", f"unknown profile {excerpt(profile)}")
        try:
            key = build_session_key(source, profile,
                                    group_sessions_per_user=self.cfg.group_sessions_per_user,
                                    thread_sessions_per_user=self.cfg.thread_sessions_per_user)
        except ValueError as e:
            path = str(e).split(":", 1)[0]
            raise invalid(path if path.startswith("source") else field, str(e)) from None
        return cv.addressable(key, self.cfg), profile

    async def _entry(self, key: str) -> SessionEntry:
        entry = await self.store.entry(key)
        if entry is None:
            raise not_found(key)
        return entry

    async def _incarnation_key(self, session_id: str, principal) -> str:
        cv.require(session_id, "session_id", self.cfg)
        key = await self.store.session_key_of(session_id)
        if key is None:
            raise SidecarError("SESSION_NOT_FOUND", f"no such session id: {excerpt(session_id)}")
        cv.scoped_key(key, principal, self.cfg)
        return key

    # -- lanes --------------------------------------------------------------

    @unary
    async def GetOrCreateSession(self, request, context, principal):
        source = cv.source_from_proto(request.source, self.cfg)
        principal.require_platform(source.platform)
        key, profile = self.key_for(source, request.profile)
        entry, created = await self.store.write(life.get_or_create, key, source, profile,
                                                request.force_new)
        return pb.GetOrCreateSessionResponse(session=self._session(entry), created=created)

    @unary
    async def GetSession(self, request, context, principal):
        if bool(request.session_key) == bool(request.session_id):
            raise invalid("session_key", "give exactly one of session_key and session_id")
        if request.session_key:
            entry = await self._entry(cv.scoped_key(request.session_key, principal, self.cfg))
        else:
            key = await self._incarnation_key(request.session_id, principal)
            entry = await self._entry(key)
            if entry.session_id != request.session_id:
                raise SidecarError("SESSION_NOT_FOUND",
                                   f"{excerpt(request.session_id)} is not the current"
                                   f" incarnation of {excerpt(key)}")
        return pb.GetSessionResponse(session=self._session(entry))

    @unary
    async def ListSessions(self, request, context, principal):
        size = cv.page_size(request.page_size, self.cfg)
        token = cv.decode_page_token(request.page_token, "sessions", {"u": (int, float), "s": str})
        if request.active_within_seconds < 0:
            raise invalid("active_within_seconds", "must not be negative")
        platform = cv.platform_filter(request.platform)
        if platform:
            principal.require_platform(platform)
        elif not principal.allows("*"):
            raise invalid("platform", "is required for a platform-scoped credential")
        since = time.time() - request.active_within_seconds if request.active_within_seconds else None
        found = await self.store.list_entries(platform=platform, active_since=since, limit=size + 1,
                                              after=(token["u"], token["s"]) if token else None)
        sessions = _within_page_bytes([self._session(e) for e in found[:size]], _proto_bytes)
        nxt = ""
        if len(sessions) < len(found):
            last = found[len(sessions) - 1]
            nxt = cv.encode_page_token({"k": "sessions", "u": last.updated_at, "s": last.session_key})
        return pb.ListSessionsResponse(sessions=sessions, next_page_token=nxt)

    @unary
    async def ResetSession(self, request, context, principal):
        key = cv.scoped_key(request.session_key, principal, self.cfg)
        await self._entry(key)
        epoch = await lane_admin.reset(self.turns, key)
        entry = await lane_admin.under_lease(self.turns, key, epoch, life.reset, key, request.display_name)
        return pb.ResetSessionResponse(session=self._session(entry))

    @unary
    async def SwitchSession(self, request, context, principal):
        key = cv.scoped_key(request.session_key, principal, self.cfg)
        cv.require(request.target_session_id, "target_session_id", self.cfg)
        entry = await self.store.write(life.switch, key, request.target_session_id)
        return pb.SwitchSessionResponse(session=self._session(entry))

    @unary
    async def SuspendSession(self, request, context, principal):
        key = cv.scoped_key(request.session_key, principal, self.cfg)
        epoch = await lane_admin.claim(self.turns, key)
        before = lane_admin.present(self.turns, key)  # accepted before the job (see drop)
        entry = await lane_admin.under_lease(self.turns, key, epoch, life.suspend, key)
        lane_admin.drop(self.turns, key, before, entry.session_id)  # after the job (see drop)
        return pb.SuspendSessionResponse(session=self._session(entry))

    @unary
    async def MarkResumePending(self, request, context, principal):
        key = cv.scoped_key(request.session_key, principal, self.cfg)
        reason = cv.require(request.reason, "reason")  # its length: the caps (api/caps.py)
        entry = await self.store.write(life.mark_resume_pending, key, reason)
        return pb.MarkResumePendingResponse(session=self._session(entry))

    @unary
    async def DeleteSession(self, request, context, principal):
        # A credential for the session's platform, or an admin one of any platforms.
        key = cv.scoped_key(request.session_key, principal, self.cfg, admin_any=True)
        await lane_admin.delete(self.turns, key)
        deleted = await self.store.write(life.delete, key)
        self.turns.recent.forget(key)  # its ledger rows went: a reuse of their ids runs anew
        if self.turns.leases is not None and deleted:  # the job revoked the lane's lease
            self.turns.leases.cleared([key])
        return pb.DeleteSessionResponse(deleted=deleted)

    @unary
    async def ClearAllSessions(self, request, context, principal):
        principal.require_admin()
        if request.confirm != CLEAR_ALL_CONFIRM:
            raise SidecarError(FAILED_PRECONDITION,
                               f"confirm must be the literal string {CLEAR_ALL_CONFIRM!r}",
                               field="confirm")
        await lane_admin.clear_all(self.turns)
        n = await self.store.write(life.clear_all)
        self.turns.recent.forget(None)
        if self.turns.leases is not None:  # the job revoked every lease
            self.turns.leases.cleared(None)
        return pb.ClearAllSessionsResponse(sessions_deleted=n)

    # -- transcripts ----------------------------------------------------------

    @unary
    async def SeedSession(self, request, context, principal):
        messages = cv.messages_from_proto(request.messages, self.cfg)
        if request.HasField("source") == bool(request.session_key):
            raise invalid("source", "give exactly one of source and session_key")
        if request.session_key:
            key = cv.scoped_key(request.session_key, principal, self.cfg)
            cv.key_profile(key, request.profile)
            entry = await self.store.write(life.seed, key, messages)
        else:
            source = cv.source_from_proto(request.source, self.cfg)
            principal.require_platform(source.platform)
            key, profile = self.key_for(source, request.profile)
            entry = await self.store.write(life.seed, key, messages, source, profile)
        return pb.SeedSessionResponse(session=self._session(entry))

    @unary
    async def GetTranscript(self, request, context, principal):
        await self._incarnation_key(request.session_id, principal)
        size = cv.page_size(request.page_size, self.cfg)
        token = cv.decode_page_token(request.page_token, "transcript", {"after": int})
        page, more = await self._transcript_page(request.session_id, request.include_rewound,
                                                 token["after"] if token else 0, size)
        nxt = cv.encode_page_token({"k": "transcript", "after": page[-1].seq}) if more else ""
        return pb.GetTranscriptResponse(messages=[cv.message_to_proto(m) for m in page],
                                        next_page_token=nxt)

    async def _transcript_page(self, session_id: str, include_rewound: bool, after: int,
                               size: int) -> tuple[list[Message], bool]:
        """Up to ``size`` messages after seq ``after`` within the page's byte
        budget, read a chunk at a time, and whether more follow."""
        read: list[Message] = []
        while True:
            chunk = await self.store.transcript(session_id, include_rewound=include_rewound,
                                                after_seq=read[-1].seq if read else after,
                                                limit=min(TRANSCRIPT_CHUNK, size + 1 - len(read)))
            read += chunk
            page: list[Message] = _within_page_bytes(read[:size], _message_bytes)
            if len(page) < len(read) or len(chunk) < TRANSCRIPT_CHUNK:
                return page, len(page) < len(read)

    @unary
    async def AppendMessages(self, request, context, principal):
        await self._incarnation_key(request.session_id, principal)
        messages = cv.messages_from_proto(request.messages, self.cfg)
        if not messages:
            raise invalid("messages", "is empty")
        first, last = await self.store.write(tx.append_messages, request.session_id, messages)
        return pb.AppendMessagesResponse(first_seq=first, last_seq=last)

    @unary
    async def RewriteTranscript(self, request, context, principal):
        key = await self._incarnation_key(request.session_id, principal)
        messages = cv.messages_from_proto(request.messages, self.cfg)
        await undo.rewrite(self.turns, key, request.session_id, messages)  # the running turn goes first
        return pb.RewriteTranscriptResponse()

    @unary
    async def RewindSession(self, request, context, principal):
        key = await self._incarnation_key(request.session_id, principal)
        if request.n < 0:
            raise invalid("n", "must not be negative")
        n = request.n or 1
        out = await undo.rewind(self.turns, key, request.session_id, n)  # waiting prompts count first
        return pb.RewindSessionResponse(**out)

    @unary
    async def SearchMessages(self, request, context, principal):
        query = cv.require(request.query.strip(), "query")
        if len(query) > 1024:
            raise invalid("query", "longer than 1024 characters")
        if request.limit < 0:
            raise invalid("limit", "must not be negative")
        key = ""
        if request.session_key:
            key = cv.scoped_key(request.session_key, principal, self.cfg)
        elif not principal.allows("*"):
            raise invalid("session_key", "is required for a platform-scoped credential")
        hits = await self.store.search(query, session_key=key,
                                       limit=min(request.limit or 20, 200))
        return pb.SearchMessagesResponse(hits=[
            pb.SearchHit(session_key=h.session_key, session_id=h.session_id, seq=h.seq,
                         role=h.role, snippet=h.snippet, created_at=cv.ts(h.created_at))
            for h in hits])

    # -- accounting and housekeeping -------------------------------------------

    @unary
    async def UpdateUsage(self, request, context, principal):
        key = cv.scoped_key(request.session_key, principal, self.cfg)
        d = request.delta
        for name in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens"):
            if not 0 <= getattr(d, name) <= MAX_TOKEN_DELTA:
                raise invalid(f"delta.{name}", f"must be between 0 and {MAX_TOKEN_DELTA}")
        if not math.isfinite(d.cost_usd) or not 0 <= d.cost_usd <= MAX_COST_DELTA:
            raise invalid("delta.cost_usd", f"must be a finite number between 0 and {MAX_COST_DELTA}")
        if not 0 <= request.last_prompt_tokens <= MAX_TOKEN_DELTA:
            raise invalid("last_prompt_tokens", f"must be between 0 and {MAX_TOKEN_DELTA}")
        cv.check_size(request.cost_status, "cost_status", 64)
        delta = UsageDelta(d.input_tokens, d.output_tokens, d.cache_read_tokens,
                           d.cache_write_tokens, d.cost_usd, request.last_prompt_tokens,
                           request.cost_status)
        entry = await self.store.write(life.update_usage, key, delta)
        return pb.UpdateUsageResponse(session=self._session(entry))

    @unary
    async def PruneSessions(self, request, context, principal):
        principal.require_admin()
        if request.max_age_days <= 0:
            raise invalid("max_age_days", "must be at least 1")
        busy = self.turns.busy_keys()
        n = await self.store.write(life.prune, request.max_age_days, busy)
        return pb.PruneSessionsResponse(pruned=n)

    @unary
    async def GetSessionContext(self, request, context, principal):
        source = cv.source_from_proto(request.source, self.cfg)
        principal.require_platform(source.platform)
        key, _ = self.key_for(source, request.profile)
        entry = await self.store.entry(key)
        started = datetime.fromtimestamp(entry.created_at, UTC) if entry else None
        flags = dict(group_sessions_per_user=self.cfg.group_sessions_per_user,
                     thread_sessions_per_user=self.cfg.thread_sessions_per_user)
        text = build_session_context_prompt(
            source, session_key=key, session_id=entry.session_id if entry else "",
            created_at=started, connected_platforms=self.cfg.connected_platforms,
            home_channels=self.cfg.home_channels, redact_pii=self.cfg.redact_pii,
            pii_safe_platforms=self.cfg.pii_safe_platforms(), **flags)
        return pb.GetSessionContextResponse(prompt_section=text,
                                            shared_multi_user=shared_multi_user(source, **flags))

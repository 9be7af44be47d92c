"""The SessionService wrappers of SidecarClient (client.py), one method per RPC.

A mixin so client.py stays one readable page: ``SessionCalls`` needs only the
client's ``_call`` (token, deadline, typed errors) and its ``sessions`` stub.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from agent_sidecar_client import _args
from agent_sidecar_client._args import MessageLike, SourceLike, as_source, check_ints, check_text
from agent_sidecar_client._proto import common_pb2 as common
from agent_sidecar_client._proto import session_service_pb2 as session_pb
from agent_sidecar_client._proto import session_service_pb2_grpc as session_grpc


class SessionCalls:
    """Sessions, transcripts, search, usage and context: SessionService."""

    sessions: session_grpc.SessionServiceStub

    async def _call(self, method: Any, request: Any) -> Any:
        raise NotImplementedError  # SidecarClient's

    async def get_or_create_session(self, source: SourceLike, profile: str | None = None,
                                    force_new: bool = False) -> common.Session:
        check_text(source=source, profile=profile)
        response: session_pb.GetOrCreateSessionResponse
        response = await self._call(self.sessions.GetOrCreateSession, session_pb.GetOrCreateSessionRequest(
            source=as_source(source), profile=profile or "", force_new=force_new))
        return response.session

    async def get_session(self, session_key: str = "", session_id: str = "") -> common.Session:
        check_text(session_key=session_key, session_id=session_id)
        response: session_pb.GetSessionResponse
        response = await self._call(self.sessions.GetSession, session_pb.GetSessionRequest(
            session_key=session_key, session_id=session_id))
        return response.session

    async def list_sessions(self, platform: str = "", active_within_seconds: int = 0,
                            page_size: int = 0, page_token: str = "") -> session_pb.ListSessionsResponse:
        check_text(platform=platform, page_token=page_token)
        check_ints(page_size=page_size)
        check_ints(64, active_within_seconds=active_within_seconds)
        response: session_pb.ListSessionsResponse
        response = await self._call(self.sessions.ListSessions, session_pb.ListSessionsRequest(
            platform=platform, active_within_seconds=active_within_seconds,
            page_size=page_size, page_token=page_token))
        return response

    async def iter_sessions(self, platform: str = "", active_within_seconds: int = 0,
                            page_size: int = 100) -> AsyncIterator[common.Session]:
        """Every session, following next_page_token."""
        token = ""
        while True:
            page = await self.list_sessions(platform, active_within_seconds, page_size, token)
            for session in page.sessions:
                yield session
            if not page.next_page_token:
                return
            token = page.next_page_token

    async def reset_session(self, session_key: str, display_name: str = "") -> common.Session:
        check_text(session_key=session_key, display_name=display_name)
        response: session_pb.ResetSessionResponse
        response = await self._call(self.sessions.ResetSession, session_pb.ResetSessionRequest(
            session_key=session_key, display_name=display_name))
        return response.session

    async def switch_session(self, session_key: str, target_session_id: str) -> common.Session:
        check_text(session_key=session_key, target_session_id=target_session_id)
        response: session_pb.SwitchSessionResponse
        response = await self._call(self.sessions.SwitchSession, session_pb.SwitchSessionRequest(
            session_key=session_key, target_session_id=target_session_id))
        return response.session

    async def suspend_session(self, session_key: str) -> common.Session:
        check_text(session_key=session_key)
        response: session_pb.SuspendSessionResponse
        response = await self._call(self.sessions.SuspendSession, session_pb.SuspendSessionRequest(
            session_key=session_key))
        return response.session

    async def mark_resume_pending(self, session_key: str, reason: str) -> common.Session:
        check_text(session_key=session_key, reason=reason)
        response: session_pb.MarkResumePendingResponse
        response = await self._call(self.sessions.MarkResumePending, session_pb.MarkResumePendingRequest(
            session_key=session_key, reason=reason))
        return response.session

    async def delete_session(self, session_key: str) -> bool:
        check_text(session_key=session_key)
        response: session_pb.DeleteSessionResponse
        response = await self._call(self.sessions.DeleteSession, session_pb.DeleteSessionRequest(
            session_key=session_key))
        return response.deleted

    async def clear_all_sessions(self, confirm: str) -> int:
        """``confirm`` must be the literal ``DELETE ALL SESSIONS``."""
        check_text(confirm=confirm)
        response: session_pb.ClearAllSessionsResponse
        response = await self._call(self.sessions.ClearAllSessions, session_pb.ClearAllSessionsRequest(
            confirm=confirm))
        return response.sessions_deleted

    async def seed_session(self, messages: Iterable[MessageLike], *, source: SourceLike | None = None,
                           session_key: str = "", profile: str | None = None) -> common.Session:
        messages = list(messages)
        check_text(messages=messages, source=source, session_key=session_key, profile=profile)
        response: session_pb.SeedSessionResponse
        response = await self._call(self.sessions.SeedSession, session_pb.SeedSessionRequest(
            source=as_source(source) if source is not None else None, session_key=session_key,
            messages=_args.as_messages(messages), profile=profile or ""))
        return response.session

    async def get_transcript(self, session_id: str, include_rewound: bool = False, page_size: int = 0,
                             page_token: str = "") -> session_pb.GetTranscriptResponse:
        check_text(session_id=session_id, page_token=page_token)
        check_ints(page_size=page_size)
        response: session_pb.GetTranscriptResponse
        response = await self._call(self.sessions.GetTranscript, session_pb.GetTranscriptRequest(
            session_id=session_id, include_rewound=include_rewound, page_size=page_size, page_token=page_token))
        return response

    async def append_messages(self, session_id: str, messages: Iterable[MessageLike]) -> tuple[int, int]:
        """Returns ``(first_seq, last_seq)``; durable when it returns."""
        messages = list(messages)
        check_text(session_id=session_id, messages=messages)
        response: session_pb.AppendMessagesResponse
        response = await self._call(self.sessions.AppendMessages, session_pb.AppendMessagesRequest(
            session_id=session_id, messages=_args.as_messages(messages)))
        return response.first_seq, response.last_seq

    async def rewrite_transcript(self, session_id: str, messages: Iterable[MessageLike]) -> None:
        messages = list(messages)
        check_text(session_id=session_id, messages=messages)
        await self._call(self.sessions.RewriteTranscript, session_pb.RewriteTranscriptRequest(
            session_id=session_id, messages=_args.as_messages(messages)))

    async def rewind_session(self, session_id: str, n: int = 1) -> session_pb.RewindSessionResponse:
        check_text(session_id=session_id)
        check_ints(n=n)
        response: session_pb.RewindSessionResponse
        response = await self._call(self.sessions.RewindSession, session_pb.RewindSessionRequest(
            session_id=session_id, n=n))
        return response

    async def search_messages(self, query: str, session_key: str = "", limit: int = 0) -> list[Any]:
        check_text(query=query, session_key=session_key)
        check_ints(limit=limit)
        response: session_pb.SearchMessagesResponse
        response = await self._call(self.sessions.SearchMessages, session_pb.SearchMessagesRequest(
            query=query, session_key=session_key, limit=limit))
        return list(response.hits)

    async def update_usage(self, session_key: str, delta: common.Usage | Mapping[str, Any],
                           last_prompt_tokens: int = 0, cost_status: str = "") -> common.Session:
        check_text(session_key=session_key, cost_status=cost_status)
        check_ints(64, last_prompt_tokens=last_prompt_tokens)
        usage = _args.build(common.Usage, delta, "delta")
        response: session_pb.UpdateUsageResponse
        response = await self._call(self.sessions.UpdateUsage, session_pb.UpdateUsageRequest(
            session_key=session_key, delta=usage, last_prompt_tokens=last_prompt_tokens,
            cost_status=cost_status))
        return response.session

    async def prune_sessions(self, max_age_days: int) -> int:
        check_ints(max_age_days=max_age_days)
        response: session_pb.PruneSessionsResponse
        response = await self._call(self.sessions.PruneSessions, session_pb.PruneSessionsRequest(
            max_age_days=max_age_days))
        return response.pruned

    async def get_session_context(self, source: SourceLike,
                                  profile: str | None = None) -> session_pb.GetSessionContextResponse:
        check_text(source=source, profile=profile)
        response: session_pb.GetSessionContextResponse
        response = await self._call(self.sessions.GetSessionContext, session_pb.GetSessionContextRequest(
            source=as_source(source), profile=profile or ""))
        return response

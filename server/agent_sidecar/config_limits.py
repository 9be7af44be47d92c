"""``[sidecar.limits]``: the request size and load limits (docs/semantics.md
"Limits"), one declaration each, checked and documented like every key
(config_schema.py). Split from config.py, which re-exports ``Limits``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .config_schema import key


@dataclass
class Limits:
    max_text_bytes: int = key(256 * 1024, ge=1, doc="a prompt's text")
    max_attachment_bytes: int = key(8 * 1024 * 1024, ge=1, doc="one attachment")
    max_attachments: int = key(16, ge=0, doc="attachments per prompt")
    max_messages_per_request: int = key(1000, ge=1, doc="messages in one request")
    max_page_size: int = key(1000, ge=1, doc="the largest page a list call returns")
    default_page_size: int = key(100, ge=1, doc="a list call's page when it asks for none")
    max_frames_per_turn: int = key(20_000, ge=2, doc="frames one turn may produce")
    # A reply travels whole in its turn's `completed` frame (final_text) and in
    # GetTranscript: at 4 bytes a character at most, 900,000 keeps either
    # inside the 4 MiB a gRPC client takes in one message by default.
    max_reply_chars: int = key(512 * 1024, ge=1, le=900_000,
                               doc="characters of one model call's reply, its text and its tool calls' "
                                   "ids, names and arguments; past it the turn fails RESOURCE_EXHAUSTED, "
                                   "the text so far kept")
    max_id_length: int = key(256, ge=1, doc="request ids, display names and other ids (characters)")
    # Load limits (issue 14). A stream (Prompt, WatchActivity) holds this much
    # for its reader: past it, a client that stopped reading is ended with
    # STREAM_TOO_SLOW (it resumes from the store), and one that reads on gets
    # the rest from the store (turns/subscriber.py). Prompts in flight or
    # queued, and the bytes of their text and attachments, are capped
    # sidecar-wide (OVERLOADED; 0: no cap). The defaults keep a hostile burst
    # within a small (2 GB) host.
    stream_buffer_frames: int = key(10_000, ge=1, doc="frames a stream holds for its reader; past "
                                                       "it, a stalled client's stream ends STREAM_TOO_SLOW")
    stream_buffer_bytes: int = key(8 * 1024 * 1024, ge=1, doc="the same bound in bytes")
    max_prompts_in_flight: int = key(1000, ge=0, doc="prompts running or queued, whole sidecar "
                                                     "(0: no cap); past it OVERLOADED")
    max_prompt_bytes_in_flight: int = key(16 * 1024 * 1024, ge=0,
                                          doc="bytes of their text and attachments (0: no cap)")
    # Streams one credential (a token, or the Unix socket) holds open at once:
    # each holds memory while open (api/auth.py StreamQuota).
    max_streams_per_credential: int = key(10_000, ge=0,
                                          doc="Prompt, WatchActivity and ServeTools streams one "
                                              "credential (a token, or the Unix socket) holds open "
                                              "(0: no cap); past it OVERLOADED")
    # Requests of 1 MiB or more being handled at once (api/request_budget.py):
    # each is held several times over while it is parsed and written.
    max_request_bytes_in_flight: int = key(32 * 1024 * 1024, ge=0,
                                           doc="bytes of the large requests (1 MiB or more each) being "
                                               "handled, whole sidecar (0: no cap); past it OVERLOADED")
    # The largest request message accepted, whatever its fields' limits allow
    # (api/caps.py derives each RPC's own, smaller bound from the limits above);
    # gRPC takes it as an int32.
    max_request_bytes: int = key(32 * 1024 * 1024, ge=1, le=2**31 - 1,
                                 doc="the largest request any RPC accepts, the server's gRPC "
                                     "receive limit (each RPC refuses more than its fields allow)")

    def _validate(self) -> Iterator[tuple[str, str, Any]]:
        if self.default_page_size > self.max_page_size:
            yield "default_page_size", f"must be at most max_page_size ({self.max_page_size})", \
                self.default_page_size

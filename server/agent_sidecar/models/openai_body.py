"""Reading an OpenAI-compatible server's HTTP response body within bounds.

The endpoint is whatever the operator configured -- possibly a buggy proxy, a
misconfigured gateway or a hostile server -- so nothing it sends may make the
worker hold more than a bounded amount of memory, or spend unbounded time on
one piece: the worker serves other turns, and a turn's timeout can only act
between awaits. Every read of a response body goes through this module:

- ``chunks``: the body decoded (identity, gzip or deflate; anything else is
  refused), in pieces of at most ``PIECE`` bytes however far the input inflates
  -- httpx's own decoding inflates a whole network read at once, so a few MB of
  gzip become GBs;
- ``read_prefix``: the start of a body (an error's excerpt), the rest unread;
- ``read_all``: a whole body (a non-streamed reply), refused past a cap;
- ``lines``: a body's lines (an event stream), each refused past a cap.

Leaving the response's context closes the connection with whatever was left
unread, so stopping early costs nothing more.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator
from typing import Any

from agent_sidecar.models.base import ModelError

PIECE = 64 * 1024

# What the request's Accept-Encoding offers: exactly what ``chunks`` decodes.
ACCEPT_ENCODING = "gzip, deflate"


def _inflate(decoder: Any, data: bytes) -> list[bytes]:
    """Inflate one network read in pieces of at most PIECE bytes: decompress
    with max_length, then feed the unconsumed input (or drain what is pending)."""
    out: list[bytes] = []
    while True:
        try:
            piece = decoder.decompress(data, PIECE)
        except zlib.error as exc:
            raise ModelError(f"openai backend: the server's compressed body is corrupt ({exc})") from None
        if piece:
            out.append(piece)
        data = decoder.unconsumed_tail
        if not data and len(piece) < PIECE:
            return out


async def chunks(response: Any) -> AsyncIterator[bytes]:
    """The body after its Content-Encoding, piece by piece. The pieces are
    yielded one network read (at most PIECE bytes) at a time, so a consumer
    that stops early never made the rest exist."""
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if encoding in ("", "identity"):
        async for raw in response.aiter_raw():
            yield raw
        return
    if encoding not in ("gzip", "deflate", "x-gzip"):
        raise ModelError(f"openai backend: the server sent Content-Encoding {encoding!r}; "
                         f"only {ACCEPT_ENCODING} (as asked) or none are understood")
    decoder = zlib.decompressobj(32 + zlib.MAX_WBITS)  # a gzip or a zlib header
    async for raw in response.aiter_raw():
        for piece in _inflate(decoder, raw):
            yield piece


async def read_prefix(response: Any, limit: int) -> bytes:
    """At most the first ``limit`` bytes of the body; the rest is never read."""
    got = bytearray()
    async for piece in chunks(response):
        got += piece
        if len(got) >= limit:
            break
    return bytes(got[:limit])


async def read_all(response: Any, cap: int, what: str) -> bytes:
    """The whole body; a ModelError naming ``what`` and the cap as soon as it
    passes ``cap`` bytes (an endless body ends there, not at the turn's timeout)."""
    got = bytearray()
    async for piece in chunks(response):
        got += piece
        if len(got) > cap:
            raise ModelError(f"openai backend: {what} is larger than {cap} bytes (the cap on one reply); "
                             f"it starts: {bytes(got[:200]).decode('utf-8', 'replace')!r}")
    return bytes(got)


async def lines(response: Any, cap: int) -> AsyncIterator[str]:
    """An event stream's lines (split at LF, a CR before it dropped; invalid
    UTF-8 replaced, as httpx did). A line past ``cap`` bytes -- one that never
    ends included -- is a ModelError as soon as it gets there. A last line the
    body did not end (the connection closed in the middle of it) is an event
    cut short, which the SSE format says to drop: only a whole ``data: [DONE]``
    is kept."""
    buffer = bytearray()
    async for piece in chunks(response):
        start = len(buffer)
        buffer += piece
        end = buffer.find(b"\n", start)
        begin = 0
        while end >= 0:
            yield buffer[begin:end].rstrip(b"\r").decode("utf-8", "replace")
            begin = end + 1
            end = buffer.find(b"\n", begin)
        del buffer[:begin]
        if len(buffer) > cap:
            raise ModelError(f"openai backend: an event-stream line is longer than {cap} bytes (the cap on "
                             f"one event); it starts: {bytes(buffer[:200]).decode('utf-8', 'replace')!r}")
    if buffer.strip() == b"data: [DONE]":
        yield "data: [DONE]"

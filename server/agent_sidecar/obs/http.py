"""The ``[metrics] listen`` endpoint: a small HTTP/1.1 server on the event
loop that answers ``GET /metrics`` with the text exposition format.

On the loop, not in a thread (prometheus_client's own server is threaded):
the collectors read the turn engine's dicts and lanes, which only the loop
changes, so a scrape reads them between two loop steps and never while one
is half-changed. A scrape costs the loop the time to format the samples,
about a millisecond for a few hundred of them.

One request per connection (``Connection: close``); a whole exchange that
does not end within EXCHANGE_TIMEOUT_S (a request that never arrives, a
client that stops reading the answer), or a head over MAX_HEAD_BYTES, ends
the connection. At most MAX_CONNECTIONS are served at once, so idle
connections cannot pile up against the file descriptors the gRPC listeners
need; one past that closes the oldest connection still waiting for its
request (a scraper sends its request at once, so the oldest waiting is the
idlest), or, when every one is past its request, is closed itself: a
handful of connections that never send a request cannot keep the scraper
out. The endpoint has no authentication: bind it to a private address.

The body is what ``generate_latest`` writes, the text format 0.0.4, and the
answer says so, whatever version prometheus_client would name by default.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("agent_sidecar.obs")

EXCHANGE_TIMEOUT_S = 10.0
MAX_HEAD_BYTES = 16 * 1024
MAX_CONNECTIONS = 16
PATH = "/metrics"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # the format generate_latest writes


def split_address(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (config.py checked its form); ``[::1]:9464`` for IPv6."""
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


class MetricsServer:
    """``render()`` returns the body of one scrape."""

    def __init__(self, render: Callable[[], Awaitable[bytes]]):
        self.render = render
        self.server: asyncio.Server | None = None
        self.open = 0  # connections being served
        # Those still waiting for their request, oldest first (dicts keep order).
        self._waiting: dict[asyncio.StreamWriter, None] = {}

    async def start(self, listen: str) -> str:
        """Listen on ``listen``; returns the address bound (a port 0 resolved).
        A listener that cannot be bound raises RuntimeError naming the key."""
        host, port = split_address(listen)
        try:
            self.server = await asyncio.start_server(self._serve, host, port, limit=MAX_HEAD_BYTES)
        except OSError as e:
            raise RuntimeError(f"metrics.listen: cannot listen on {listen}: {e.strerror or e}") from None
        bound_port = self.server.sockets[0].getsockname()[1]
        return f"{listen.rpartition(':')[0]}:{bound_port}"

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            try:
                async with asyncio.timeout(2):
                    await self.server.wait_closed()
            except TimeoutError:
                pass
            self.server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.open >= MAX_CONNECTIONS:
            if not self._waiting:
                writer.close()
                return
            idlest = next(iter(self._waiting))
            del self._waiting[idlest]
            idlest.close()  # its read ends (end of stream), and its _serve with it
        self.open += 1
        self._waiting[writer] = None
        try:
            async with asyncio.timeout(EXCHANGE_TIMEOUT_S):
                await self._answer(reader, writer)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, ConnectionError):
            pass  # a client that sent no proper request, or went away: nothing to answer
        finally:
            self._waiting.pop(writer, None)
            self.open -= 1
            writer.close()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        method, target = await _read_head(reader)
        self._waiting.pop(writer, None)
        if method not in ("GET", "HEAD"):
            await _respond(writer, 405, b"only GET\n", extra="Allow: GET, HEAD\r\n")
        elif target.split("?", 1)[0] != PATH:
            await _respond(writer, 404, b"metrics are at /metrics\n")
        else:
            try:
                body = await self.render()
            except Exception:
                log.exception("metrics scrape failed")
                await _respond(writer, 500, b"scrape failed (see the sidecar log)\n")
                return
            await _respond(writer, 200, body, CONTENT_TYPE, head_only=method == "HEAD")


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, str]:
    """The request line's method and target; the headers are read and ignored.
    Lines end at LF, with or without the CR before it (RFC 9112 lets a server
    take a bare LF). A head longer than MAX_HEAD_BYTES in all is refused
    (ValueError), however short its lines: the reader's limit bounds one line
    only, and a client sending header lines without end would be read, on
    the event loop, for as long as it kept sending."""
    first = await reader.readuntil(b"\n")
    line, size = first.decode("latin-1").split(), len(first)
    if len(line) != 3:
        raise ValueError("not an HTTP request line")
    while True:
        header = await reader.readuntil(b"\n")
        size += len(header)
        if size > MAX_HEAD_BYTES:
            raise ValueError("the request's head is too long")
        if not header.strip():
            return line[0], line[1]


_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 500: "Internal Server Error"}


async def _respond(writer: asyncio.StreamWriter, status: int, body: bytes,
                   content_type: str = "text/plain; charset=utf-8", head_only: bool = False,
                   extra: str = "") -> None:
    head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n{extra}\r\n")
    writer.write(head.encode("latin-1") + (b"" if head_only else body))
    await writer.drain()

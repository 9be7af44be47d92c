"""The parent↔worker wire: length-prefixed orjson messages over a socketpair.

A message is a dict with a ``t`` (type) key; the catalogue lives in worker.py
(worker side) and pool.py (parent side). Both ends use a ``Channel``: an
asyncio protocol that parses whole messages out of whatever the socket
delivers, and coalesces everything sent during one event-loop iteration into
one write — a turn's frames, its message and its ``done`` usually cross in one
syscall and wake the other side once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Any, Callable

import orjson

log = logging.getLogger("agent_sidecar.wire")

_HEADER = 4


def encode(msg: dict) -> bytes:
    body = orjson.dumps(msg)
    return len(body).to_bytes(_HEADER, "big") + body


class Channel(asyncio.Protocol):
    def __init__(self, on_message: Callable[[dict], Any], on_lost: Callable[[], Any]):
        self.on_message, self.on_lost = on_message, on_lost
        self.transport: asyncio.Transport | None = None
        self._in = bytearray()
        self._out: list[bytes] = []
        self._scheduled = False

    # -- sending ------------------------------------------------------------------

    def send(self, msg: dict) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self._out.append(encode(msg))
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        out, self._out = self._out, []
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    def close(self) -> None:
        self._flush()
        if self.transport is not None:
            self.transport.close()

    # -- receiving ----------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self._in
        buf += data
        pos, end = 0, len(buf)
        while end - pos >= _HEADER:
            n = int.from_bytes(buf[pos:pos + _HEADER], "big")
            start = pos + _HEADER
            if end - start < n:
                break
            pos = start + n
            try:
                self.on_message(orjson.loads(buf[start:pos]))
            except Exception:
                log.exception("handling a message failed")
        if pos:
            del buf[:pos]

    def connection_lost(self, exc) -> None:
        self.transport = None
        self.on_lost()


async def open_channel(fileno: int, on_message: Callable[[dict], Any],
                       on_lost: Callable[[], Any]) -> Channel:
    """Wrap one end of a multiprocessing Pipe (a Unix socketpair) in a Channel."""
    sock = socket.socket(fileno=os.dup(fileno))
    sock.setblocking(False)
    _, channel = await asyncio.get_running_loop().create_unix_connection(
        lambda: Channel(on_message, on_lost), sock=sock)
    return channel


# -- stream helpers (tests drive a worker through these) --------------------------------

async def read_message(reader: asyncio.StreamReader) -> dict:
    header = await reader.readexactly(_HEADER)
    return orjson.loads(await reader.readexactly(int.from_bytes(header, "big")))


async def open_stream(fileno: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Wrap one end of a multiprocessing Pipe (a Unix socketpair) in asyncio streams."""
    sock = socket.socket(fileno=os.dup(fileno))
    sock.setblocking(False)
    return await asyncio.open_unix_connection(sock=sock, limit=64 * 1024 * 1024)

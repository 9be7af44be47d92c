"""The parent↔worker wire: length-prefixed orjson messages over a socketpair.

Both ends use asyncio streams, so neither side blocks a loop on a partial
message. A message is a dict with a ``t`` (type) key; the catalogue lives in
worker.py (worker side) and pool.py (parent side).
"""

from __future__ import annotations

import asyncio
import os
import socket

import orjson

_HEADER = 4


def encode(msg: dict) -> bytes:
    body = orjson.dumps(msg)
    return len(body).to_bytes(_HEADER, "big") + body


async def read_message(reader: asyncio.StreamReader) -> dict:
    header = await reader.readexactly(_HEADER)
    return orjson.loads(await reader.readexactly(int.from_bytes(header, "big")))


async def open_stream(fileno: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Wrap one end of a multiprocessing Pipe (a Unix socketpair) in asyncio streams."""
    sock = socket.socket(fileno=os.dup(fileno))
    sock.setblocking(False)
    return await asyncio.open_unix_connection(sock=sock, limit=64 * 1024 * 1024)

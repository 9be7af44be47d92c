"""The parent↔worker wire: length-prefixed orjson messages over a socketpair.

A message is a dict with a ``t`` (type) key; the catalogue lives in worker.py
(worker side) and pool.py (parent side). Both ends speak it through a
``children.Channel``; what is here serves the tests, which drive a real
worker over its pipe with plain asyncio streams.
"""

from __future__ import annotations

import asyncio
import os
import socket

import orjson

from ..children import frame


def encode(msg: dict) -> bytes:
    return frame(orjson.dumps(msg))


async def read_message(reader: asyncio.StreamReader) -> dict:
    header = await reader.readexactly(4)
    return orjson.loads(await reader.readexactly(int.from_bytes(header, "big")))


async def open_stream(fileno: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Wrap one end of a multiprocessing Pipe (a Unix socketpair) in asyncio streams."""
    sock = socket.socket(fileno=os.dup(fileno))
    sock.setblocking(False)
    return await asyncio.open_unix_connection(sock=sock, limit=64 * 1024 * 1024)

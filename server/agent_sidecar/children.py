"""The sidecar's spawned children (turn workers, the store writer), both sides.

Child side, ``become_child``: what every child does first: take a name
``top``/``ps -o comm`` shows and a title ``ps -o args`` shows, die with the
parent, and step back in CPU priority. Dying with the parent matters most for
the store writer: a writer that outlived a ``kill -9``'d sidecar could commit
behind the back of the next sidecar's startup recovery. Linux only (prctl);
elsewhere a child notices its parent is gone when its pipe reaches EOF.

Why children run at ``nice +CHILD_NICE``: they are batch processors behind the
parent's event loop. When the cores are busy, a child that wakes for every
message preempts the loop, runs a tiny batch, and sleeps again; a child that
yields to the loop finds more work waiting each time it runs. Measured on the
2-core benchmark machine: ~15% less CPU per turn in the writer and workers and
~10% more turns per second; on an idle machine it changes nothing. Niceness is
relative, and +5 still leaves a child a third of a full share against any
busy process, so nothing is starved.

Both sides, ``Channel``: length-prefixed messages over the multiprocessing
Pipe (a Unix socketpair), in ``multiprocessing.Connection``'s own framing, so
a child may use a plain ``Connection`` on its end. The protocol parses whole
messages out of whatever the socket delivers and coalesces everything sent in
one event-loop iteration into one write — a turn's frames, its message and its
``done`` usually cross in one syscall and wake the other side once. Workers
speak orjson; the store writer speaks pickle.

Parent side, ``spawn``: start a child with ``spawn`` (never fork: grpcio is not
fork-safe), wrap our end in a Channel, wait for the child's hello.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import os
import signal
import socket
import struct
import sys
from collections.abc import Callable
from typing import Any

import orjson

log = logging.getLogger("agent_sidecar.children")

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
CHILD_NICE = 5  # see the module docstring


def _prctl(option: int, arg) -> None:
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0)
    except (OSError, AttributeError):
        pass


TITLE_PREFIX = "agent-sidecar: "
_ROLES = {"sidecar-writer": "store writer", "sidecar-work-": "worker "}  # comm name -> title role


def set_title(role: str) -> None:
    """Show ``agent-sidecar: ROLE`` as this process's command line (``ps -o
    args``, /proc/PID/cmdline), so an operator sees which process is which
    even where ``comm`` is cut to 15 bytes. setproctitle renames the calling
    thread too; its old name is put back, so ``comm`` stays as it was. Without
    setproctitle installed the command line stays as it was."""
    try:
        from setproctitle import setproctitle
    except ImportError:
        return
    try:
        with open("/proc/thread-self/comm", "rb") as f:
            comm = f.read().rstrip(b"\n")
    except OSError:
        comm = b""
    setproctitle(TITLE_PREFIX + role)
    if comm:
        _prctl(_PR_SET_NAME, comm[:15])


def _role(name: str) -> str:
    """The title role of a child named ``name`` ("sidecar-work-1" -> "worker 1")."""
    for prefix, role in _ROLES.items():
        if name.startswith(prefix):
            return role + name[len(prefix):]
    return name


def become_child(name: str, parent_pid: int, title: str | None = None) -> None:
    """Name this process (``comm``, at most 15 bytes are kept) and title it
    (``agent-sidecar: TITLE``; default: the role its name says), ask the
    kernel for SIGKILL when the parent dies, ignore SIGINT/SIGTERM (a Ctrl-C
    reaches the whole process group, and the parent decides when children
    stop), and lower our CPU priority by CHILD_NICE."""
    set_title(title or _role(name))
    _prctl(_PR_SET_NAME, name.encode()[:15])
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        os.nice(CHILD_NICE)
    except OSError:  # not allowed here: run at the parent's priority
        pass
    if os.getppid() != parent_pid:  # the parent died before we asked
        os._exit(1)


def tune_gc() -> None:
    """Called by the parent once it serves and by each child once it is ready.
    Everything built at startup (modules, config, protobuf descriptors,
    restored lanes) lives as long as the process: freeze it out of the cyclic
    GC's reach. A larger first generation suits processes that allocate many
    short-lived objects per message (frames, unpickled jobs, model requests)
    and rarely make cycles."""
    import gc
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


# -- the pipe ----------------------------------------------------------------------------

_LEN = struct.Struct("!i")  # multiprocessing.Connection's header; -1 then "!Q" past 2 GiB
_LEN_LONG = struct.Struct("!Q")


def frame(body: bytes) -> bytes:
    """One message as it travels: its length, then its bytes."""
    if len(body) > 0x7FFFFFFF:
        return _LEN.pack(-1) + _LEN_LONG.pack(len(body)) + body
    return _LEN.pack(len(body)) + body


class Channel(asyncio.Protocol):
    def __init__(self, on_message: Callable[[Any], Any], on_lost: Callable[[], Any],
                 loads: Callable[[bytes | bytearray], Any] = orjson.loads,
                 dumps: Callable[[Any], bytes] = orjson.dumps):
        self.on_message, self.on_lost = on_message, on_lost
        self.loads, self.dumps = loads, dumps
        self.transport: asyncio.Transport | None = None
        self._in = bytearray()
        self._out: list[bytes] = []
        self._scheduled = False

    # -- sending ------------------------------------------------------------------

    def send(self, msg: Any, now: bool = False) -> None:
        """Queue ``msg`` for the write at the end of this loop iteration, or,
        with ``now``, write it (and anything queued before it) at once."""
        if self.transport is None or self.transport.is_closing():
            return
        self._out.append(frame(self.dumps(msg)))
        if now:
            self._flush()
        elif not self._scheduled:
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
        while end - pos >= _LEN.size:
            (n,) = _LEN.unpack_from(buf, pos)
            start = pos + _LEN.size
            if n == -1:
                if end - start < _LEN_LONG.size:
                    break
                (n,) = _LEN_LONG.unpack_from(buf, start)
                start += _LEN_LONG.size
            if end - start < n:
                break
            pos = start + n
            try:
                self.on_message(self.loads(buf[start:pos]))
            except Exception:
                log.exception("handling a message failed")
        if pos:
            del buf[:pos]

    def connection_lost(self, exc) -> None:
        self.transport = None
        self.on_lost()


async def open_channel(fileno: int, on_message: Callable[[Any], Any], on_lost: Callable[[], Any],
                       **codec) -> Channel:
    """Wrap one end of a multiprocessing Pipe in a Channel (``codec``: its
    ``loads``/``dumps``, orjson by default)."""
    sock = socket.socket(fileno=os.dup(fileno))
    sock.setblocking(False)
    _, channel = await asyncio.get_running_loop().create_unix_connection(
        lambda: Channel(on_message, on_lost, **codec), sock=sock)
    return channel


async def spawn(target: Callable, args: tuple, name: str, on_message: Callable[[Any], Any],
                on_lost: Callable[[], Any], timeout: float = 60.0,
                **codec) -> tuple[mp.process.BaseProcess, Channel, Any]:
    """Start ``target(child_end, *args)`` in a spawned process and return
    (process, channel, hello) once its first message, the hello, arrived.
    ``on_message`` gets every later message; ``on_lost`` runs when the
    child's end of the pipe closes (before the hello too, which then fails)."""
    ctx = mp.get_context("spawn")
    parent_end, child_end = ctx.Pipe(duplex=True)
    proc = ctx.Process(target=target, args=(child_end, *args), name=name, daemon=True)
    proc.start()
    child_end.close()
    hello: asyncio.Future = asyncio.get_running_loop().create_future()

    def first_then_on(msg: Any) -> None:
        if hello.done():
            on_message(msg)
        else:
            hello.set_result(msg)

    def lost() -> None:
        if not hello.done():
            hello.set_exception(ConnectionError(f"{name} exited before saying hello"))
        on_lost()

    try:
        channel = await open_channel(parent_end.fileno(), first_then_on, lost, **codec)
    finally:
        parent_end.close()
    return proc, channel, await asyncio.wait_for(hello, timeout)

"""The sidecar's spawned children (turn workers, the store writer), parent
side; child.py is what a child runs first (its name, its title, dying with
the parent, its priority, its blocking pipe).

Both sides, ``Channel``: length-prefixed messages over a Unix socketpair, in
``multiprocessing.Connection``'s own framing, so a child may use a plain
``Connection`` on its end. The protocol parses whole messages out of whatever
the socket delivers and coalesces everything sent in one event-loop
iteration into one write — a turn's frames, its message and its ``done``
usually cross in one syscall and wake the other side once. Workers speak
orjson; the store writer speaks pickle.

Parent side, ``spawn``: start a child as a fresh interpreter (never fork:
grpcio is not fork-safe) running child.main on its end of a socketpair —
not through multiprocessing, whose spawn start method also starts a
resource-tracker process and imports its package into every child; nothing
here needs either. Wrap our end in a Channel, wait for the child's hello.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from .child import CHILD_NICE, FAILED, STOP_SIGNALS, TITLE_PREFIX, become_child, frame, set_title, tune_gc
from .child import LEN as _LEN
from .child import LEN_LONG as _LEN_LONG
from .logs import installed_format

__all__ = ["CHILD_NICE", "TITLE_PREFIX", "Channel", "ChildProcess", "become_child", "frame", "open_channel",
           "set_title", "spawn", "start_together", "tune_gc"]

log = logging.getLogger("agent_sidecar.children")


# -- the pipe ----------------------------------------------------------------------------

class Channel(asyncio.Protocol):
    """``pace_s`` > 0 paces the writes under load. A message sent at least
    ``quiet_s`` after the last write leaves at the end of its loop iteration
    (a turn at a time, a model slower than that per token): waiting would
    gather nothing else and only add latency. One sent sooner than that finds
    the channel busy: it waits until ``pace_s`` after the last write and
    leaves in one write with what else was sent meanwhile, so under load the
    other side wakes and reads once for many messages. A message something
    waits for (``soon``: a tool call, a steer's answer) leaves at the end of
    its loop iteration whatever the pace, with everything sent before it."""

    def __init__(self, on_message: Callable[[Any], Any], on_lost: Callable[[], Any],
                 loads: Callable[[bytes | bytearray], Any] = orjson.loads,
                 dumps: Callable[[Any], bytes] = orjson.dumps, pace_s: float = 0.0,
                 quiet_s: float = 0.0, on_failed: Callable[[str], Any] | None = None):
        self.on_message, self.on_lost = on_message, on_lost
        self.loads, self.dumps = loads, dumps
        self.pace_s, self.quiet_s = pace_s, quiet_s
        self.transport: asyncio.Transport | None = None
        self._in = bytearray()
        self._out: list[bytes] = []
        self._scheduled = False
        self._soon = False  # a flush at the end of this loop iteration is due
        self._written_at = 0.0  # loop time of the last write (with pace_s)
        # A child's last word (child.FAILED, then why it ends), parent side (spawn).
        self.on_failed = on_failed

    # -- sending ------------------------------------------------------------------

    def send(self, msg: Any, now: bool = False, soon: bool = False) -> None:
        """Queue ``msg`` for the next write (paced, see the class), or, with
        ``soon``, for one at the end of this loop iteration, or, with ``now``,
        write it (and anything queued before it) at once."""
        if self.transport is None or self.transport.is_closing():
            return
        self._out.append(frame(self.dumps(msg)))
        if now:
            self._flush()
        elif soon:
            if not self._soon:
                self._soon = True
                asyncio.get_running_loop().call_soon(self._flush)
        elif not self._scheduled:
            self._scheduled = True
            loop = asyncio.get_running_loop()
            since = loop.time() - self._written_at
            if self.pace_s and since < self.quiet_s:  # busy: join the next paced write
                loop.call_later(self.pace_s - since, self._flush)
            else:
                loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = self._soon = False  # a paced flush still due finds nothing, or what came since
        out, self._out = self._out, []
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))
            if self.pace_s:
                self._written_at = asyncio.get_running_loop().time()

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
                if n and buf[start] == FAILED[0]:
                    if self.on_failed is not None:
                        self.on_failed(bytes(buf[start + 1:pos]).decode("utf-8", "replace"))
                    continue
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
    """Wrap one end of a child's socketpair in a Channel (``codec``: its
    ``loads``/``dumps``, orjson by default, ``pace_s`` and ``quiet_s``, and
    on the parent's side ``on_failed``, there from the first byte read)."""
    sock = socket.socket(fileno=os.dup(fileno))
    sock.setblocking(False)
    _, channel = await asyncio.get_running_loop().create_unix_connection(
        lambda: Channel(on_message, on_lost, **codec), sock=sock)
    return channel


# The child's command: find this package where the parent found it, then child.main.
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BOOT = ("import sys; sys.path.insert(0, sys.argv[2]); "
        "from agent_sidecar.child import main; main(int(sys.argv[1]))")


class ChildProcess:
    """A spawned child (what ``spawn`` returns): its pid, whether it lives,
    its exit code (negative: the signal that ended it), why it failed if it
    said so (``failure``, child.FAILED), waiting for it and killing it."""

    def __init__(self, popen: subprocess.Popen):
        self._popen = popen
        self.pid = popen.pid
        self.failure: str | None = None

    def failed(self, why: str) -> None:
        """The child's last word: why it ends (its Channel's ``on_failed``)."""
        self.failure = why

    @property
    def exitcode(self) -> int | None:
        return self._popen.poll()

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    def ending(self) -> dict[str, object]:
        """How it ended, for a log line: ``exitcode`` and, when a signal
        ended it (a negative code), ``signal`` by name ("SIGKILL": the OOM
        killer, or an operator). An exit not reaped yet is ``exitcode``
        None."""
        code = self._popen.poll()
        if code is not None and code < 0:
            try:
                return {"exitcode": code, "signal": signal.Signals(-code).name}
            except ValueError:
                pass
        return {"exitcode": code}

    def join(self, timeout: float | None = None) -> None:
        """Wait for it to exit (and reap it), at most ``timeout`` seconds."""
        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        if self._popen.poll() is None:
            self._popen.kill()


def start_child(target: str, args: tuple, name: str, quiet: bool = False) -> tuple[ChildProcess, socket.socket]:
    """Start ``target`` ("module:function") as ``function(pipe, *args)`` in a
    new interpreter (child.main); returns it and our end of its socketpair.
    ``name`` and this process's log format are the child's for the line it
    writes if it fails before it logs (none if ``quiet``)."""
    ours, theirs = socket.socketpair()
    # Spawned with the stop signals blocked (the mask is inherited; ours is back at once, a
    # signal that came meanwhile delivered then): the child ignores them before it unblocks them.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        popen = subprocess.Popen(
            # the interpreter's own flags (-X, -W, -B ...), as multiprocessing passes them
            # (a private helper of subprocess: typeshed has no stub for it)
            [sys.executable, *subprocess._args_from_interpreter_flags(), "-c", BOOT,  # type: ignore[attr-defined]
             str(theirs.fileno()), _PACKAGE_ROOT],
            stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),), close_fds=True)
    except BaseException:
        ours.close()
        raise
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        theirs.close()
    # The first message: where to import from, and what to run (child.main reads it).
    boot = (list(sys.path), target, args, name, "quiet" if quiet else installed_format())
    ours.sendall(frame(pickle.dumps(boot, protocol=pickle.HIGHEST_PROTOCOL)))
    return ChildProcess(popen), ours


async def spawn(target: str, args: tuple, name: str, on_message: Callable[[Any], Any],
                on_lost: Callable[[], Any], timeout: float = 60.0, quiet: bool = False,
                **codec) -> tuple[ChildProcess, Channel, Any]:
    """Start ``target(child_end, *args)`` (``target``: "module:function") in
    a child process and return (process, channel, hello) once its first
    message, the hello, arrived. ``on_message`` gets every later message;
    ``on_lost`` runs when the child's end of the pipe closes (before the hello
    too). A child that ends without a hello (it failed, it was killed), or
    does not say it within ``timeout`` seconds, is a ConnectionError naming
    it (``name``), its pid and why; it is killed and reaped before that is
    raised, and so when the start is cancelled: no child outlives its start.
    ``quiet``: a child that fails writes no line of its own (the caller
    logs the error, and the child's line once already)."""
    proc, ours = start_child(target, args, name, quiet)
    hello: asyncio.Future = asyncio.get_running_loop().create_future()

    def first_then_on(msg: Any) -> None:
        if hello.done():
            on_message(msg)
        else:
            hello.set_result(msg)

    def lost() -> None:
        if not hello.done():
            hello.set_exception(ConnectionError("ended"))
        on_lost()

    try:
        channel = await open_channel(ours.fileno(), first_then_on, lost, on_failed=proc.failed, **codec)
    except BaseException:
        _end(proc)
        raise
    finally:
        ours.close()
    try:
        async with asyncio.timeout(timeout):
            said = await hello
    except BaseException as e:
        channel.close()
        _end(proc)
        if isinstance(e, ConnectionError):  # it ended first
            why = proc.failure or f"exit status {proc.exitcode}"
            raise ConnectionError(f"{name} (pid {proc.pid}) ended before saying hello: {why}") from None
        if isinstance(e, TimeoutError):
            raise ConnectionError(f"{name} (pid {proc.pid}) did not say hello within {timeout:g} s") from None
        raise
    channel.on_message = on_message  # from now on straight to it (a child says a lot)
    return proc, channel, said


async def start_together(*starts: Awaitable[Any]) -> None:
    """Run child starts (``spawn``s, or what awaits them) at once. If one
    fails, the others are cancelled and awaited before its error is raised:
    a cancelled spawn has killed and reaped its child, so a failed start
    leaves no child running behind the caller (asyncio.gather would let
    the others go on, and end up alive after the caller has given up)."""
    tasks = [asyncio.ensure_future(s) for s in starts]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _end(proc: ChildProcess) -> None:
    """Kill a child whose start failed, and reap it (a killed process exits at once)."""
    proc.kill()
    proc.join(5)

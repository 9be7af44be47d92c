"""What a spawned child of the sidecar (a turn worker, the store writer) runs
first, and its blocking end of the pipe. children.py is the parent's side.

A child is a fresh interpreter (never a fork: grpcio is not fork-safe)
started as ``python -c BOOT FD`` (children.spawn): ``main`` reads one
message from the socket FD — the parent's ``sys.path`` and the target,
``"module:function"`` with its arguments, the child's name and the parent's
log format — and calls ``function(pipe, *args)`` with a ``Pipe`` on that
socket. If that fails, the child says why in one log line and to the parent. Nothing else is imported on the way:
no multiprocessing (whose spawn also starts a resource-tracker process and
imports its whole package into every child), no asyncio (the store writer
blocks on its pipe and never needs an event loop). A child imports what its
target imports, and only that.

The stop signals (``STOP_SIGNALS``) are the parent's to act on: a child
ignores them from its first instruction to its end. The parent spawns it
with them blocked (children.start_child), and ``main`` ignores them before
it unblocks them, so a Ctrl-C, a closed terminal's SIGHUP or ``timeout``'s
SIGTERM reaching the whole process group while children start or run kills
none of them: the parent decides when they stop, and a stop it was asked
for ends as one, not as a child's death (exit 1, no clean-shutdown marker).

``become_child``: take a name ``top``/``ps -o comm`` shows and a title ``ps -o
args`` shows, die with the parent, and step back in CPU priority. Dying with
the parent matters most for the store writer: a writer that outlived a ``kill
-9``'d sidecar could commit behind the back of the next sidecar's startup
recovery. Linux only (prctl); elsewhere a child notices its parent is gone
when its pipe reaches EOF.

Why children run at ``nice +CHILD_NICE``: they are batch processors behind the
parent's event loop. When the cores are busy, a child that wakes for every
message preempts the loop, runs a tiny batch, and sleeps again; a child that
yields to the loop finds more work waiting each time it runs. Measured on the
2-core benchmark machine: ~15% less CPU per turn in the writer and workers and
~10% more turns per second; on an idle machine it changes nothing. Niceness is
relative, and +5 still leaves a child a third of a full share against any
busy process, so nothing is starved.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import sys

# SIGTERM (a supervisor), SIGINT (Ctrl-C), SIGHUP (a closed terminal): each stops the sidecar
# cleanly (runtime.py); the children ignore them all (see the module docstring).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
CHILD_NICE = 5  # see the module docstring

TITLE_PREFIX = "agent-sidecar: "
_ROLES = {"sidecar-writer": "store writer", "sidecar-work-": "worker "}  # comm name -> title role

# One message on the pipe: its length, then its bytes (multiprocessing.Connection's
# framing, so either end may also be a plain Connection): "!i", or -1 then "!Q" past 2 GiB.
LEN = struct.Struct("!i")
LEN_LONG = struct.Struct("!Q")


def frame(body: bytes) -> bytes:
    """One message as it travels: its length, then its bytes."""
    if len(body) > 0x7FFFFFFF:
        return LEN.pack(-1) + LEN_LONG.pack(len(body)) + body
    return LEN.pack(len(body)) + body


class Pipe:
    """A child's blocking end of its socket to the parent: whole messages in,
    whole messages out (``send_bytes``, ``recv_bytes``, ``poll``), as the
    store writer uses it. EOFError once the parent's end is closed."""

    def __init__(self, fd: int):
        self.fd = fd
        self._poller = select.poll()  # not select(): the fd is the parent's number, maybe past 1024
        self._poller.register(fd, select.POLLIN)

    def fileno(self) -> int:
        return self.fd

    def send_bytes(self, body: bytes) -> None:
        view = memoryview(frame(body))
        while view:
            view = view[os.write(self.fd, view):]

    def _read(self, n: int) -> bytes:
        chunks, left = [], n
        while left:
            chunk = os.read(self.fd, min(left, 1 << 20))
            if not chunk:
                raise EOFError("the parent closed the pipe")
            chunks.append(chunk)
            left -= len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def recv_bytes(self) -> bytes:
        (n,) = LEN.unpack(self._read(LEN.size))
        if n == -1:
            (n,) = LEN_LONG.unpack(self._read(LEN_LONG.size))
        return self._read(n)

    def poll(self, timeout: float = 0.0) -> bool:
        """Whether a message (or EOF) is waiting, within ``timeout`` seconds."""
        return bool(self._poller.poll(timeout * 1000))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


# The first byte of a child's last word to the parent (``_failed``): no codec's
# message starts with it (a JSON text starts with "{" or "[", a pickle with 0x80).
FAILED = b"\x00"


def main(fd: int) -> None:
    """The child's entry (children.BOOT): read the target, run it, exit. An
    exception that escapes (an import that fails, a target that raises) is
    one line on stderr in the parent's log format, and the parent hears
    why (``_failed``), instead of a bare traceback in no format."""
    ignore_stop_signals()
    pipe = Pipe(fd)
    name, log_format = "agent-sidecar child", None  # until the parent said
    try:
        path, target, args, name, log_format = pickle.loads(pipe.recv_bytes())
        sys.path[:] = path
        module, _, fn = target.partition(":")
        __import__(module)
        getattr(sys.modules[module], fn)(pipe, *args)
    except SystemExit:
        raise
    except BaseException as e:
        _failed(pipe, name, log_format, e)
        os._exit(1)


def ignore_stop_signals() -> None:
    """Ignore the stop signals, then unblock them: one that came while they
    were blocked (since the parent's spawn) is discarded, not delivered."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def _failed(pipe: Pipe, name: str, log_format: str | None, e: BaseException) -> None:
    """Say why this child ends: one line on stderr (the parent's format, or a
    plain line when it is not known or cannot be made; none when the parent
    said "quiet": it retries a replacement that keeps failing and has the
    first one's line), and the same error to the parent (``FAILED``, then
    its text), which names the child."""
    error = f"{type(e).__name__}: {e}"
    if log_format != "quiet":  # the parent's respawn that keeps failing said it once
        _say(name, log_format, {"child": name, "pid": os.getpid(), "error": error, "where": _where(e)})
    try:
        pipe.send_bytes(FAILED + error.encode("utf-8", "replace"))
    except OSError:  # the parent is gone
        pass


def _say(name: str, log_format: str | None, fields: dict) -> None:
    """The failure's one line on stderr: in ``log_format``, or plain."""
    try:
        from .logs import line_in
        line = line_in(log_format, "ERROR", "agent_sidecar.children", "child process failed", fields)
    except BaseException:  # the logging module is what failed to import
        line = None
    if line is None:
        line = f"agent-sidecar: {name} (pid {fields['pid']}) failed: {fields['error']} (at {fields['where']})"
    try:
        os.write(2, (line + "\n").encode("utf-8", "replace"))
    except OSError:
        pass


def _where(e: BaseException) -> str:
    """Where ``e`` was raised: its innermost frame outside the import machinery."""
    import traceback
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not f.filename.startswith("<frozen ")]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


def _prctl(option: int, arg) -> None:
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0)
    except (OSError, AttributeError):
        pass


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


def become_child(name: str, parent_pid: int, title: str | None = None, nice: int = CHILD_NICE) -> None:
    """Name this process (``comm``, at most 15 bytes are kept) and title it
    (``agent-sidecar: TITLE``; default: the role its name says), ask the
    kernel for SIGKILL when the parent dies (the stop signals ``main``
    ignores already), and lower our CPU priority by ``nice`` (a load
    generator's children keep the parent's: they are the load, not work
    behind it)."""
    set_title(title or _role(name))
    _prctl(_PR_SET_NAME, name.encode()[:15])
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    try:
        if nice:
            os.nice(nice)
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

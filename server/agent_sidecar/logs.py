"""Structured logs: one JSON object a line (default) or plain text.

Every line has an RFC 3339 UTC timestamp (``ts``, millisecond precision). A
line logged while a turn's work runs carries that turn's ``request_id`` and
``session_key`` without the call site naming them: the code that runs a
turn's work binds them in ``TURN`` (a context variable, so an asyncio task
created meanwhile inherits them, and concurrent turns never see each other's).
Fields a call site passes in ``extra`` win over the bound ones.

Pure (no grpc): the workers and the store writer import it.
"""

from __future__ import annotations

import atexit
import contextvars
import logging
import re
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import orjson

_STD = set(vars(logging.makeLogRecord({})))

# (request_id, session_key) of the turn whose work is running, or None.
TURN: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "agent_sidecar_turn", default=None)


def bind_turn(request_id: str, session_key: str) -> contextvars.Token:
    """Lines logged from here on in this context carry the turn's ids;
    ``TURN.reset(token)`` ends that where the context outlives the turn."""
    return TURN.set((request_id, session_key))


class FaultEpisode:
    """One warning per episode of a failure that repeats (a commit retried
    every second or so while the database is away, a reconnect each round, a
    lease renewal every third of a TTL, every call forwarded to a node that
    died): the first at WARNING, the rest at DEBUG until ``ended``, so an
    hour-long outage leaves one line, not thousands."""

    def __init__(self, logger: logging.Logger, msg: str) -> None:
        self._log, self._msg = logger, msg
        self.failing = False

    def failed(self, **fields: object) -> None:
        self._log.log(logging.DEBUG if self.failing else logging.WARNING, self._msg, extra=fields)
        self.failing = True

    def ended(self) -> None:
        self.failing = False


# ".000Z" … ".999Z": a timestamp's end, by its milliseconds.
_MILLIS = tuple(f".{ms:03d}Z" for ms in range(1000))
# What every JSON line has before the fields; a field of the same name does not replace it.
_HEAD = frozenset(("ts", "level", "logger", "msg"))


class _Clock:
    """RFC 3339 UTC timestamps; the seconds part is formatted once a second."""

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def rfc3339(self, t: float) -> str:
        second = int(t)
        if second != self._second:
            self._second, self._prefix = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return self._prefix + _MILLIS[int((t - second) * 1000)]


def _fields(record: logging.LogRecord) -> dict:
    """The record's own fields (``extra``), then the bound turn's ids."""
    return _with_turn({k: v for k, v in vars(record).items() if k not in _STD and not k.startswith("_")})


def _with_turn(fields: dict) -> dict:
    """``fields`` with the bound turn's ids added where it has none (a copy
    only when something is added)."""
    bound = TURN.get()
    if bound is None or ("request_id" in fields and "session_key" in fields):
        return fields
    out = {**fields}
    out.setdefault("request_id", bound[0])
    out.setdefault("session_key", bound[1])
    return out


class _LineFormatter(logging.Formatter):
    """A record as one ``line`` (its time, level, logger, message, fields and
    traceback); the subclasses say how a line reads. ``line`` is also what
    writes lines that are not records (``info_fields``)."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = _Clock()

    def format(self, record: logging.LogRecord) -> str:
        exc = self.formatException(record.exc_info) if record.exc_info else None
        return self.line(record.created, record.levelname, record.name, record.getMessage(),
                         _fields(record), exc)

    def line(self, t: float, level: str, logger: str, msg: str, fields: dict,
             exc: str | None = None) -> str:
        raise NotImplementedError


class JsonFormatter(_LineFormatter):
    """One JSON object a line: ``ts``, ``level``, ``logger``, ``msg``, then the fields."""

    def line(self, t: float, level: str, logger: str, msg: str, fields: dict,
             exc: str | None = None) -> str:
        out = {"ts": self.clock.rfc3339(t), "level": level.lower(), "logger": logger, "msg": msg}
        if _HEAD.isdisjoint(fields):
            out.update(fields)
        else:
            for k, v in fields.items():
                out.setdefault(k, v)
        if exc:
            out["exc"] = exc
        try:
            return orjson.dumps(out, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
        except TypeError:  # an int past 64 bits
            return orjson.dumps(_json_safe(out)).decode()


# Line breaks and other control characters (C0, DEL, C1, the Unicode line separators).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _one_line(value: object) -> str:
    """``value`` as text with its control characters escaped (``\\n``,
    ``\\x1b``): field values come from callers (request ids, chat ids in
    session keys), and a line break in one would start a forged line."""
    text = str(value)
    if _CONTROL.search(text) is None:
        return text
    return _CONTROL.sub(lambda m: m[0].encode("unicode_escape").decode("ascii"), text)


class TextFormatter(_LineFormatter):
    """``TS LEVEL logger: message key=value ...`` for a human at a terminal:
    one event, one line (only a traceback, after it, takes more)."""

    def line(self, t: float, level: str, logger: str, msg: str, fields: dict,
             exc: str | None = None) -> str:
        line = f"{self.clock.rfc3339(t)} {level} {logger}: {_one_line(msg)}"
        if fields:
            line += " " + " ".join(f"{k}={_one_line(v)}" for k, v in fields.items())
        if exc:
            line += "\n" + exc
        return line


class _Handler(logging.StreamHandler):
    """setup()'s handler: a StreamHandler that also writes the lines
    ``info_fields`` holds back (``pending``), always ahead of any record it
    emits, so lines keep the order they were logged in."""

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self.pending: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if self.pending:
            self.write_pending()
        super().emit(record)

    def write_pending(self) -> None:
        with self.lock:  # type: ignore[union-attr]  # createLock() made it
            lines, self.pending = self.pending, []
            if lines:
                try:
                    self.stream.write("".join(lines))
                    self.stream.flush()
                except Exception:  # as StreamHandler.emit: a log line never fails its caller
                    pass


# The handler setup() installed, while it is the root's only one.
_HANDLER: _Handler | None = None


@atexit.register
def _write_pending() -> None:
    """The installed handler's held-back lines, now (at exit; before setup() replaces it)."""
    if _HANDLER is not None:
        _HANDLER.write_pending()


def info_fields(logger: logging.Logger, msg: str, fields: dict) -> None:
    """``logger.info(msg, extra=fields)``, the same line, without building a
    LogRecord when setup()'s handler is the only one it reaches (no handlers
    or filters of the logger's own, the root's handler unchanged): for a line
    written once per turn, where the framework's record costs more than the
    line. Otherwise, and when INFO is off, exactly the framework's call.

    On a thread running an event loop, the line is written with the others
    of the same loop iteration, in one write right after it (a write to a log
    file per turn cost more than the line itself); a line logged by any other
    means meanwhile writes them first, and so does the process's exit. A
    ``kill -9`` loses at most that iteration's lines."""
    if not logger.isEnabledFor(logging.INFO):
        return
    handler, installed = _HANDLER, logging.root.handlers
    if (handler is None or logger.handlers or logger.filters or handler.filters
            or len(installed) != 1 or installed[0] is not handler or handler.level > logging.INFO):
        logger.info(msg, extra=fields)
        return
    formatter = handler.formatter
    assert isinstance(formatter, _LineFormatter)
    line = formatter.line(time.time(), "INFO", logger.name, msg, _with_turn(fields))
    pending = handler.pending
    pending.append(line + "\n")
    if len(pending) == 1:
        aio = sys.modules.get("asyncio")  # not imported (the store writer): no loop runs
        loop = aio._get_running_loop() if aio is not None else None
        if loop is not None:
            loop.call_soon(handler.write_pending)
        else:  # no loop on this thread: at once
            handler.write_pending()


def _json_safe(fields: dict) -> dict:
    """``fields`` as the JSON lines write them: a value JSON has no type for
    (an object, a dict with int keys) as its text; an int past 64 bits too."""
    try:
        return orjson.loads(orjson.dumps(fields, default=str, option=orjson.OPT_NON_STR_KEYS))
    except TypeError:
        return {k: v if isinstance(v, (str, float, bool)) or v is None else str(v) for k, v in fields.items()}


class _Forward(logging.Handler):
    """A worker's one handler (``forward``): each record as a ``log`` message
    to the parent (turns/wire.py), its level, logger, message and fields as
    they are (the turn's ids among them), its traceback as ``exc``. Records
    logged before the pipe is open (before the worker's hello, which must be
    its first message) wait, the first MAX_EARLY of them. The pipe is the
    event loop's: a record logged on another thread (a backend's blocking
    call in an executor) is handed to the loop to send."""

    MAX_EARLY = 1000

    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.send: Callable[[dict], None] | None = None  # set by ``open``, on the loop's thread
        self.loop: Any = None  # its asyncio loop (not imported here: the store writer runs none)
        self.loop_thread = 0
        self.early: list[dict] = []
        self._sending = False  # a record logged while one is sent (by the pipe's code): dropped

    def open(self, send: Callable[[dict], None]) -> None:
        """Called on the event loop whose pipe ``send`` writes to."""
        import asyncio
        self.loop, self.loop_thread = asyncio.get_running_loop(), threading.get_ident()
        self.send = send
        early, self.early = self.early, []
        for msg in early:
            send(msg)

    def emit(self, record: logging.LogRecord) -> None:
        if self._sending:
            return
        try:
            fields = _json_safe(_fields(record))
            if record.exc_info:
                fields["exc"] = logging.Formatter().formatException(record.exc_info)
            msg = {"type": "log", "msg": record.getMessage(), "level": record.levelno,
                   "logger": record.name, **fields}
            if self.send is None or self.loop is None:
                if len(self.early) < self.MAX_EARLY:
                    self.early.append(msg)
            elif threading.get_ident() != self.loop_thread:
                self.loop.call_soon_threadsafe(self.send, msg)
            else:
                self._sending = True
                try:
                    self.send(msg)
                finally:
                    self._sending = False
        except Exception:  # as StreamHandler.emit: a log line never fails its caller
            pass


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """``warnings.showwarning`` of a process that logs (setup, forward): a
    Python warning (a coroutine never awaited, a deprecated call in a
    plugin) is one ``python warning`` line, not the two bare lines the
    warnings module prints to stderr in no format."""
    logging.getLogger("py.warnings").warning("python warning", extra={
        "category": category.__name__, "warning": str(message), "where": f"{filename}:{lineno}"})


# The sidecar's own loggers (Python's warnings are its processes' too): at the
# configured level. Every other logger is a library's (httpx, gRPC, psycopg, a
# model backend plugin's): at ``library_log_level`` (default warning), never
# below the configured level. At debug a library's own lines (a dozen of
# httpcore's per model call, gRPC's per call) would bury the sidecar's.
OWN_LOGGERS = ("agent_sidecar", "py.warnings")


def _set_levels(level: int | str, library_level: int | str) -> None:
    own = _level(level)
    logging.getLogger().setLevel(max(own, _level(library_level)))
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(own)


def _level(level: int | str) -> int:
    return level if isinstance(level, int) else logging.getLevelNamesMapping()[level.upper()]


def levels() -> tuple[int, int]:
    """(the sidecar's level, the libraries') as this process logs: what its
    workers log at (``forward``)."""
    return logging.getLogger(OWN_LOGGERS[0]).getEffectiveLevel(), logging.getLogger().getEffectiveLevel()


def forward(level: int | str, library_level: int | str = logging.WARNING) -> _Forward:
    """In a worker process: every record at its logger's level (``level``
    for the sidecar's, ``library_level`` for a library's, see OWN_LOGGERS)
    goes to the parent, which logs it as its own, at that level, in the
    configured format (``relog``); ``open(send)`` on the result once the
    pipe is open. A worker writes nothing to stderr itself: a library's
    warning (a model backend's, httpx's) would reach it as a bare line in
    no format."""
    handler = _Forward(logging.NOTSET)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    _set_levels(level, library_level)
    warnings.showwarning = _show_warning
    return handler


# What LogRecord's own attributes are named, and what Formatter adds: a field of
# a relogged line by one of these names would make logging refuse the record.
_RESERVED = _STD | {"message", "asctime"}


def relog(msg: dict, **extra: object) -> None:
    """In the parent: a worker's ``log`` message (``_Forward``) logged as the
    worker logged it, at its level and under its logger, with ``extra``."""
    fields = {k: v for k, v in msg.items() if k not in _RESERVED and k not in ("type", "level", "logger")}
    level, text = msg.get("level"), msg.get("msg")  # a line's text, made in the worker: relayed
    logger = logging.getLogger(str(msg.get("logger") or "agent_sidecar.workers"))
    logger.log(level if type(level) is int else logging.INFO, text if type(text) is str else "",
               extra={**extra, **fields})


def installed_format() -> str | None:
    """The format setup() installed ("json", "text"), None before it: what a
    spawned child writes its one line in if it fails before it logs (child.py)."""
    if _HANDLER is None:
        return None
    return "json" if isinstance(_HANDLER.formatter, JsonFormatter) else "text"


def line_in(fmt: str | None, level: str, logger: str, msg: str, fields: dict) -> str | None:
    """One line in format ``fmt`` ("json", "text"), now, without logging set
    up; None for no known format."""
    if fmt not in ("json", "text"):
        return None
    formatter = JsonFormatter() if fmt == "json" else TextFormatter()
    return formatter.line(time.time(), level, logger, msg, fields)


def setup(fmt: str = "json", level: str = "info", library_level: str = "warning") -> None:
    """Log to stderr in ``fmt``: the sidecar's lines from ``level``, the
    libraries' from ``library_level`` or ``level``, the higher (OWN_LOGGERS)."""
    global _HANDLER
    _write_pending()
    handler = _Handler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    _set_levels(level, library_level)
    _HANDLER = handler
    warnings.showwarning = _show_warning

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

import contextvars
import logging
import sys
import time

import orjson

_STD = set(vars(logging.makeLogRecord({})))

# (request_id, session_key) of the turn whose work is running, or None.
TURN: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "agent_sidecar_turn", default=None)


def bind_turn(request_id: str, session_key: str) -> contextvars.Token:
    """Lines logged from here on in this context carry the turn's ids;
    ``TURN.reset(token)`` ends that where the context outlives the turn."""
    return TURN.set((request_id, session_key))


class _Clock:
    """RFC 3339 UTC timestamps; the seconds part is formatted once a second."""

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def rfc3339(self, t: float) -> str:
        second = int(t)
        if second != self._second:
            self._second, self._prefix = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._prefix}.{int((t - second) * 1000):03d}Z"


def _fields(record: logging.LogRecord) -> dict:
    """The record's own fields (``extra``), then the bound turn's ids."""
    out = {k: v for k, v in vars(record).items() if k not in _STD and not k.startswith("_")}
    bound = TURN.get()
    if bound is not None:
        out.setdefault("request_id", bound[0])
        out.setdefault("session_key", bound[1])
    return out


class JsonFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        self.clock = _Clock()

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": self.clock.rfc3339(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in _fields(record).items():
            out.setdefault(k, v)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


class TextFormatter(logging.Formatter):
    """``TS LEVEL logger: message key=value ...`` for a human at a terminal."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = _Clock()

    def format(self, record: logging.LogRecord) -> str:
        line = f"{self.clock.rfc3339(record.created)} {record.levelname} {record.name}: {record.getMessage()}"
        fields = _fields(record)
        if fields:
            line += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup(fmt: str = "json", level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())

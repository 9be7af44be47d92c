"""Checking a config's values against their keys (config_schema.py declares
them): what a value of each type and range may be, the syntax of the
addresses a key takes, and the problems found, collected so that one run
reports them all, each as ``config error: KEY: WHAT (got VALUE)``.

Checking never coerces: ``42`` is no string, ``true`` is no integer; an
integer is accepted where a number (float) is. Every integer fits in 64 bits
and every string is UTF-8, inside free tables (``dict[str, Any]``) too, which
nest MAX_DEPTH levels at most: what passes the check, a turn can encode.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from .config_schema import members_of

# Every integer of a config fits in 64 bits (orjson, SQLite and gRPC take no
# more), and a free-form table (``model_options``) nests this deep at most.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_DEPTH = 32


# -- problems -----------------------------------------------------------------------------

def short(value: Any) -> str:
    """A value as the error messages show it (TOML-like, at most 60 characters)."""
    if isinstance(value, bool):
        s = "true" if value else "false"
    elif isinstance(value, str):
        s = json.dumps(value, ensure_ascii=not utf8(value))
    elif isinstance(value, list):
        s = "[" + ", ".join(short(v) for v in value[:8]) + (", ..." if len(value) > 8 else "") + "]"
    elif isinstance(value, dict):
        s = "{" + ", ".join(f"{k} = {short(v)}" for k, v in list(value.items())[:4]) + \
            (", ..." if len(value) > 4 else "") + "}"
    else:
        try:
            s = repr(value)
        except ValueError:  # an integer of more than 4300 digits
            s = f"an integer of {value.bit_length()} bits"
    return s if len(s) <= 60 else s[:57] + "..."


_NOTHING = object()  # "got" left out of a message
_KINDS = ((bool, "a boolean"), (int, "an integer"), (float, "a float"), (str, "a string"),
          (list, "an array"), (dict, "a table"))


def kind_of(value: Any) -> str:
    """What a TOML value is ("a string", "a table"...), for a shape error."""
    return next((name for tp, name in _KINDS if isinstance(value, tp)), "a date or time")


class Problems:
    """The problems found so far; ``sources`` names where a key's value came
    from when not from the file (an environment variable, a flag)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.sources: dict[str, str] = {}

    def add(self, where: str, what: str, got: Any = _NOTHING) -> None:
        line = f"config error: {where}: {what}"
        if got is not _NOTHING:
            line += f" (got {short(got)})"
        source = self._source(where)
        if source:
            line += f" [from {source}]"
        self.lines.append(line)

    def reported(self, where: str) -> bool:
        """Whether a problem was reported at ``where`` or inside it (a value
        already refused is not checked again as a whole)."""
        return any(line.startswith((f"config error: {where}: ", f"config error: {where}.",
                                    f"config error: {where}[")) for line in self.lines)

    def shape(self, where: str, what: str, got: Any) -> None:
        """A value of the wrong kind where a table or an array belongs. Its
        kind is shown, never the value: what a table holds may be a secret
        (``[auth.tokens]`` written with one pair of brackets)."""
        self.add(where, f"{what} (got {kind_of(got)})")

    def _source(self, where: str) -> str | None:
        while where:
            if where in self.sources:
                return self.sources[where]
            cut = max(where.rfind("."), where.rfind("["))
            where = where[:cut] if cut > 0 else ""
        return None


BAD = object()  # a value that failed its check (already reported)


# -- checking values ----------------------------------------------------------------------

_EXPECTED = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def matches(tp: Any, value: Any) -> bool:
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return is_number(value) and finite(value)
    return isinstance(value, tp)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        return False


def utf8(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (an environment variable's invalid
    byte arrives as a lone surrogate, which does not)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def metadata_safe(text: str) -> bool:
    """Whether gRPC metadata can carry ``text`` as a value: printable ASCII
    (a bearer token with a newline or a non-ASCII letter cannot be sent)."""
    return all(" " <= c <= "~" for c in text)


def check_scalar(tp: Any, md: Mapping[str, Any], value: Any, where: str, out: Problems) -> Any:
    """``value`` checked against a scalar type and the key's range; returns it
    (a float for a number, a string folded as ``fold`` says) or BAD."""
    members = members_of(tp)
    kind = next((t for t in members if matches(t, value)), None)
    if kind is None:
        expected = " or ".join(_EXPECTED[t] for t in members)
        if float in members and is_number(value):
            expected = "a finite number"
        out.add(where, f"expected {expected}", "***" if md.get("secret") else value)
        return BAD
    if kind is float:
        value = float(value)
    problem = None
    if kind is int and not INT64_MIN <= value <= INT64_MAX:
        problem = "must fit in 64 bits (-2^63 to 2^63-1)"
    elif kind is str and not utf8(value):
        problem = "must be valid UTF-8 (it has an undecodable byte)"
    elif kind in (int, float):
        if "ge" in md and value < md["ge"]:
            problem = f"must be at least {md['ge']}"
        elif "gt" in md and value <= md["gt"]:
            problem = f"must be more than {md['gt']}"
        elif "le" in md and value > md["le"]:
            problem = f"must be at most {md['le']}"
    elif kind is str:
        if md.get("fold"):
            value = value.lower() if md["fold"] == "lower" else value.upper()
        if md.get("choices") and value not in md["choices"]:
            problem = "must be " + (" or ".join(md["choices"]) if len(md["choices"]) < 3 else
                                   "one of " + ", ".join(md["choices"]))
            if int in members:
                problem += " (or an integer)"
        elif (md.get("nonempty") or md.get("required")) and not value:
            problem = "must not be empty"
    if problem is None and md.get("check"):
        problem = md["check"](value)
    if problem:
        out.add(where, problem, "***" if md.get("secret") else value)
        return BAD
    return value


def check_free(value: Any, where: str, out: Problems, depth: int = 0) -> bool:
    """A value of a free-form table (``model_options``), recursively: its
    integers fit in 64 bits, its strings (keys too) are UTF-8, it nests at
    most MAX_DEPTH levels; what a turn's dispatch could not encode is refused."""
    if isinstance(value, (dict, list)):
        if depth >= MAX_DEPTH:
            out.add(where, f"nested too deeply (at most {MAX_DEPTH} levels)")
            return False
        ok = True
        for k, v in (value.items() if isinstance(value, dict) else enumerate(value)):
            path = f"{where}[{k}]" if isinstance(k, int) else f"{where}.{k}"
            if isinstance(k, str) and not utf8(k):
                out.add(path, "a key must be valid UTF-8 (it has an undecodable byte)")
                ok = False
            elif not check_free(v, path, out, depth + 1):
                ok = False
        return ok
    if isinstance(value, int) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX:
        out.add(where, "must fit in 64 bits (-2^63 to 2^63-1)", value)
        return False
    if isinstance(value, str) and not utf8(value):
        out.add(where, "must be valid UTF-8 (it has an undecodable byte)", value)
        return False
    return True


# -- addresses ----------------------------------------------------------------------------

_LABEL = r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)"
_HOST_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")
_PORT = re.compile(r"[0-9]{1,5}")


UNIX_PATH_MAX = 107  # a sockaddr_un's path (108 bytes) less its NUL: what bind() and gRPC take


def unix_path(path: str) -> str | None:
    """None when ``path`` can name a Unix socket; else what is wrong with it
    (empty, or longer than the kernel takes: gRPC would fail only when it
    binds or dials, with its own message)."""
    if not path:
        return "a Unix socket needs a path (unix:PATH)"
    n = len(path.encode("utf-8", "surrogateescape"))
    if n > UNIX_PATH_MAX:
        return f"a Unix socket path may be at most {UNIX_PATH_MAX} bytes; this one is {n}"
    return None


def host_port(value: str, port0: bool = True) -> str | None:
    """None when ``value`` is ``HOST:PORT``: HOST a bracketed IPv6 address
    (``[::1]``), an IPv4 address or a host name, PORT 0 (``port0``: any free
    port) or 1 to 65535; else what is wrong with it."""
    host, sep, port = value.rpartition(":")
    if not sep or not _PORT.fullmatch(port) or int(port) > 65535 or (int(port) == 0 and not port0):
        return f"the port must be {0 if port0 else 1} to 65535"
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return "no IPv6 address in the brackets"
        return None
    if ":" in host or "[" in host or "]" in host:
        return "an IPv6 address goes in brackets, e.g. [::1]:PORT"
    if not (_HOST_NAME.fullmatch(host) and len(host) <= 253):
        return "the host is no IP address or host name"
    if host.rstrip(".").rpartition(".")[2].isdigit():  # all-numeric: no top-level domain is
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return "the host is no IPv4 address"
    return None

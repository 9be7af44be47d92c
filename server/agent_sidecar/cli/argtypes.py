"""argparse types for the commands' options: one rule, one message each.

A value that cannot be what the option means is refused by argparse (exit
status 2, the option named), not passed on: NaN and infinity pass a ``< 0``
check and would come back later as a traceback from the event loop's timers
or as a DEADLINE_EXCEEDED that hides the typo; text that is not UTF-8 as a
traceback from the request's encoder; a token gRPC metadata cannot carry as
INTERNAL "Invalid metadata"; a target in no client's form (a port past 65535,
a socket path gRPC looks up as a host name) as a connection that fails later.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from ..config_checks import metadata_safe
from ..config_checks import utf8 as is_utf8
from ..targets import address, dial

# The longest a time option of a command may be: past it a value is a typo
# (milliseconds given as seconds, an exponent), and waiting it out would look
# like a hang (seconds; a week).
MAX_SECONDS = 7 * 24 * 3600.0


def _number(kind: type, *, zero_ok: bool, at_most: float | None = None) -> Callable[[str], float]:
    rule = ">= 0" if zero_ok else "> 0"
    if at_most is not None:  # as a number is written: 1000000, not 1e+06
        rule += f" and <= {int(at_most) if float(at_most).is_integer() else at_most}"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} must be a finite number {rule}")
        if value < 0 or (value == 0 and not zero_ok) or (at_most is not None and value > at_most):
            raise argparse.ArgumentTypeError(f"{text!r} must be {rule}")
        return value
    return parse


def positive(kind: type, at_most: float | None = None) -> Callable[[str], float]:
    """A finite number above 0 (and at most ``at_most``), parsed as ``kind`` (int or float)."""
    return _number(kind, zero_ok=False, at_most=at_most)


def non_negative(kind: type, at_most: float | None = None) -> Callable[[str], float]:
    """A finite number of at least 0 (and at most ``at_most``), parsed as ``kind`` (int or float)."""
    return _number(kind, zero_ok=True, at_most=at_most)


def utf8(text: str) -> str:
    """Text a request can carry: an argument with bytes that are not UTF-8
    (Python keeps them as surrogates) is refused here, not by the encoder."""
    if not is_utf8(text):
        raise argparse.ArgumentTypeError("not valid UTF-8")
    return text


def target(text: str) -> str:
    """``--target``: one address in a form every client takes (targets.py:
    a socket path, ``unix:PATH``, ``HOST:PORT``, ``tcp:``, ``dns:``...),
    kept as given; the command dials ``targets.dial`` of it."""
    try:
        dial(utf8(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def target_list(text: str) -> list[str]:
    """The bench's ``--target``: one address or several, comma-separated,
    each read as ``target`` reads one, none given twice (however spelled)."""
    addresses = [a.strip() for a in utf8(text).split(",")]
    if len(addresses) > 1 and not all(addresses):
        raise argparse.ArgumentTypeError(f"{text[:120]!r}: an empty address")
    for a in addresses:
        target(a)
    if len({address(a) for a in addresses}) < len(addresses):
        raise argparse.ArgumentTypeError(f"{text[:120]!r}: an address given twice")
    return addresses


def file_name(text: str) -> str:
    """A file an option names: a name, not nothing. An empty one (``--config
    "$UNSET"``) read as no option at all: serve ran on the defaults, config
    check said ok, --json and --plot wrote nothing, --render '' ran a bench,
    --ca '' dropped TLS; ``backup ''`` copied the whole store to
    ``.partial`` here, then failed renaming it to '' with a traceback."""
    if not text:
        raise argparse.ArgumentTypeError("an empty file name")
    return text


def token(text: str) -> str:
    """A bearer token gRPC metadata can carry: printable ASCII. The value is
    never echoed (it is a password)."""
    if not text or not metadata_safe(text):
        raise argparse.ArgumentTypeError("a bearer token is printable ASCII (not shown)")
    return text

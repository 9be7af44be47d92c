"""What the client's calls take, and the checks that name a bad argument.

Sources and messages may be dicts of the proto's field names; a delivery mode
its name. ``check_text`` is the one check of the strings a call sends: a string
protobuf cannot encode (one holding a lone surrogate such as ``"\\ud800"``,
which UTF-8 cannot carry) is refused before anything is built or sent, as
``InvalidArgument`` naming the field, instead of protobuf's UnicodeEncodeError
naming none.
"""

from __future__ import annotations

import ipaddress
import math
import operator
import os
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any, TypeVar, cast

from google.protobuf.message import Message

from agent_sidecar_client import errors
from agent_sidecar_client._proto import common_pb2 as common
from agent_sidecar_client._proto import prompt_service_pb2 as prompt_pb

_DELIVERY = {
    "follow_up": prompt_pb.DELIVERY_MODE_FOLLOW_UP,
    "reject_if_busy": prompt_pb.DELIVERY_MODE_REJECT_IF_BUSY,
    "queue": prompt_pb.DELIVERY_MODE_QUEUE,
    "interrupt": prompt_pb.DELIVERY_MODE_INTERRUPT,
    "rollback": prompt_pb.DELIVERY_MODE_ROLLBACK,
    "steer": prompt_pb.DELIVERY_MODE_STEER,
}

SourceLike = common.SessionSource | Mapping[str, Any]
MessageLike = common.Message | Mapping[str, Any]


M = TypeVar("M", bound=Message)


def build(cls: type[M], value: M | Mapping[str, Any], field: str) -> M:
    """``value`` as a ``cls`` message: itself, or built from a dict of its
    field names. A key the message lacks, or a value its field cannot take
    (``{"content": 5}``), is ``InvalidArgument`` naming ``field.key``:
    protobuf's own errors ("bad argument type for built-in operation") name
    no field. Only a failed build looks for the culprit, key by key."""
    if isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise _invalid(field, f"expected a dict or {cls.__name__}, got {type(value).__name__}")
    try:
        return cls(**value)
    except (TypeError, ValueError) as exc:
        for key, item in value.items():
            try:
                cls(**{key: item})
            except ValueError:
                raise _invalid(f"{field}.{key}", f"{cls.__name__} has no such field") from None
            except TypeError as e:
                raise _invalid(f"{field}.{key}", f"{type(item).__name__} does not fit this field ({e})") from None
        raise _invalid(field, str(exc)) from None


def as_source(source: SourceLike, field: str = "source") -> common.SessionSource:
    """A SessionSource from a proto or a dict of its field names."""
    return build(common.SessionSource, source, field)


def as_messages(messages: list[MessageLike]) -> list[common.Message]:
    """Each a Message, from a proto or a dict (``messages[i]`` in errors)."""
    return [build(common.Message, m, f"messages[{i}]") for i, m in enumerate(messages)]


def as_delivery(delivery: str | int) -> prompt_pb.DeliveryMode:
    """'follow_up', 'QUEUE', 'DELIVERY_MODE_STEER' or the enum value."""
    if isinstance(delivery, int):
        return cast(prompt_pb.DeliveryMode, delivery)  # a proto enum value is its int
    name = delivery.lower().removeprefix("delivery_mode_")
    try:
        return _DELIVERY[name]
    except KeyError:
        raise ValueError(f"unknown delivery {delivery!r}; one of {sorted(_DELIVERY)}") from None


def check_text(**fields: Any) -> None:
    """Raise ``InvalidArgument`` naming the first string among ``fields`` that
    protobuf cannot encode: ``text``, or inside a dict or list ``source.chat_id``,
    ``messages[2].content``; and a field given as neither a string nor None
    nor a container (``session_key=5``). Proto messages are skipped (protobuf
    refused such a string when they were built); inside a dict or list,
    anything that is not a str, dict, list or tuple is left to ``build``."""
    for name, value in fields.items():
        if value is not None and not isinstance(value, str | Mapping | list | tuple | Message):
            raise _invalid(name, f"expected a string, got {type(value).__name__}")
        _check(name, value)


def check_ints(bits: int = 32, **fields: Any) -> None:
    """Raise ``InvalidArgument`` naming the first of ``fields`` that is no
    integer (a bool or a float is not one; an integer of another type, numpy's
    say, is one, as protobuf takes it) or does not fit its signed
    ``bits``-bit field, before anything is sent: protobuf's own ValueError
    ("Value out of range") and TypeError name no field, and the Go and Node
    clients refuse these naming the argument too."""
    for name, value in fields.items():
        try:  # any integer type protobuf takes (numpy's too: __index__), never a bool
            number = operator.index(value) if not isinstance(value, bool) else None
        except TypeError:
            number = None
        if number is None:
            raise _invalid(name, f"expected an integer, got {type(value).__name__}")
        if not -(1 << (bits - 1)) <= number < 1 << (bits - 1):
            raise _invalid(name, f"{number} is out of the int{bits} range")


def check_resume_point(by_request: bool, after_seq: int, after_cursor: int) -> None:
    """A watch by ``request_id`` resumes after ``after_seq``, one by session
    key or platform after ``after_cursor``: the other one, given, is refused
    naming it, as the sidecar refuses it, rather than dropped (a replay
    silently reduced to live frames loses the frames asked for)."""
    if by_request and after_cursor:
        raise _invalid("after_cursor", "applies only with session_key or platform")
    if not by_request and after_seq:
        raise _invalid("after_seq", "applies only with request_id")


def _invalid(field: str, why: str) -> errors.InvalidArgument:
    return errors.InvalidArgument(message=f"{field}: {why}", field_violations=[(field, why)])


def _check(field: str, value: Any) -> None:
    if isinstance(value, str):
        if value.isascii():
            return
        try:
            value.encode()
        except UnicodeEncodeError as exc:
            raise _invalid(field, f"has a lone surrogate at index {exc.start} (UTF-8 cannot carry it)") from None
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _check(f"{field}.{key}", item)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check(f"{field}[{i}]", item)


# The longest gRPC timeout a call is given: gRPC makes it an absolute
# deadline in int64 nanoseconds since the epoch, which a timeout past ~7.4e9 s
# (in 2026) wraps into the past, so every call failed DEADLINE_EXCEEDED at
# once. A billion seconds (31 years) is no deadline in practice, and safe.
MAX_CALL_TIMEOUT_S = 1e9


class Deadline:
    """The remaining part of an overall timeout, for the calls of one turn."""

    def __init__(self, timeout: float | None) -> None:
        if timeout is not None and not (timeout > 0 and math.isfinite(timeout)):  # NaN fails both
            raise ValueError(f"timeout: {timeout!r} is no deadline; seconds above 0, or None for none")
        self.timeout = timeout
        self._end = None if timeout is None else time.monotonic() + timeout

    def left(self) -> float | None:
        """The gRPC timeout for the next call (at least 1 ms, at most
        MAX_CALL_TIMEOUT_S); None without a timeout."""
        left = self.remaining()
        return None if left is None else min(MAX_CALL_TIMEOUT_S, max(0.001, left))

    def remaining(self) -> float | None:
        """Seconds left, <= 0 once passed; None without a timeout."""
        return None if self._end is None else self._end - time.monotonic()


# The longest Unix socket path: a sockaddr_un's 108-byte sun_path less its
# NUL. gRPC's C-core refuses a longer one only when it resolves the target
# ("Path name should not have more than 107 characters", dumped to stderr),
# which then shows as UNAVAILABLE after the whole wait; the sidecar refuses to
# listen on one.
UNIX_PATH_MAX = 107


TARGET_GRAMMAR = ("unix:PATH, unix:///ABS/PATH, a bare socket path (/abs/path, ./rel/path, ../rel/path), "
                  "HOST:PORT, [IPV6]:PORT, tcp:HOST:PORT (or tcp://HOST:PORT), dns:[//AUTHORITY/]HOST:PORT")
_HOST_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._")


def normalize_target(target: object) -> str:
    """The gRPC target for one of the client target forms, or ValueError at once.

    The forms (the same in the Go and Node clients): ``unix:PATH``,
    ``unix:///abs/path``, ``unix-abstract:NAME``, a bare socket path
    (``/abs/path``, ``./rel``, ``../rel``), ``host:port``, ``[v6]:port``,
    ``tcp:host:port`` (or ``tcp://host:port``) and ``dns:[//authority/]host:port``.
    A Unix socket path is at most 107 bytes of UTF-8 (percent-escapes decoded,
    as gRPC's C-core reads it) and no directory (as the Go client checks); a
    port is 1..65535 and always given.
    """
    if not isinstance(target, str):
        raise TypeError(f"target: expected a string ({TARGET_GRAMMAR}), got {type(target).__name__}")

    def bad(why: str) -> ValueError:
        return ValueError(f"target: {target!r} {why}; expected one of {TARGET_GRAMMAR}")

    t = target
    if t.strip() == "":
        raise bad("is empty")
    if t != t.strip():
        raise bad("has leading or trailing whitespace")
    if t.startswith(("/", "./", "../")):
        t = "unix:" + t
    scheme, sep, rest = t.partition(":")
    if sep and scheme in ("unix", "unix-abstract"):
        if rest.startswith("//"):  # unix://[authority]/path: the path keeps its "/"
            slash = rest.find("/", 2)
            rest = "" if slash < 0 else rest[slash:]
        path = rest.split("?", 1)[0].split("#", 1)[0]
        if path in ("", "/"):
            raise bad("has no socket path")
        raw = urllib.parse.unquote_to_bytes(path.encode("utf-8", "surrogatepass"))
        if len(raw) > UNIX_PATH_MAX:
            raise ValueError(f"target: a Unix socket path may be at most {UNIX_PATH_MAX} bytes; this one is {len(raw)}")
        if scheme == "unix" and os.path.isdir(raw):
            # A sidecar's data dir given for its socket: no wait would ever connect.
            raise ValueError(f"target: {path} is a directory, not a socket (a sidecar listens on "
                             f"sidecar.sock in its data dir)")
        return f"{scheme}:{rest}"  # without an authority, which gRPC's core will not dial
    if sep and scheme == "tcp":
        address = rest[2:] if rest.startswith("//") else rest
        _check_host_port(address, bad)
        return address
    if sep and scheme == "dns":
        _check_host_port(_dns_address(rest), bad)
        return t
    if sep and scheme.lower() in ("ipv4", "ipv6"):  # gRPC's own: read as host "ipv4", it was told of brackets
        raise bad(f"has gRPC's {scheme}: scheme, which this client does not dial: give the address alone "
                  "(host:port, [v6]:port)")
    if "://" in t or (sep and not rest[:1].isdigit() and not t.startswith("[")):
        raise bad("has a scheme this client does not dial")
    _check_host_port(t, bad)
    return t


def target_address(target: object) -> str:
    """Where a target in one of ``normalize_target``'s forms connects:
    ``unix:PATH`` (``unix-abstract:NAME``) or ``HOST:PORT`` (``[V6]:PORT``),
    its gRPC target with a ``dns:`` scheme and authority dropped. For a tool
    that looks the address up (is it this host's, which process listens
    there) rather than dials it, so it reads every form as the client does;
    ValueError (TypeError) as normalize_target."""
    t = normalize_target(target)
    return _dns_address(t[len("dns:"):]) if t.startswith("dns:") else t


def _dns_address(rest: str) -> str:
    """``HOST:PORT`` of what follows ``dns:``: ``[//AUTHORITY/]HOST:PORT``."""
    if rest.startswith("//"):
        slash = rest.find("/", 2)
        return "" if slash < 0 else rest[slash + 1:]
    return rest


def _check_host_port(address: str, bad: Any) -> None:
    if address.startswith("["):
        host, close, port = address[1:].partition("]")
        if not close or not port.startswith(":"):
            raise bad("is not [ipv6]:port")
        port = port[1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise bad(f"has {host!r}, which is no IPv6 address") from None
    else:
        host, sep, port = address.rpartition(":")
        if not sep:
            raise bad("has no port (host:port)")
        if ":" in host:
            raise bad("is not host:port (an IPv6 address goes in brackets: [::1]:50051)")
        if host == "" or not set(host) <= _HOST_CHARS or host.strip(".") == "":
            raise bad("has no valid host (host:port)")
    if not (port.isdigit() and port.isascii() and 1 <= int(port) <= 65535):
        raise bad(f"has port {port!r}; a port is 1..65535")


def check_target(target: object) -> None:
    """Raise ValueError (TypeError for a non-string) when ``target`` is none of
    the client's target forms (``normalize_target``)."""
    normalize_target(target)

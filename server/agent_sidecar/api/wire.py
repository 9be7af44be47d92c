"""Read the protobuf wire format just far enough to name a field in an error.

The boundary refuses a request that is too large, or that protobuf cannot
parse, without a parsed message at hand; to still say *which* field is at
fault (``messages[2].content``, not just "the request") it walks the raw bytes:
tags and lengths only, nothing copied but the one string it checks for UTF-8.
A walk stops at bytes it cannot follow, and after ``MAX_FIELDS`` fields, so
the walk of a hostile request costs no more than a short one; then it names
what it had reached, or "request" (the message as a whole).
"""

from __future__ import annotations

from google.protobuf.descriptor import Descriptor, FieldDescriptor

_VARINT, _FIXED64, _LEN, _SGROUP, _EGROUP, _FIXED32 = range(6)
MAX_DEPTH = 32       # protobuf's own nesting limit is 100; no request of ours nests past 3
MAX_FIELDS = 10_000  # fields one walk reads at most


class Corrupt(Exception):
    """The bytes stop following the wire format here (or the walk's budget ran out)."""


class _Walk:
    def __init__(self, data: bytes):
        self.data = memoryview(data)
        self.budget = MAX_FIELDS

    def varint(self, i: int, end: int) -> tuple[int, int]:
        value, shift, data = 0, 0, self.data
        while True:
            if i >= end or shift > 63:
                raise Corrupt
            b = data[i]
            i += 1
            value |= (b & 0x7F) << shift
            if b < 0x80:
                return value, i
            shift += 7

    def value(self, tag: int, i: int, end: int, depth: int) -> tuple[int, int]:
        """(start, stop) of the value after a tag; stop may lie past ``end``."""
        wt = tag & 7
        if wt == _VARINT:
            return i, self.varint(i, end)[1]
        if wt == _FIXED64:
            return i, i + 8
        if wt == _FIXED32:
            return i, i + 4
        if wt == _LEN:
            n, start = self.varint(i, end)
            return start, start + n
        if wt == _SGROUP and depth < MAX_DEPTH:
            return i, self.group(tag >> 3, i, end, depth + 1)
        raise Corrupt  # an end-group without its start, wire types 6 and 7

    def group(self, number: int, i: int, end: int, depth: int) -> int:
        while True:
            tag, i = self.varint(i, end)
            if tag & 7 == _EGROUP:
                if tag >> 3 != number:
                    raise Corrupt
                return i
            i = self.value(tag, i, end, depth)[1]
            if i > end:
                raise Corrupt

    def fields(self, i: int, end: int, depth: int):
        """(number, wire type, start, stop) per field of data[i:end]; a last
        field that announces more bytes than there are comes with stop None,
        then Corrupt."""
        while i < end:
            self.budget -= 1
            if self.budget < 0:
                raise Corrupt
            tag, i = self.varint(i, end)
            if tag >> 3 == 0:
                raise Corrupt
            start, stop = self.value(tag, i, end, depth)
            if stop > end:
                yield tag >> 3, tag & 7, start, None
                raise Corrupt
            yield tag >> 3, tag & 7, start, stop
            i = stop


def _named(msg: Descriptor, counts: dict, number: int) -> tuple[FieldDescriptor | None, str]:
    """The field of this number and its path segment (indexed if repeated)."""
    f = msg.fields_by_number.get(number)
    if f is None:
        return None, ""
    if f.is_repeated:
        k = counts.get(number, 0)
        counts[number] = k + 1
        return f, f"{f.name}[{k}]"
    return f, f.name


def undecodable(msg: Descriptor, data: bytes) -> tuple[str, str]:
    """(field path, what is wrong with it) for bytes protobuf refused to parse;
    the path is "request" when no field can be blamed."""
    found = _undecodable(_Walk(data), msg, 0, len(data), 0)
    if found is None or not found[0]:
        return "request", f"is not a valid {msg.name} message"
    return found


def _undecodable(w: _Walk, msg: Descriptor, i: int, end: int, depth: int):
    counts: dict[int, int] = {}
    cut = ""  # the field whose bytes run past the end, if that is what is wrong
    try:
        for number, wt, start, stop in w.fields(i, end, depth):
            f, path = _named(msg, counts, number)
            if stop is None:
                cut = path
            if f is None or wt != _LEN or stop is None:
                continue  # protobuf keeps unknown fields, and known ones of another wire type
            if f.type == f.TYPE_STRING:
                try:
                    str(w.data[start:stop], "utf-8")
                except UnicodeDecodeError:
                    return path, "is not valid UTF-8"
            elif f.type == f.TYPE_MESSAGE and f.message_type is not None:
                inner = _undecodable(w, f.message_type, start, stop, depth + 1)
                if inner:
                    return (f"{path}.{inner[0]}" if inner[0] else path), inner[1]
    except Corrupt:
        return cut, "is truncated or malformed"
    return None


def largest(msg: Descriptor, data: bytes) -> str:
    """The path of the largest field in a message's bytes, descending into
    messages: where an oversized request spends its bytes."""
    return _largest(_Walk(data), msg, 0, len(data), 0) or "request"


def _largest(w: _Walk, msg: Descriptor, i: int, end: int, depth: int) -> str:
    counts: dict[int, int] = {}
    best, size, field, span = "", -1, None, (0, 0)
    try:
        for number, _, start, stop in w.fields(i, end, depth):
            f, path = _named(msg, counts, number)
            stop = end if stop is None else stop
            if f is not None and stop - start > size:
                best, size, field, span = path, stop - start, f, (start, stop)
    except Corrupt:
        pass
    if field is not None and field.message_type is not None and field.type == field.TYPE_MESSAGE and depth < MAX_DEPTH:
        inner = _largest(w, field.message_type, span[0], span[1], depth + 1)
        if inner:
            return f"{best}.{inner}"
    return best

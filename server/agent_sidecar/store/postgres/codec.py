"""Text and JSON values to and from PostgreSQL, losslessly.

PostgreSQL's ``text`` and ``jsonb`` cannot hold the character NUL (U+0000),
which the API accepts anywhere in a string and the SQLite backend stores as
is. So that both backends keep what they were given, this backend stores a
NUL as two characters, the escape mark U+FFFF (a Unicode noncharacter: never
meant to appear in interchanged text) followed by ``0``, and a mark that was
in the text itself as the mark doubled. Values are escaped on the way in and
unescaped on the way out by the connection's adapters (``configure``), so no
query and no repository sees the escaping; equality, prefixes and ordering of
escaped values match the originals' except around the two characters.

JSON (``jsonb``) is escaped on its serialised text: a NUL is the escape
sequence ``\\u0000`` there (orjson never writes a raw control character), a
mark a raw character inside a string; both become the same two characters.
"""

from __future__ import annotations

import re

import orjson
from psycopg.types.json import set_json_dumps, set_json_loads
from psycopg.types.string import StrBinaryDumper, StrDumperUnknown, TextBinaryLoader, TextLoader

MARK = "\uffff"
_MARK_B = MARK.encode()
_ESC = re.compile(f"{MARK}([{MARK}0])")
_ESC_B = re.compile(_MARK_B + b"(" + _MARK_B + b"|0)")
# ``\u0000`` preceded by an even number of backslashes: an escaped NUL, not
# the text ``\u0000`` (whose own backslash is escaped: ``\\u0000``).
_JSON_NUL = re.compile(rb"(?<!\\)((?:\\\\)*)\\u0000")


def escape(s: str) -> str:
    if "\x00" not in s and MARK not in s:
        return s
    return s.replace(MARK, MARK + MARK).replace("\x00", MARK + "0")


def unescape(s: str) -> str:
    if MARK not in s:
        return s
    return _ESC.sub(lambda m: MARK if m.group(1) == MARK else "\x00", s)


def _raw_nuls(data: bytes) -> bytes:
    """Serialised JSON with its escaped NULs as raw NUL characters."""
    if b"\\u0000" not in data:
        return data
    return _JSON_NUL.sub(lambda m: m.group(1) + b"\x00", data)


def json_text(data: bytes) -> str:
    """Serialised JSON as the ``str`` of a parameter cast to ``jsonb``: the
    str dumper then escapes it (its NULs are raw characters by now)."""
    return _raw_nuls(data).decode()


def json_rows(rows: list) -> str:
    """Rows (lists of plain values; ``orjson.Fragment`` for JSON already
    serialised) as the text of ONE ``json`` parameter, which a statement takes
    apart with ``json_array_elements``: psycopg dumps a str in C, where a
    parameter per column as an array goes through its Python list dumper,
    element by element. Text values come out of it (``->>``) escaped as the
    str dumper escapes them, so they are stored exactly as a plain parameter."""
    return json_text(orjson.dumps(rows))


def dumps(obj) -> bytes:
    """``obj`` as ``jsonb`` text, escaped (the jsonb dumper sends it as is)."""
    data = _raw_nuls(orjson.dumps(obj))
    if b"\x00" not in data and _MARK_B not in data:
        return data
    return data.replace(_MARK_B, _MARK_B + _MARK_B).replace(b"\x00", _MARK_B + b"0")


def loads(data) -> object:
    """``jsonb`` text from the server, unescaped (a NUL back as ``\\u0000``)."""
    data = bytes(data)
    if _MARK_B in data:
        data = _ESC_B.sub(lambda m: _MARK_B if m.group(1) == _MARK_B else b"\\u0000", data)
    return orjson.loads(data)


class StrDumper(StrDumperUnknown):
    def dump(self, obj):
        return super().dump(escape(obj))


class StrBinDumper(StrBinaryDumper):
    def dump(self, obj):
        return super().dump(escape(obj))


class Loader(TextLoader):
    def load(self, data):
        return unescape(super().load(data))  # type: ignore[arg-type]  # str: the connection is UTF-8


class BinLoader(TextBinaryLoader):
    def load(self, data):
        return unescape(super().load(data))  # type: ignore[arg-type]  # str: the connection is UTF-8


def configure(conn) -> None:
    """Every connection of this backend (sync or async): str and JSON in and
    out escaped."""
    set_json_dumps(dumps, conn)
    set_json_loads(loads, conn)
    conn.adapters.register_dumper(str, StrDumper)
    conn.adapters.register_dumper(str, StrBinDumper)
    for oid in ("text", "varchar"):
        conn.adapters.register_loader(oid, Loader)
        conn.adapters.register_loader(oid, BinLoader)

"""The declarations behind config.py: keys declared once, with their type,
range and doc, which config_loader.py checks every key of a TOML table against.

A section is a dataclass whose fields are declared with

- ``key(default, ...)``: one value; its annotation is its type (``bool``,
  ``int``, ``float``, ``str``, ``list[str]``, ``dict[str, Any]`` for a free
  table, or a union such as ``int | str``), the keywords its range
  (``ge``/``gt``/``le``, ``choices``, ``nonempty``, ``check``);
- ``section(Cls)``: a sub-table of another section class;
- ``named(Cls)``: ``[NAME.*]`` tables of one kind, a ``dict[str, Cls]``;
- ``array(Cls)``: ``[[NAME]]`` tables, a ``list[Cls]``.

``toml="a.b"`` puts a field somewhere else than ``[its section] field_name``
(the root Config is flat, its keys live under ``[sidecar]``, ``[agent]`` …).
``secret=True`` on a string key X accepts exactly one of ``X = "..."``,
``X_env = "VAR"`` (read from the environment) or ``X_file = "/path"`` (read
from the file, one trailing newline stripped); the attribute holds the value.
A section may define ``_validate(self)`` yielding ``(key, message, got)`` for
checks across its keys.

Adding a section is a dataclass and one line in Config::

    @dataclass
    class Store:
        backend: str = key("sqlite", choices=("sqlite", "postgres"), doc="the store backend")
        dsn: str = key("", secret=True, doc="the PostgreSQL DSN")
        pool_size: int = key(8, ge=1, doc="connections in the pool")

    class Config:
        ...
        store: Store = section(Store, doc="the store")   # [store], cfg.store.pool_size

after which the loader checks ``[store]``, the environment overlay knows
``AGENT_SIDECAR_STORE__POOL_SIZE`` and ``AGENT_SIDECAR_STORE__DSN_FILE``, and
``agent-sidecar config reference`` (docs/configuration.md) lists the keys.

How a value is checked against its key (the types, ranges, the UTF-8 and
64-bit rules, the address syntaxes, how problems are reported) is
config_checks.py's.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import TypeIs

ENV_PREFIX = "AGENT_SIDECAR_"
SECRET_FORMS = ("", "_env", "_file")


class ConfigError(ValueError):
    """One or more config problems; ``problems`` holds one line each."""

    def __init__(self, problems: str | list[str]):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


# -- declaring keys -----------------------------------------------------------------------

def key(default: Any = MISSING, *, doc: str = "", toml: str | None = None, ge: float | None = None,
        gt: float | None = None, le: float | None = None, choices: tuple[str, ...] | None = None,
        fold: str | None = None, nonempty: bool = False, required: bool = False,
        secret: bool = False, check: Callable[[Any], str | None] | None = None,
        shown: str | None = None, internal: bool = False) -> Any:
    """A config value. ``fold`` ("lower"/"upper") normalizes strings before
    ``choices`` are compared; ``check(value)`` returns an error or None;
    ``shown`` is the default as the docs show it; ``internal`` keys are set by
    the loader, never read from the file."""
    md = {k: v for k, v in dict(doc=doc, toml=toml, ge=ge, gt=gt, le=le, choices=choices, fold=fold,
                                nonempty=nonempty, required=required, secret=secret, check=check,
                                shown=shown, internal=internal).items()
          if v is not None and v is not False}
    if isinstance(default, (list, dict)):
        return field(default_factory=functools.partial(copy.deepcopy, default), metadata=md)
    return field(default=default, metadata=md)


def section(cls: type, *, doc: str = "", toml: str | None = None) -> Any:
    return field(default_factory=cls, metadata={"doc": doc, "toml": toml} if toml else {"doc": doc})


def named(cls: type, *, doc: str = "", toml: str | None = None,
          names: Callable[[str], tuple[str, str | None]] | None = None) -> Any:
    """``[toml.NAME]`` tables; ``names(name)`` returns (the name as stored,
    an error or None), e.g. lower-casing case-insensitive names."""
    md = {"doc": doc, "names": names}
    if toml:
        md["toml"] = toml
    return field(default_factory=dict, metadata=md)


def array(cls: type, *, doc: str = "", toml: str | None = None) -> Any:
    md = {"doc": doc}
    if toml:
        md["toml"] = toml
    return field(default_factory=list, metadata=md)


# -- the schema as a tree -------------------------------------------------------------------

@dataclass(frozen=True)
class Slot:
    """Where a TOML key lands: a dataclass field, with its type; ``form`` is
    "", "_env" or "_file" for the spellings of a secret."""
    field: dataclasses.Field
    tp: Any
    form: str = ""

    @property
    def md(self) -> Mapping[str, Any]:
        return self.field.metadata


def is_table(tp: Any) -> TypeIs[type]:
    """A table of the configuration: a dataclass type (never an instance here)."""
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def is_named(tp: Any) -> bool:
    return typing.get_origin(tp) is dict and dataclasses.is_dataclass(typing.get_args(tp)[1])


def is_array(tp: Any) -> bool:
    return typing.get_origin(tp) is list and dataclasses.is_dataclass(typing.get_args(tp)[0])


@functools.cache
def tree(cls: type) -> dict[str, Any]:
    """TOML key -> Slot or a nested dict (a table that groups keys of ``cls``)."""
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        *parents, last = (f.metadata.get("toml") or f.name).split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        for form in (SECRET_FORMS if f.metadata.get("secret") else ("",)):
            node[last + form] = Slot(f, hints[f.name], form)
    return out


def members_of(tp: Any) -> tuple:
    """The types a key's annotation allows (``int | str``: int and str; None left out)."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        return tuple(t for t in typing.get_args(tp) if t is not type(None))
    return (tp,)


def describe(tp: Any) -> str:
    """What the docs and messages call a type."""
    if typing.get_origin(tp) is list:
        inner = typing.get_args(tp)[0]
        return "array of tables" if dataclasses.is_dataclass(inner) else "array of " + describe(inner) + "s"
    if typing.get_origin(tp) is dict or dataclasses.is_dataclass(tp):
        return "table"
    names = {bool: "bool", int: "integer", float: "number", str: "string"}
    return " or ".join(names[t] for t in members_of(tp))


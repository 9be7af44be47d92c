"""Reading a config: the TOML file, the environment overlay and the
command-line flags merged into one table (defaults < file < environment <
flags), then every key of it checked against the schema (config_schema.py
declares the keys, config_checks.py checks a value against one).

The environment overlay: ``AGENT_SIDECAR_`` followed by the key's dotted TOML
path in upper case with ``__`` between its parts names one key —
``AGENT_SIDECAR_SIDECAR__WORKERS``, ``AGENT_SIDECAR_AGENT__AGENT_CACHE__MAX_SIZE``,
``AGENT_SIDECAR_PROFILES__MAIN__MODEL``. A part names a table's key
case-insensitively (a profile name the file spells ``Main`` is matched by
``MAIN``; a name the file lacks is taken in lower case). A string key takes
the variable's text as it is; any other key takes a TOML literal (``4``,
``true``, ``["unix:/run/s.sock"]``, ``[{token_env = "T"}]``). A variable with
the prefix that names no key is an error, as an unknown key in the file is.
Setting one spelling of a secret (``..._TOKEN_FILE``) replaces whichever
spelling the file used. A TOML literal is one value: ``4\nx = 1`` is refused.

Files the config names (``token_file``, a listener's PEM files) are read only
when they are regular files of at most a few MB (``read_file``): a device, a
FIFO or a huge file is refused, not read until memory runs out.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import stat
import tomllib
import typing
from collections.abc import Mapping
from typing import Any

from .config_checks import BAD, Problems, check_free, check_scalar, matches, utf8
from .config_schema import ENV_PREFIX, SECRET_FORMS, ConfigError, Slot, describe, is_named, is_table, members_of, tree

MAX_CONFIG_BYTES = 16 * 1024 * 1024  # the config file itself
MAX_SECRET_BYTES = 64 * 1024  # a token_file, dsn_file


def read_file(path: str, limit: int, regular: bool = True) -> bytes:
    """The bytes of the file ``path``, at most ``limit`` of them; OSError
    (its message the problem) for anything else, and for no regular file when
    ``regular`` (opened without blocking, so a FIFO is refused, not waited on)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | (os.O_NONBLOCK if regular else 0))
    with open(fd, "rb") as f:
        if regular and not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise OSError(f"{path} is larger than " + (f"{limit >> 20} MiB" if limit >= 1 << 20 else
                                                   f"{limit >> 10} KiB"))
    return data


def file_problem(e: OSError) -> str:
    """What ``read_file`` refused, as a config error says it."""
    return f"cannot read the file: {e.strerror}" if e.strerror else str(e)


def read_toml(path: str | None) -> dict[str, Any]:
    """The config file's table; ConfigError when it is not one (not UTF-8,
    not TOML, nested beyond what the parser recurses into, over 16 MiB)."""
    if not path:
        return {}
    try:
        return tomllib.loads(read_file(path, MAX_CONFIG_BYTES, regular=False).decode("utf-8"))
    except RecursionError:
        raise ConfigError(f"config error: cannot read config {path}: nested too deeply") from None
    except OSError as e:  # its strerror: str() names the file again, or (read through an fd) its number
        raise ConfigError(f"config error: cannot read config {path}: {e.strerror or e}") from e
    except ValueError as e:  # TOMLDecodeError, UnicodeDecodeError, an integer's digits
        raise ConfigError(f"config error: cannot read config {path}: {e}") from e


class Loader:
    def __init__(self, environ: Mapping[str, str]):
        self.environ = environ
        self.out = Problems()

    # -- checking a table against a section class -------------------------------------------

    def parse(self, cls: type, table: dict, where: str, name: str | None = None) -> Any:
        """An instance of ``cls`` from ``table`` (``where``: its dotted path and
        a dot); problems go to ``self.out``, defaults stand in for bad keys."""
        before = len(self.out.lines)
        kwargs: dict[str, Any] = {}
        secrets: dict[str, list[tuple[str, Any, str]]] = {}
        self._walk(tree(cls), table, where, kwargs, secrets)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for fname, forms in secrets.items():
            value = self._secret(fields[fname], forms, where)
            if value is not BAD:
                kwargs[fname] = value
        for f in fields.values():
            given = (f.metadata.get("toml") or f.name) in table  # given but bad: reported already
            if f.metadata.get("required") and f.name not in kwargs and f.name not in secrets and not given:
                k = f.metadata.get("toml") or f.name
                hint = f" (give {k}, {k}_env or {k}_file)" if f.metadata.get("secret") else ""
                self.out.add(where + k, "required" + hint)
        if name is not None and "name" in fields:
            kwargs["name"] = name
        obj = cls(**kwargs)
        validate = getattr(obj, "_validate", None)
        if validate is not None and len(self.out.lines) == before:
            for k, what, got in validate():
                self.out.add(where + k, what, got)
        return obj

    def _walk(self, node: dict, table: dict, where: str, kwargs: dict, secrets: dict) -> None:
        for k, v in table.items():
            path = where + k
            sub = node.get(k)
            if sub is None:
                near = difflib.get_close_matches(k, list(node), n=1)
                self.out.add(path, "unknown key" + (f" (did you mean {near[0]}?)" if near else ""))
            elif isinstance(sub, dict):
                if isinstance(v, dict):
                    self._walk(sub, v, path + ".", kwargs, secrets)
                else:
                    self.out.shape(path, "expected a table", v)
            elif sub.md.get("secret"):
                secrets.setdefault(sub.field.name, []).append((sub.form, v, path))
            else:
                value = self.value(sub.tp, sub.md, v, path)
                if value is not BAD:
                    kwargs[sub.field.name] = value

    def value(self, tp: Any, md: Mapping[str, Any], v: Any, where: str) -> Any:
        """One key's value checked against its type (recursing into tables)."""
        origin = typing.get_origin(tp)
        if is_table(tp) or origin is dict:
            if not isinstance(v, dict):
                self.out.shape(where, "expected a table", v)
                return BAD
            if is_table(tp):
                return self.parse(tp, v, where + ".")
            if is_named(tp):
                return self._named(typing.get_args(tp)[1], md, v, where)
            return v if check_free(v, where, self.out) else BAD
        if origin is list:
            inner = typing.get_args(tp)[0]
            if not isinstance(v, list):
                self.out.shape(where, "expected an " + describe(tp), v)
                return BAD
            items = []
            for i, x in enumerate(v):
                if not is_table(inner):
                    x = check_scalar(inner, md, x, f"{where}[{i}]", self.out)
                elif isinstance(x, dict):
                    x = self.parse(inner, x, f"{where}[{i}].")
                else:
                    self.out.shape(f"{where}[{i}]", "expected a table", x)
                    x = BAD
                if x is not BAD:
                    items.append(x)
            return items if len(items) == len(v) else BAD
        return check_scalar(tp, md, v, where, self.out)

    def _named(self, cls: type, md: Mapping[str, Any], tables: dict, where: str) -> dict:
        out: dict[str, Any] = {}
        for name, sub in tables.items():
            path = f"{where}.{name}"
            stored, problem = md["names"](name) if md.get("names") else (name, None)
            if not utf8(name):
                self.out.add(path, "a name must be valid UTF-8 (it has an undecodable byte)")
            elif problem:
                self.out.add(path, problem)
            elif stored in out:
                self.out.add(path, "the same name as another table (names are case-insensitive)")
            elif not isinstance(sub, dict):
                self.out.shape(path, "expected a table", sub)
            else:
                out[stored] = self.parse(cls, sub, path + ".", name=stored)
        return out

    def _secret(self, f: dataclasses.Field, forms: list[tuple[str, Any, str]], where: str) -> Any:
        """A secret's value from whichever one of its spellings was given. Named
        by ``_env`` or ``_file``, it may not be empty: an empty variable or file
        is a mistake (a cluster token left out that way would only show later,
        as every forwarded call refused), where ``key = ""`` says "none"."""
        k = f.metadata.get("toml") or f.name
        if len(forms) > 1:
            self.out.add(where + k, f"give only one of {k}, {k}_env and {k}_file")
            return BAD
        form, v, path = forms[0]
        if not isinstance(v, str):
            self.out.add(path, "expected a string", "***" if form == "" else v)
            return BAD
        value = v
        if form == "_env":
            if v not in self.environ:
                self.out.add(path, f"the environment variable {v} is not set", v)
                return BAD
            value = self.environ[v]
        elif form == "_file":
            try:
                value = read_file(v, MAX_SECRET_BYTES).decode("utf-8")
            except OSError as e:
                self.out.add(path, file_problem(e), v)
                return BAD
            except UnicodeDecodeError as e:
                self.out.add(path, f"cannot read the file: {e}", v)
                return BAD
            value = value[:-1] if value.endswith("\n") else value
        if form and not value:  # a variable or file named for a secret is meant to hold one
            self.out.add(path, f"the environment variable {v} is empty" if form == "_env"
                         else "the file is empty", v)
            return BAD
        return check_scalar(str, f.metadata, value, path, self.out)

    # -- overlays ----------------------------------------------------------------------------

    def overlay_env(self, cls: type, raw: dict) -> None:
        """Apply every ``AGENT_SIDECAR_*`` variable to ``raw`` (see the module docstring)."""
        for var in sorted(self.environ):
            if not var.startswith(ENV_PREFIX):
                continue
            found = _env_target(cls, var[len(ENV_PREFIX):].lower().split("__"), raw)
            if found is None:
                near = _env_near(cls, var[len(ENV_PREFIX):].lower().split("__"), raw)
                self.out.add(var, "names no config key (" + (f"did you mean {near}?" if near else
                                  "AGENT_SIDECAR_<TABLE>__<KEY>, see docs/configuration.md") + ")")
                continue
            path, slot = found
            self._set(raw, path, _env_value(slot, self.environ[var]), var, slot)

    def overlay_flags(self, cls: type, raw: dict, overrides: Mapping[str, Any]) -> None:
        """Apply command-line flags (Config attribute name -> value; None: not given)."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for attr, value in overrides.items():
            if value is not None:
                f = fields[attr]
                self._set(raw, (f.metadata.get("toml") or f.name).split("."), value,
                          "--" + attr.replace("_", "-"), None)

    def _set(self, raw: dict, path: list[str], value: Any, source: str, slot: Slot | None) -> None:
        table = raw
        for p in path[:-1]:
            table = table.setdefault(p, {})
            if not isinstance(table, dict):  # the file's own error is reported
                return
        if slot is not None and slot.md.get("secret"):
            base = path[-1][:len(path[-1]) - len(slot.form)]
            for form in SECRET_FORMS:
                table.pop(base + form, None)
        table[path[-1]] = value
        self.out.sources[".".join(path)] = source


def _env_target(cls: type, parts: list[str], raw: dict) -> tuple[list[str], Slot] | None:
    """The TOML path and slot an environment variable's name parts point at."""
    node: dict = tree(cls)
    current: Any = raw
    path: list[str] = []
    i = 0
    while i < len(parts):
        sub = node.get(parts[i])
        if sub is None:
            return None
        path.append(parts[i])
        current = current.get(parts[i]) if isinstance(current, dict) else None
        i += 1
        if isinstance(sub, dict):
            node = sub
        elif is_table(sub.tp):
            node = tree(sub.tp)
        elif is_named(sub.tp):
            if i == len(parts):
                return None
            names = list(current) if isinstance(current, dict) else []
            name = next((n for n in names if n.lower() == parts[i]), parts[i])
            path.append(name)
            current = current.get(name) if isinstance(current, dict) else None
            node = tree(typing.get_args(sub.tp)[1])
            i += 1
        else:
            return (path, sub) if i == len(parts) else None
    return None


def _env_near(cls: type, parts: list[str], raw: dict) -> str | None:
    """The variable a misspelt one most likely meant, as the file's unknown keys
    get theirs: one part replaced by the nearest key name that makes the whole
    name a key (``SIDECAR__DRAIN_TIMEOT`` -> ``SIDECAR__DRAIN_TIMEOUT``), or a
    table's name put before it (``WORKERS`` -> ``SIDECAR__WORKERS``)."""
    for table in tree(cls):
        if _env_target(cls, [table, *parts], raw) is not None:
            return ENV_PREFIX + "__".join([table, *parts]).upper()
    names = sorted(_key_names(cls, set()))
    for i, part in enumerate(parts):
        for near in difflib.get_close_matches(part, names, n=3):
            fixed = [*parts[:i], near, *parts[i + 1:]]
            if _env_target(cls, fixed, raw) is not None:
                return ENV_PREFIX + "__".join(fixed).upper()
    return None


def _key_names(cls: type, seen: set[type]) -> set[str]:
    """Every key and table name of ``cls`` and the tables under it."""
    seen.add(cls)
    out: set[str] = set()
    pending: list[Any] = [tree(cls)]
    while pending:
        for name, sub in pending.pop().items():
            out.add(name)
            if isinstance(sub, dict):
                pending.append(sub)
                continue
            inner = typing.get_args(sub.tp)[1] if is_named(sub.tp) else sub.tp
            if is_table(inner) and inner not in seen:
                out |= _key_names(inner, seen)
    return out


def _env_value(slot: Slot, text: str) -> Any:
    """A variable's text as the key's value: strings as they are, everything
    else as a TOML literal (left as text when it is none: the check says so)."""
    members = members_of(slot.tp)
    if slot.form or members == (str,):
        return text
    try:
        parsed = tomllib.loads("v = " + text)
    except (ValueError, RecursionError):  # not TOML, an integer's digits, nested too deeply
        return text
    if len(parsed) != 1:  # "4\nx = 1": more than the one value
        return text
    value = parsed["v"]
    if str in members and not any(matches(t, value) for t in members if t is not str):
        return text
    return value

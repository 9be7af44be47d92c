"""``agent-sidecar config check|show|reference``: check a config file without
starting a sidecar, print the effective config (secrets masked), print or
update the key reference of docs/configuration.md.

check and show read the file as ``serve`` would, with the ``AGENT_SIDECAR_*``
overlay of this environment (and ``token_env``/``token_file`` resolved).
"""

from __future__ import annotations

import json
import math
import re
import sys
import typing
from typing import Any

from ..config import Config, ConfigError, load_config
from ..config_schema import ENV_PREFIX, Slot, describe, is_array, is_named, is_table, tree
from .argtypes import file_name
from .report import error

BEGIN, END = "<!-- config-keys:begin (agent-sidecar config reference) -->", "<!-- config-keys:end -->"
MASK = "***"


def add_arguments(sub) -> None:
    c = sub.add_parser("config", help="check a config file, show the effective config, print the key reference")
    c_sub = c.add_subparsers(dest="action", required=True)
    chk = c_sub.add_parser("check", help="check FILE (and the AGENT_SIDECAR_* environment): exit 0 or 2")
    chk.add_argument("file", type=file_name)
    show = c_sub.add_parser("show", help="print the effective config as TOML, secrets masked")
    show.add_argument("file", nargs="?", type=file_name, default=None)
    ref = c_sub.add_parser("reference", help="print the key reference (Markdown)")
    ref.add_argument("--write", metavar="PATH", type=file_name, default=None,
                     help="replace the reference between its markers in PATH instead")
    c.set_defaults(func=run)


def run(args) -> int:
    if args.action == "reference":
        return _reference(args.write)
    try:
        cfg = load_config(args.file)
    except ConfigError as e:
        error("config", e)
        return 2
    if args.action == "show":
        sys.stdout.write(to_toml(as_table(cfg, Config)))
        return 0
    listen = [x.address + (" (mTLS)" if x.client_ca else " (TLS)" if x.tls else "") for x in cfg.all_listeners()]
    print(f"{args.file}: ok ({len(cfg.profiles)} profile(s): {', '.join(sorted(cfg.profiles))}; "
          f"{len(cfg.tokens)} token(s); listen {', '.join(listen)}; data {cfg.data_dir})")
    return 0


# -- the effective config as TOML --------------------------------------------------------------

def as_table(obj: Any, cls: type) -> dict[str, Any]:
    """``obj`` (an instance of the section class ``cls``) as the TOML table
    that would load it, secrets masked."""
    out: dict[str, Any] = {}
    _fill(out, tree(cls), obj)
    return out


def _fill(out: dict, node: dict, obj: Any) -> None:
    for k, sub in node.items():
        if isinstance(sub, dict):
            _fill(out.setdefault(k, {}), sub, obj)
            continue
        if sub.form:
            continue
        value = getattr(obj, sub.field.name)
        if value is None:
            continue
        if sub.md.get("secret"):
            value = MASK if value else ""
        elif is_table(sub.tp):
            value = as_table(value, sub.tp)
        elif is_named(sub.tp):
            value = {name: as_table(v, typing.get_args(sub.tp)[1]) for name, v in value.items()}
        elif is_array(sub.tp):
            value = [as_table(v, typing.get_args(sub.tp)[0]) for v in value]
        elif isinstance(value, dict):  # a free table (a profile's model_options)
            value = _masked(value)
        out[k] = value


# In a free table the schema does not say what is secret: text under these
# names is masked, and every text of a table of HTTP headers (any header may
# carry a credential). A name that says where a secret is (``api_key_env``)
# is shown, and so is what is not text (``max_tokens = 1000``).
_SECRET_WORDS = ("authorization", "token", "secret", "password", "passwd", "key", "credential", "cookie")


def _masked(table: dict[str, Any], all_values: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in table.items():
        name = k.lower()
        if isinstance(v, dict):
            out[k] = _masked(v, all_values or "header" in name)
        elif isinstance(v, str) and v and (all_values or (
                any(w in name for w in _SECRET_WORDS) and not name.endswith(("_env", "_file")))):
            out[k] = MASK
        else:
            out[k] = v
    return out


_BARE = re.compile(r"[A-Za-z0-9_-]+")


def _key(k: str) -> str:
    return k if _BARE.fullmatch(k) else json.dumps(k, ensure_ascii=False)


def literal(v: Any) -> str:
    """A TOML literal of ``v``."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(v, list):
        return "[" + ", ".join(literal(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {literal(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"no TOML literal for {type(v).__name__}")


def _is_tables(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def to_toml(table: dict, prefix: str = "") -> str:
    """A TOML document of ``table``: its values, then its sub-tables, then its arrays of tables."""
    lines = [f"{_key(k)} = {literal(v)}" for k, v in table.items()
             if not (isinstance(v, dict) and v) and not _is_tables(v)]
    text = "\n".join(lines) + ("\n" if lines else "")
    for k, v in table.items():
        name = prefix + _key(k)
        if isinstance(v, dict) and v:
            body = to_toml(v, name + ".")
            head = f"[{name}]\n" if any(not (isinstance(x, dict) and x) and not _is_tables(x)
                                        for x in v.values()) else ""
            text += ("\n" if text else "") + head + body
        elif _is_tables(v):
            for entry in v:
                text += ("\n" if text else "") + f"[[{name}]]\n" + to_toml(entry, name + ".")
    return text


# -- the key reference ------------------------------------------------------------------------

def rows(cls: type = Config) -> tuple[list[tuple[str, ...]], dict[str, str]]:
    """(table, key, type, default, range, environment variable, meaning) of
    every key, and the doc of every table that has one."""
    out: list[tuple[str, ...]] = []
    docs: dict[str, str] = {}
    _rows(out, docs, tree(cls), cls(), "", ENV_PREFIX)
    return out, docs


def _rows(out: list, docs: dict, node: dict, defaults: Any, prefix: str, env: str | None) -> None:
    for k, sub in node.items():
        path = prefix + k
        env_k = env + k.upper() if env else None
        if isinstance(sub, dict):
            _rows(out, docs, sub, defaults, path + ".", env_k + "__" if env_k else None)
            continue
        if sub.md.get("doc") and not sub.form:
            docs[path + (".NAME" if is_named(sub.tp) else "[]" if is_array(sub.tp) else "")] = sub.md["doc"]
        if is_table(sub.tp):
            _rows(out, docs, tree(sub.tp), getattr(defaults, sub.field.name), path + ".",
                  env_k + "__" if env_k else None)
        elif is_named(sub.tp):
            cls = typing.get_args(sub.tp)[1]
            _rows(out, docs, tree(cls), cls(), path + ".NAME.", env_k + "__<NAME>__" if env_k else None)
        elif is_array(sub.tp):
            cls = typing.get_args(sub.tp)[0]
            _rows(out, docs, tree(cls), cls(), path + "[].", None)
        else:
            out.append(_row(sub, path, defaults, env_k))


def _range(md: Any, name: str, tp: Any) -> str:
    parts = []
    for bound, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤")):
        if bound in md:
            parts.append(f"{sign} {md[bound]}")
    if md.get("choices"):
        parts.append(", ".join(f"`{c}`" for c in md["choices"]))
    if md.get("nonempty"):
        parts.append("items non-empty" if typing.get_origin(tp) is list else "non-empty")
    if md.get("secret"):
        parts.append(("exactly" if md.get("required") else "at most") +
                     f" one of `{name}`, `{name}_env`, `{name}_file`")
    return "; ".join(parts)


def _row(slot: Slot, path: str, defaults: Any, env: str | None) -> tuple[str, ...]:
    table, _, name = path.rpartition(".")
    md = slot.md
    if "shown" in md:
        default = md["shown"]
    elif md.get("required"):
        default = "required"
    else:
        default = "`" + literal(getattr(defaults, slot.field.name)) + "`"
    kind = describe(slot.tp) if not slot.form else "string"
    meaning = md.get("doc", "")
    if slot.form == "_env":
        meaning = f"the environment variable holding `{name[:-4]}`"
    elif slot.form == "_file":
        meaning = f"a file holding `{name[:-5]}` (one trailing newline stripped)"
    return (table, name, kind, default if not slot.form else "", _range(md, name, slot.tp) if not slot.form else "",
            f"`{env}`" if env else "", meaning)


def reference() -> str:
    """The Markdown key tables, one per TOML table, in schema order."""
    text, current = "", None
    keys, docs = rows()
    for table, name, kind, default, rng, env, meaning in keys:
        if table != current:
            current = table
            note = docs.get(table, "")
            note = note[0].upper() + note[1:] + ".\n\n" if note else ""
            if table.endswith("[]"):
                title = f"`[[{table[:-2]}]]`"
                var = ENV_PREFIX + "__".join(p.upper() for p in table[:-2].split("."))
                note += (f"From the environment only as a whole: `{var}` holding a TOML array of "
                         "inline tables.\n\n")
            else:
                title = f"`[{table}]`" if table else "Top level"
            text += f"\n#### {title}\n\n{note}| key | type | default | range | environment | meaning |\n" \
                    "|---|---|---|---|---|---|\n"
        text += f"| `{name}` | {kind} | {default} | {rng} | {env} | {meaning} |\n"
    return text.lstrip("\n")


def _reference(path: str | None) -> int:
    if path is None:
        sys.stdout.write(reference())
        return 0
    try:
        with open(path, encoding="utf-8") as f:
            doc = f.read()
        head, rest = doc.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        with open(path, "w", encoding="utf-8") as f:
            f.write(head + BEGIN + "\n" + reference() + END + tail)
    except OSError as e:
        error("config", f"cannot rewrite {path}: {e.strerror or e}")
        return 2
    except ValueError:  # not UTF-8 (UnicodeDecodeError), or no markers
        error("config", f"{path} is no UTF-8 text with the {BEGIN} ... {END} markers")
        return 2
    return 0


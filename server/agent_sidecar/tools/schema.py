"""A tool's parameters schema, checked where a host registers it.

Every turn whose profile may call the tool sends its schema to the model, and
a model API refuses a request whose function schema is no JSON Schema of an
arguments object (OpenAI's answers 400 "Invalid schema for function"): one
host's bad schema would fail every such turn, of every session in scope, with
LLM_API_FAILURE, for as long as the host stayed connected. So the keywords a
JSON Schema gives a shape (``type``, ``properties``, ``required``, ``items``,
the combinators, …) must have that shape, at every level, and the schema
itself must describe an object (its ``type``, when given, is ``"object"``).
Other keywords, and the values of ``enum``, ``const``, ``default`` and
``examples``, are left as they are: JSON Schema allows keywords of one's own.

Pure (no grpc, no I/O); the caller has bounded the nesting already
(api/convert.check_json_depth), so the walk recurses.
"""

from __future__ import annotations

from typing import Any

TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
_SCHEMA = ("additionalProperties", "additionalItems", "not", "if", "then", "else", "contains",
           "propertyNames", "unevaluatedItems", "unevaluatedProperties")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_STRINGS = ("title", "description", "pattern", "format", "$ref", "$id", "$schema")
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")


def schema_problem(schema: dict[str, Any]) -> str | None:
    """What makes ``schema`` no JSON Schema of an arguments object, naming the
    keyword's path (``properties.when.type: …``); None when there is nothing."""
    if "type" in schema and schema["type"] != "object":
        return f"type: must be \"object\" (the schema of the arguments object), got {_show(schema['type'])}"
    return _problem(schema, "")


def _problem(schema: Any, path: str) -> str | None:
    if isinstance(schema, bool):  # true / false: any value, no value
        return None
    if not isinstance(schema, dict):
        return f"{path or 'the schema'}: must be a JSON Schema (an object or a boolean), got {_show(schema)}"
    for key, value in schema.items():
        where = f"{path}.{_cut(key)}" if path else _cut(key)
        why = _keyword_problem(key, value, where)
        if why is not None:
            return why
    return None


def _keyword_problem(key: str, value: Any, where: str) -> str | None:
    """Whether one keyword's value has the shape JSON Schema gives it."""
    if key == "type":
        names = value if isinstance(value, list) else [value]
        if not names or any(n not in TYPES for n in names) or len(set(map(str, names))) != len(names):
            return f"{where}: must be one of {', '.join(TYPES)}, or a list of distinct ones, got {_show(value)}"
    elif key == "required":
        if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
            return f"{where}: must be a list of property names, got {_show(value)}"
    elif key == "enum":
        if not isinstance(value, list):
            return f"{where}: must be a list, got {_show(value)}"
    elif key in _STRINGS:
        if not isinstance(value, str):
            return f"{where}: must be a string, got {_show(value)}"
    elif key in _COUNTS:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return f"{where}: must be a non-negative integer, got {_show(value)}"
    elif key in _SCHEMA:
        return _problem(value, where)
    elif key == "items":  # a schema, or (before draft 2020-12) a list of them
        return _each(value, where) if isinstance(value, list) else _problem(value, where)
    elif key in _SCHEMA_LISTS:
        if not isinstance(value, list) or not value:
            return f"{where}: must be a non-empty list of schemas, got {_show(value)}"
        return _each(value, where)
    elif key in _SCHEMA_MAPS:
        if not isinstance(value, dict):
            return f"{where}: must be an object of schemas, got {_show(value)}"
        for name, sub in value.items():
            why = _problem(sub, f"{where}.{_cut(name)}")
            if why is not None:
                return why
    return None


def _each(schemas: list, where: str) -> str | None:
    for i, sub in enumerate(schemas):
        why = _problem(sub, f"{where}[{i}]")
        if why is not None:
            return why
    return None


def _cut(name: str) -> str:
    """A key of the caller's in a path, cut as error messages cut what they quote."""
    return name if len(name) <= 64 else name[:64] + "…"


def _show(value: Any) -> str:
    """A short rendering of what was given (error messages quote at most 64 characters)."""
    text = repr(value)
    return text if len(text) <= 64 else text[:64] + "…"

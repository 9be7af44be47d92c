"""TOML text for a test sidecar's config. Every builder returns TOML text, so
a config is their concatenation: ``table("sidecar", drain_timeout=1) + echo("slow", 100)``."""

from __future__ import annotations

import json
from typing import Any


def toml_value(v: Any) -> str:
    """A Python value as one inline TOML value (arrays, inline tables)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(type(v))


def table(name: str, **kv: Any) -> str:
    """``[name]`` with one ``key = value`` line per keyword."""
    return f"[{name}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in kv.items()) + "\n"


def profile(name: str, model: str = "echo", options: dict | None = None, **extra: Any) -> str:
    """``[profiles.NAME]``: a model, its ``model_options`` and any other profile keys."""
    if options:
        extra = {"model_options": options, **extra}
    return table(f"profiles.{name}", model=model, **extra)


def echo(name: str = "main", latency_ms: float = 0, **extra: Any) -> str:
    """The echo model (replies with the prompt), ``latency_ms`` per token."""
    return profile(name, "echo", {"token_latency_ms": latency_ms} if latency_ms else None, **extra)


def slow_echo(name: str = "main", latency_ms: int = 100, **extra: Any) -> str:
    """An echo slow enough (100 ms a word) to keep a session busy."""
    return echo(name, latency_ms, **extra)


def scripted(name: str, steps: list, **extra: Any) -> str:
    """The scripted model: one step per model call (text, tool calls, sleeps, kills)."""
    return profile(name, "scripted", {"steps": steps}, **extra)

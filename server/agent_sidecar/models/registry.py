"""Find a model backend by name and build it from a profile's options.

Built-ins (echo, scripted, openai) are resolved directly, without reading package
metadata: that keeps worker start-up cheap and makes them work even from a source
tree that was never pip-installed. Other names come from the
``agent_sidecar.models`` entry point group, so a third party adds a backend by
declaring an entry point that names its class.
"""

from __future__ import annotations

import importlib
from typing import Any

from agent_sidecar.entry_points import EntryPoint, entry_points
from agent_sidecar.models.base import ModelBackend

ENTRY_POINT_GROUP = "agent_sidecar.models"

BUILTINS: dict[str, str] = {
    "echo": "agent_sidecar.models.echo:EchoModel",
    "scripted": "agent_sidecar.models.scripted:ScriptedModel",
    "openai": "agent_sidecar.models.openai:OpenAIModel",
}


def _entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(ENTRY_POINT_GROUP)}


def _import(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def backend_class(name: str) -> type:
    """The class registered under ``name``; ValueError when there is none."""
    if name in BUILTINS:
        return _import(BUILTINS[name])
    ep = _entry_points().get(name)
    if ep is None:
        raise ValueError(f"unknown model backend {name!r}")
    return ep.load()


def load_backend(name: str, options: dict[str, Any] | None = None) -> ModelBackend:
    """Construct backend ``name`` with ``options`` (a profile's model_options).

    Raises ValueError for an unknown name or options the backend rejects.
    """
    cls = backend_class(name)
    backend = cls(dict(options or {}))
    if not callable(getattr(backend, "stream", None)) or not callable(getattr(backend, "aclose", None)):
        raise ValueError(f"model backend {name!r} ({cls.__module__}.{cls.__qualname__}) lacks stream()/aclose()")
    return backend


def backend_names() -> list[str]:
    """Every backend name available: built-ins plus installed entry points."""
    return sorted(set(BUILTINS) | set(_entry_points()))

"""Installed distributions' entry points, read without importlib.metadata.

The sidecar reads two entry point groups at startup: third-party model
backends (models/registry.py) and in-process tools (tools/registry.py).
``importlib.metadata`` answers that too, but importing it imports the
``email`` package (to parse METADATA files), ``zipfile``, ``csv`` and
``pathlib`` — some fifty modules the sidecar otherwise never loads, held for
the life of the process. This module reads only what an entry point needs:
the ``entry_points.txt`` of each ``*.dist-info`` or ``*.egg-info`` directory
on ``sys.path``.

It answers as ``importlib.metadata.entry_points(group=...)`` does for
distributions installed as directories: path entries in ``sys.path`` order,
the first distribution of a (normalised) name wins, the file's syntax is the
same (``[group]`` headers, ``name = module:attr [extras]`` lines, ``#``
comments). It does not look inside zip files on ``sys.path``.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import sys
from dataclasses import dataclass
from typing import Any

_SUFFIXES = (".dist-info", ".egg-info")
_VALUE = re.compile(r"(?P<module>[\w.]+)\s*(:\s*(?P<attr>[\w.]+)\s*)?((?P<extras>\[.*\])\s*)?$")


@dataclass(frozen=True, slots=True)
class EntryPoint:
    """One ``name = value`` line of a group; ``load()`` imports what it names."""

    name: str
    value: str
    group: str

    def load(self) -> Any:
        """The object ``module:attr.attr`` names (the module itself without
        ``:attr``); ValueError when the value is not of that form."""
        m = _VALUE.match(self.value)
        if m is None:
            raise ValueError(f"entry point {self.name!r}: malformed value {self.value!r}")
        obj = importlib.import_module(m.group("module"))
        attrs = m.group("attr").split(".") if m.group("attr") else []
        return functools.reduce(getattr, attrs, obj)


def entry_points(group: str) -> list[EntryPoint]:
    """Every entry point of ``group`` in the distributions on ``sys.path``."""
    out: list[EntryPoint] = []
    for text in _entry_point_files():
        out.extend(ep for ep in _parse(text) if ep.group == group)
    return out


def _entry_point_files():
    """The text of each distribution's entry_points.txt, the first
    distribution of a name only."""
    seen: set[str] = set()
    for entry in sys.path:
        path = entry or os.getcwd()
        try:
            names = sorted(os.listdir(path))
        except OSError:  # missing, a file, a zip: nothing here
            continue
        for name in names:
            stem, ext = os.path.splitext(name)
            if ext not in _SUFFIXES:
                continue
            dist = re.sub(r"[-_.]+", "_", stem.partition("-")[0]).lower()
            if dist in seen:
                continue
            seen.add(dist)
            try:
                with open(os.path.join(path, name, "entry_points.txt"), encoding="utf-8") as f:
                    yield f.read()
            except OSError:  # a distribution without entry points
                continue


def _parse(text: str):
    group = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            group = line[1:-1].strip()
            continue
        name, sep, value = line.partition("=")
        if group and sep:
            yield EntryPoint(name.strip(), value.strip(), group)

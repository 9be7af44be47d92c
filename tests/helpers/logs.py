"""The sidecar's JSON log, parsed. Only for tests where a log line is itself
the behaviour under test (say so at the call site); everything a client can
see is asserted through gRPC, and what the store holds through helpers.store.
``sc.log()`` in an assertion's message, for debugging, is fine anywhere."""

from __future__ import annotations

import json


def log_lines(sc, msg: str | None = None) -> list[dict]:
    """The JSON records of the sidecar's log (those with this ``msg``)."""
    out = []
    try:
        text = sc.log_path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict) and (msg is None or d.get("msg") == msg):
            out.append(d)
    return out

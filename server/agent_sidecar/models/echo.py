"""``echo``: the embedded default backend, for demos and benchmarks.

It streams the last user message's words back, one TextDelta per word (spaces
kept, so the deltas concatenate to the original text exactly), then one
UsageReport. It never asks for tools, so every turn is one model call.

Because it is the default and the throughput benchmark runs through it, the hot
path is deliberately bare: with ``token_latency_ms`` 0 there is no sleep and no
per-token work beyond building the event; a one-word message yields exactly one
TextDelta and one UsageReport.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

from agent_sidecar.models._text import count_input_words, last_user_text, paced, split_words
from agent_sidecar.models.base import ModelEvent, ModelRequest, TextDelta, UsageReport

_OPTIONS = frozenset({"token_latency_ms", "prefix"})


class EchoModel:
    """Options: ``token_latency_ms`` (float, default 0: simulated latency per
    token, the n-th token due n latencies after the call began, _text.paced),
    ``prefix`` (str, default "": prepended to the reply, carried in
    the first delta)."""

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        options = dict(options or {})
        unknown = set(options) - _OPTIONS
        if unknown:
            raise ValueError(f"echo backend: unknown option(s) {sorted(unknown)}; known: {sorted(_OPTIONS)}")
        try:
            latency_ms = float(options.get("token_latency_ms", 0) or 0)
        except (TypeError, ValueError):
            raise ValueError("echo backend: token_latency_ms must be a number") from None
        if not 0 <= latency_ms < math.inf:  # NaN and infinity too: a turn would never end
            raise ValueError("echo backend: token_latency_ms must be a finite number >= 0")
        prefix = options.get("prefix", "") or ""
        if not isinstance(prefix, str):
            raise ValueError("echo backend: prefix must be a string")
        self._latency_s = latency_ms / 1000.0
        self._prefix = prefix
        self._prefix_words = len(prefix.split())

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        tokens = split_words(last_user_text(request.messages))
        words = len(tokens)
        if words == 1 and tokens[0].isspace():
            words = 0  # whitespace-only text: one delta, no words
        if self._prefix:
            words += self._prefix_words
            if tokens:
                tokens[0] = self._prefix + tokens[0]
            else:
                tokens = [self._prefix]
        latency = self._latency_s
        if latency:
            async for token in paced(tokens, latency):
                yield TextDelta(token)
        else:
            for token in tokens:
                yield TextDelta(token)
        yield UsageReport(
            input_tokens=count_input_words(request.messages),
            output_tokens=words,
        )

    async def aclose(self) -> None:
        """Nothing to release; present because the interface requires it."""

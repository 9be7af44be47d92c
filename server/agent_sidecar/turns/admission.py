"""Admission control: how much the parent takes on for prompts not yet ended.

Every prompt the sidecar has accepted and not yet ended — running, queued,
steering — is a live turn: the parent keeps its text, its Prompt call keeps
the request (attachments included) until the stream ends, and its frames,
transcript rows and the worker's copy of the conversation follow. Nothing
else bounds that: a burst of large prompts over many sessions (each session's
queue is capped by its profile's ``queue_cap``, placement.py) grows the
parent and the workers until the host runs out of memory. So ``submit``
refuses a prompt, before anything is written, while the live turns number
``limits.max_prompts_in_flight`` or their prompts hold
``limits.max_prompt_bytes_in_flight`` bytes or more: RESOURCE_EXHAUSTED,
reason OVERLOADED, with RetryInfo, so the caller retries later instead of
losing the message.

The byte cap is checked before the prompt is added, not with it: the held
bytes can pass the cap by one prompt (one request is bounded anyway, by gRPC's
message size and the per-request caps), and in exchange a large prompt is
admitted whenever small ones are, instead of waiting for an idle sidecar that
a steady stream of small prompts may never leave it. The startup restore's
resume turns are not refused: they are the last run's accepted work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import errors as E

if TYPE_CHECKING:
    from .lanes import Turn

RETRY_AFTER_S = 1.0


def prompt_bytes(text: str, payload: dict[str, Any]) -> int:
    """What one prompt counts against the byte cap: its text and attachments."""
    attachments = payload.get("attachments") or ()
    return len(text.encode()) + sum(int(a.get("size", 0)) for a in attachments)


class LiveTurns(dict[str, "Turn"]):
    """request id -> Turn for every turn not yet ended, with ``held_bytes``,
    the sum of their ``prompt_bytes``. The manager and the startup restore
    only set, delete and pop entries, and those keep the sum; so the counts
    admission asks for are O(1), whatever path ends a turn."""

    def __init__(self) -> None:
        super().__init__()
        self.held_bytes = 0
        self._sizes: dict[str, int] = {}

    def __setitem__(self, rid: str, turn: Turn) -> None:
        self._release(rid)
        super().__setitem__(rid, turn)
        n = self._sizes[rid] = prompt_bytes(turn.text, turn.payload)
        self.held_bytes += n

    def __delitem__(self, rid: str) -> None:
        super().__delitem__(rid)
        self._release(rid)

    def pop(self, rid: str, *default):
        self._release(rid)
        return super().pop(rid, *default)

    def _release(self, rid: str) -> None:
        self.held_bytes -= self._sizes.pop(rid, 0)


def check(live: LiveTurns, limits) -> None:
    """Refuse (OVERLOADED) a new prompt while the live turns are at either
    configured cap (0: no cap)."""
    most = limits.max_prompts_in_flight
    if most and len(live) >= most:
        raise E.SidecarError(
            E.OVERLOADED, f"the sidecar already has {len(live)} prompts in flight or queued"
            f" (limits.max_prompts_in_flight = {most}); retry later", retry_after_s=RETRY_AFTER_S)
    cap = limits.max_prompt_bytes_in_flight
    if cap and live.held_bytes >= cap:
        raise E.SidecarError(
            E.OVERLOADED, f"the prompts in flight or queued already hold {live.held_bytes} bytes"
            f" (limits.max_prompt_bytes_in_flight = {cap}); retry later", retry_after_s=RETRY_AFTER_S)

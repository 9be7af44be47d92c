"""The end of every turn, seen by an operator: one ``turn finished`` log line
(and the end of its span when tracing is on).

Called once per turn, when its terminal frame commits (``Turn.ended``): every
way a turn ends passes there, completed, failed, superseded, cancelled
before it ran, absorbed into a newer follow-up. The fields (docs/operations.md):
request_id, session_key, platform, profile, outcome (the terminal frame's
kind), reason (a failure's reason code, else ""), duration_ms (from its
acceptance to now), input_tokens and output_tokens (the turn's usage), frames
(its frame count, the terminal frame's seq), and for a failed turn ``detail``
(the start of its message).

The turn is read by attribute (turns/lanes.py Turn): obs sits below turns.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from .. import logs
from . import tracing

log = logging.getLogger("agent_sidecar.turns")
DETAIL_CHARS = 300


def finished(turn: Any, frame: Any) -> None:
    """``turn`` ended with the committed terminal ``frame`` (an ActivityFrame)."""
    outcome = frame.WhichOneof("event")
    reason = frame.failed.reason if outcome == "failed" else ""
    if tracing.ACTIVE is not None:
        tracing.ACTIVE.turn_ended(turn, outcome, reason)
    if not log.isEnabledFor(logging.INFO):
        return
    usage = turn.usage
    fields = {"request_id": turn.rid, "session_key": turn.key, "platform": turn.platform,
              "profile": turn.profile, "outcome": outcome, "reason": reason,
              "duration_ms": round((time.time() - turn.created_at) * 1e3, 1),
              "input_tokens": int(usage.get("input_tokens", 0)),
              "output_tokens": int(usage.get("output_tokens", 0)), "frames": frame.seq}
    if outcome == "failed":
        fields["detail"] = frame.failed.message[:DETAIL_CHARS]
    logs.info_fields(log, "turn finished", fields)

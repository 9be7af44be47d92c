"""A prompt the load generator sent (``Turn``), what became of it, and the
figures of a finished point (``summarize``): bench/load.py's module
docstring says what each phase counts, and which prompts are *absorbed*
(ran in another prompt's turn) rather than turns."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import stats
from .target import BenchError

if TYPE_CHECKING:
    from .load import Point

WARMUP, MEASURE, DRAIN = "warmup", "measure", "drain"
COMPLETED = "completed"
# A prompt's outcome when it ran no turn of its own (the module docstring).
STEERED, MERGED = "steered", "merged"
ABSORBED = (STEERED, MERGED)
# Status codes that refuse the request itself: sent again, it is refused again.
REFUSALS = frozenset({"INVALID_ARGUMENT", "FAILED_PRECONDITION", "PERMISSION_DENIED", "UNAUTHENTICATED",
                      "NOT_FOUND", "OUT_OF_RANGE", "UNIMPLEMENTED"})
# A Turn's ``code`` when a ``failed`` frame ended it: the turn ran, and the
# model or the agent failed it (LLM_API_FAILURE, MAX_ITERATIONS, ...).
TURN_FAILED = "TURN_FAILED"
# The code of a turn that ran past the bench's own --turn-timeout.
TIMED_OUT = "DEADLINE_EXCEEDED"


@dataclass
class Turn:
    phase: str
    start: float
    first: float | None = None
    last: float | None = None  # the last text delta
    end: float = 0.0
    deltas: int = 0
    words: int = 0  # of the text deltas' text
    first_words: int = 0  # of the first text delta's
    tool_calls: int = 0
    accepted: bool = False  # an 'accepted' frame came: the sidecar took the prompt (its store holds it)
    started: bool = False  # a 'started' frame came: a turn of its own ran
    outcome: str = ""  # "completed", "steered" or "merged" (ABSORBED), or the reason it did not complete
    code: str = ""  # the status code of the error that ended it, if one did
    message: str = ""  # and its message, as the server gave it
    retry_after: float = 0.0  # the error's RetryInfo delay: its lane waits it out (load.start_lanes)


def summarize(point: Point, cpu: dict | None) -> dict:
    """The figures of a finished point (the JSON document's ``points[]`` entry
    without its labels)."""
    window = (point.w1 or time.monotonic()) - (point.w0 or point.t0)
    measured = [t for t in point.turns if t.phase == MEASURE]
    ok = [t for t in measured if t.outcome == COMPLETED]
    not_turns = (COMPLETED, *ABSORBED)
    errors = Counter(t.outcome for t in measured if t.outcome not in not_turns)
    failed = Counter(t.outcome for t in point.turns if t.accepted and t.outcome not in not_turns)
    refused = Counter(t.outcome for t in point.turns if not t.accepted and t.outcome not in not_turns)
    absorbed = Counter(t.outcome for t in measured if t.outcome in ABSORBED)
    all_absorbed = Counter(t.outcome for t in point.turns if t.outcome in ABSORBED)
    window = max(window, 1e-9)
    out = {
        "window_s": window,
        "turns": len(ok),
        "turns_per_s": point.window_done / window,
        "deltas_per_s": point.window_deltas / window,
        "words_per_s": point.window_words / window,
        "tool_calls_per_s": point.window_tool_calls / window,
        "deltas_per_turn": (sum(t.deltas for t in ok) / len(ok)) if ok else None,
        # Words per turn against deltas per turn: how many a frame carries (a
        # coalescing sidecar sends several); the first delta's words on their own.
        "words_per_turn": (sum(t.words for t in ok) / len(ok)) if ok else None,
        "first_delta_words": (sum(t.first_words for t in ok) / len(ok)) if ok else None,
        # The stream's pace: per turn, the mean gap between its deltas.
        "delta_gap_ms": stats.summarize(((t.last - t.first) / (t.deltas - 1) for t in ok
                                         if t.deltas > 1 and t.first is not None and t.last is not None), 1e3),
        "first_delta_ms": stats.summarize((t.first - t.start for t in ok if t.first is not None), 1e3),
        "turn_ms": stats.summarize((t.end - t.start for t in ok), 1e3),
        "errors": dict(errors),
        "error_count": sum(errors.values()),
        # prompts of the window that ran no turn of their own (steered, merged): in no figure above
        "absorbed": dict(absorbed),
        "absorbed_count": sum(absorbed.values()),
        # "started": the prompts the sidecar took that were turns (completed or failed), not
        # the absorbed ones; "refused": those it refused (OVERLOADED, ...), in no store
        "totals": {"started": sum(1 for t in point.turns if t.accepted and t.outcome not in ABSORBED),
                   "completed": sum(1 for t in point.turns if t.outcome == COMPLETED),
                   "failed": dict(failed),
                   "refused": dict(refused),
                   "absorbed": dict(all_absorbed),
                   "deltas": sum(t.deltas for t in point.turns),
                   "tool_calls": sum(t.tool_calls for t in point.turns)},
        "warmup_s": ((point.w0 - point.t0) if point.w0 else 0.0),
        "series": stats.series(((t.end, t.end - t.start, t.outcome == COMPLETED) for t in point.turns
                                if t.outcome not in ABSORBED),
                               point.deltas_by_second, point.t0, max(t.end for t in point.turns)
                               if point.turns else point.t0 + 1),
        "series_window": [(point.w0 or point.t0) - point.t0, (point.w1 or point.t0) - point.t0],
        "procs": cpu,
        "refused": refusal(point.turns),
    }
    if cpu is not None and point.window_deltas:
        out["server_cpu_us_per_delta"] = 1e6 * cpu["server_cpu_s"] / point.window_deltas
    if cpu is not None and point.window_words:  # the same text in fewer frames costs less per word
        out["server_cpu_us_per_word"] = 1e6 * cpu["server_cpu_s"] / point.window_words
    return out


def refusal(turns: list[Turn]) -> dict | None:
    """When every prompt of ``turns`` ended the same way, a way that ends
    every later one too: refused with a code that refuses the request itself
    (REFUSALS: a prompt too big, say), or run and failed (TURN_FAILED: a
    model that cannot be reached, or refuses its key); that end: its code,
    reason, the server's message and how many; else None. Or past the
    bench's own ``--turn-timeout`` (TIMED_OUT), which a busier point will
    not beat either."""
    kinds = {(t.code, t.outcome) for t in turns}
    if not turns or len(kinds) != 1:
        return None
    ((code, reason),) = kinds
    if code not in REFUSALS and code not in (TURN_FAILED, TIMED_OUT):
        return None
    return {"code": code, "reason": reason, "message": turns[0].message, "prompts": len(turns)}


def check_refused(result: dict, where: str) -> None:
    """BenchError, quoting the server, when ``result`` (the calibration's,
    or the first point's) completed no turn because every prompt was refused
    the same way (a prompt past the sidecar's text cap, say), or every turn
    failed the same way (a model whose key is refused): the rest of the run
    would only end so again (before, a whole sweep ran, every turn an error,
    and exited 0 with "no completed turn")."""
    refused = result.get("refused")
    if refused is None or result["totals"]["completed"]:
        return
    code, reason, message = refused["code"], refused["reason"], refused["message"] or "(no message)"
    if code == TURN_FAILED:
        raise BenchError(f"every turn of {where} failed ({refused['prompts']} of them): {reason}: {message}")
    if code == TIMED_OUT:
        raise BenchError(f"every turn of {where} ran past --turn-timeout ({refused['prompts']} of them): "
                         f"give it more than a turn takes")
    raise BenchError(f"every prompt of {where} was refused ({refused['prompts']} of them): "
                     f"{code if reason == code else f'{code} {reason}'}: {message}")

"""The bench's own option types and bounds (bench_cmd.py builds its parser
with them).

Every count and time a run is sized by has an upper bound a real run stays
well under, so a typo (``--concurrency 100000000``, an extra zero or three)
is argparse's one line naming the option, exit status 2, not a run that
makes a hundred million lanes or sessions in memory before its first turn
(it grew past 20 GB here before the kernel killed it) or one that never
ends. The bounds, and why each:

* lanes (``--concurrency``, each ``--sweep`` level, ``--find-knee``): at
  most MAX_LANES, the Prompt streams one credential may hold open on a
  sidecar at its defaults (limits.max_streams_per_credential); past it the
  sidecar refuses the extra lanes OVERLOADED;
* ``--sessions``: MAX_SESSIONS, ten for each of the most lanes;
* ``--turns``: MAX_TURNS per point, and ``--duration``, ``--warmup``,
  ``--ramp``: MAX_POINT_SECONDS, an hour: a point keeps every turn it sent
  for its percentiles (a few hundred bytes each);
* ``--clients``: MAX_CLIENTS processes; ``--repeat``: MAX_REPEAT sweeps;
  ``--calibrate``: MAX_CALIBRATE turns, one at a time;
* ``--prompt-words``: what fits the sidecar's default text cap.
"""

from __future__ import annotations

import argparse

from .argtypes import non_negative, positive

MAX_LANES = 10_000
MAX_SESSIONS = 100_000
MAX_TURNS = 1_000_000
MAX_POINT_SECONDS = 3600.0
MAX_CLIENTS = 64
MAX_REPEAT = 100
MAX_CALIBRATE = 1_000

# Common words, cycled to build --prompt-words N: a prompt a tokenizer and a
# model treat as ordinary text, and the echo model answers word for word.
_VOCABULARY = ("the quick brown fox jumps over a lazy dog while seven bright stars shine above "
               "quiet hills and every river runs down to the sea where old ships wait for morning "
               "light to carry them home again").split()
DELIVERIES = ("queue", "follow_up", "reject_if_busy", "interrupt", "rollback", "steer")


# The sidecar's default cap on a prompt's text (limits.max_text_bytes): a longer
# --prompt-words is refused by every sidecar left at its defaults (--prompt
# carries a longer text for one whose cap was raised).
MAX_PROMPT_BYTES = 256 * 1024


def prompt_of(words: int) -> str:
    return " ".join(_VOCABULARY[i % len(_VOCABULARY)] for i in range(words))


def max_prompt_words() -> int:
    """The most words of prompt_of whose text fits MAX_PROMPT_BYTES."""
    cycle = len(" ".join(_VOCABULARY)) + 1  # the bytes of one round of the vocabulary, with its space
    words, size = len(_VOCABULARY) * (MAX_PROMPT_BYTES // cycle), (MAX_PROMPT_BYTES // cycle) * cycle - 1
    while size + 1 + len(_VOCABULARY[words % len(_VOCABULARY)]) <= MAX_PROMPT_BYTES:
        size += 1 + len(_VOCABULARY[words % len(_VOCABULARY)])
        words += 1
    return words


def prompt_words(text: str) -> int:
    """``--prompt-words``: above 0, and no more than a prompt can carry."""
    words = int(positive(int)(text))
    most = max_prompt_words()
    if words > most:
        raise argparse.ArgumentTypeError(
            f"{words} words are more than a prompt carries: at most {most} (the sidecar's default text cap, "
            f"limits.max_text_bytes, is {MAX_PROMPT_BYTES // 1024} KiB; --prompt takes a longer text)")
    return words


def levels(text: str) -> list[int]:
    """``--sweep``: concurrency levels, each 1 to MAX_LANES, in order, once each."""
    try:
        found = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a comma-separated list of integers") from None
    if not found or found[0] < 1 or found[-1] > MAX_LANES:
        raise argparse.ArgumentTypeError(f"{text!r}: every level must be >= 1 and <= {MAX_LANES}")
    return found


def seconds_or_auto(text: str) -> float | None:
    """``--warmup`` and ``--ramp``: seconds (>= 0, at most MAX_POINT_SECONDS), or ``auto`` (None)."""
    if text == "auto":
        return None
    try:
        float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: seconds, or 'auto'") from None
    return non_negative(float, MAX_POINT_SECONDS)(text)

"""Small text helpers shared by the built-in test/demo backends (echo, scripted),
and the pace they stream at (shared with the bench's bare server).

Kept apart so both backends split and count text the same way: a test that runs
the same words through either backend sees the same deltas and the same usage.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

# A "word" token is the word plus the whitespace after it; leading whitespace
# sticks to the first word. Concatenating the tokens gives the text back exactly.
_WORD = re.compile(r"\s*\S+\s*")


async def paced(items: Sequence[T], interval_s: float, first_s: float | None = None) -> AsyncIterator[T]:
    """Each item when it is due: the first at start + ``first_s`` (default
    ``interval_s``), each later one ``interval_s`` after the one before, on
    the loop's clock, as a remote model streams at its own pace whatever its
    consumer does. An item that comes due while the consumer is still busy
    with the last one follows at once: the consumer's own time (a write, a
    commit) never adds up over a stream, so a streaming server is measured
    against the model's pace, not its pace plus its writes."""
    loop = asyncio.get_running_loop()
    due = loop.time() + (interval_s if first_s is None else first_s)
    for item in items:
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        yield item
        due += interval_s


def split_words(text: str) -> list[str]:
    """Split ``text`` into word tokens whose concatenation equals ``text``.

    Whitespace-only text is one token (so it round-trips too); empty text is none.
    """
    tokens = _WORD.findall(text)
    if not tokens and text:
        return [text]
    return tokens


def content_text(content: Any) -> str:
    """The text of an OpenAI message ``content``: a string, None, or a list of
    parts (``{"type": "text", "text": ...}``; non-text parts are skipped)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    return str(content)


def count_input_words(messages: Iterable[dict[str, Any]]) -> int:
    """A rough input token count: words in every message's content. Cheap and
    predictable, which is what the fake backends need (tests can assert it)."""
    total = 0
    for message in messages:
        content = message.get("content")
        if content:
            total += len(content_text(content).split())
    return total


def last_user_text(messages: list[dict[str, Any]]) -> str:
    """Content of the last ``user`` message, or "" when there is none."""
    for message in reversed(messages):
        if message.get("role") == "user":
            return content_text(message.get("content"))
    return ""

"""``scripted``: a backend that plays a JSON list of steps, for tests.

Model call number ``request.iteration`` (0-based, within the turn) plays
``steps[iteration]``. Past the end, the last step repeats if it has
``"repeat": true``; otherwise the call is a final answer with empty text. This
lets a test drive the agent loop through tool calls, timeouts, model failures,
steering and crashes without a real model.

A step is a dict (a bare string is shorthand for ``{"text": ...}``). Within one
call the parts run in this order, so they combine predictably:

1. ``sleep_ms``: sleep first (timeout and cancellation tests).
2. ``error`` (+ ``times``): raise ModelError. With ``times: K`` only the first K
   plays of this step raise (per backend instance); later plays go on with the
   rest of the step, simulating a backend that recovers.
3. text, from exactly one of ``text``, ``echo_input`` (every user message since
   the last assistant message, joined by "\\n": shows what the model received,
   e.g. a steered message) or ``text_from_last_tool_result`` (content of the last
   tool message). ``delay_ms`` sleeps before the first token and
   ``token_latency_ms`` before each token.
4. ``kill``: ``"worker"`` SIGKILLs this process; ``"sidecar"`` SIGKILLs the
   parent and then this process. Placed after the text so a crash can happen
   mid-turn with output already streamed.
5. ``tool_calls``: ``[{"name", "arguments" (dict or JSON text), "id"?}]``, ids
   default to ``call_<iteration>_<n>``.
6. a UsageReport: input_tokens = words in the input, output_tokens = words of
   text; ``usage`` (a dict of UsageReport fields) overrides any of them.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agent_sidecar.models._text import content_text, count_input_words, split_words
from agent_sidecar.models.base import (
    ModelError,
    ModelEvent,
    ModelRequest,
    TextDelta,
    ToolCallRequest,
    UsageReport,
)

STEP_KEYS = frozenset({
    "text", "echo_input", "text_from_last_tool_result", "tool_calls",
    "delay_ms", "token_latency_ms", "sleep_ms", "error", "times", "kill",
    "repeat", "usage",
})
_TEXT_SOURCES = ("text", "echo_input", "text_from_last_tool_result")
_MS_KEYS = ("delay_ms", "token_latency_ms", "sleep_ms")
_USAGE_KEYS = frozenset(UsageReport.__dataclass_fields__)
_OPTIONS = frozenset({"steps", "steps_file"})


def _validate_step(i: int, step: Any) -> dict[str, Any]:
    """Check one step and return it as a dict; errors name the step index."""
    where = f"scripted backend: step {i}"
    if isinstance(step, str):
        return {"text": step}
    if not isinstance(step, dict):
        raise ValueError(f"{where} must be a dict (or a string), got {type(step).__name__}")
    unknown = set(step) - STEP_KEYS
    if unknown:
        raise ValueError(f"{where} has unknown key(s) {sorted(unknown)}; known: {sorted(STEP_KEYS)}")
    sources = [k for k in _TEXT_SOURCES if step.get(k) not in (None, False)]
    if len(sources) > 1:
        raise ValueError(f"{where}: use only one of {list(_TEXT_SOURCES)}, got {sources}")
    if "text" in step and not isinstance(step["text"], str):
        raise ValueError(f"{where}: text must be a string")
    for key in _MS_KEYS:
        if key in step and (isinstance(step[key], bool) or not isinstance(step[key], (int, float))
                            or not 0 <= step[key] < math.inf):
            raise ValueError(f"{where}: {key} must be a finite number >= 0")
    if "error" in step and not isinstance(step["error"], str):
        raise ValueError(f"{where}: error must be a string (the message)")
    if "times" in step:
        if "error" not in step:
            raise ValueError(f"{where}: times only applies to error")
        if isinstance(step["times"], bool) or not isinstance(step["times"], int) or step["times"] < 1:
            raise ValueError(f"{where}: times must be an integer >= 1")
    if "kill" in step and step["kill"] not in ("worker", "sidecar"):
        raise ValueError(f"{where}: kill must be 'worker' or 'sidecar'")
    if "usage" in step:
        usage = step["usage"]
        if not isinstance(usage, dict) or set(usage) - _USAGE_KEYS:
            raise ValueError(f"{where}: usage must be a dict with keys from {sorted(_USAGE_KEYS)}")
    if "tool_calls" in step:
        calls = step["tool_calls"]
        if not isinstance(calls, list):
            raise ValueError(f"{where}: tool_calls must be a list")
        for n, call in enumerate(calls):
            if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
                raise ValueError(f"{where}: tool_calls[{n}] needs a non-empty string 'name'")
            extra = set(call) - {"name", "arguments", "id"}
            if extra:
                raise ValueError(f"{where}: tool_calls[{n}] has unknown key(s) {sorted(extra)}")
            args = call.get("arguments", {})
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except ValueError:
                    raise ValueError(f"{where}: tool_calls[{n}].arguments is not valid JSON") from None
            if not isinstance(args, dict):
                raise ValueError(f"{where}: tool_calls[{n}].arguments must be a JSON object")
            if "id" in call and not isinstance(call["id"], str):
                raise ValueError(f"{where}: tool_calls[{n}].id must be a string")
    return step


def load_steps(options: dict[str, Any]) -> list[dict[str, Any]]:
    """Read and validate the steps from ``steps`` or ``steps_file``."""
    unknown = set(options) - _OPTIONS
    if unknown:
        raise ValueError(f"scripted backend: unknown option(s) {sorted(unknown)}; known: {sorted(_OPTIONS)}")
    if ("steps" in options) == ("steps_file" in options):
        raise ValueError("scripted backend: give exactly one of 'steps' or 'steps_file'")
    if "steps_file" in options:
        if not isinstance(options["steps_file"], str) or not options["steps_file"]:
            raise ValueError(f"scripted backend: steps_file must be a file name, got {options['steps_file']!r}")
        path = Path(options["steps_file"])
        try:
            steps = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ValueError(f"scripted backend: cannot read steps_file {str(path)!r}: {exc}") from None
        except ValueError as exc:
            raise ValueError(f"scripted backend: steps_file {str(path)!r} is not valid JSON: {exc}") from None
    else:
        steps = options["steps"]
    if not isinstance(steps, list):
        raise ValueError(f"scripted backend: steps must be a list, got {type(steps).__name__}")
    return [_validate_step(i, step) for i, step in enumerate(steps)]


def _echo_input(messages: list[dict[str, Any]]) -> str:
    users: list[str] = []
    for message in reversed(messages):
        role = message.get("role")
        if role == "assistant":
            break
        if role == "user":
            users.append(content_text(message.get("content")))
    users.reverse()
    return "\n".join(users)


def _last_tool_result(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "tool":
            return content_text(message.get("content"))
    return ""


class ScriptedModel:
    """Plays ``steps`` (see the module docstring for the step vocabulary)."""

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        self.steps = load_steps(dict(options or {}))
        self._plays: dict[int, int] = {}  # step index -> times played (for error "times")

    def _step_for(self, iteration: int) -> tuple[int, dict[str, Any]]:
        if iteration < len(self.steps):
            return iteration, self.steps[iteration]
        if self.steps and self.steps[-1].get("repeat"):
            return len(self.steps) - 1, self.steps[-1]
        return -1, {"text": ""}

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        index, step = self._step_for(request.iteration)
        played = self._plays.get(index, 0)
        self._plays[index] = played + 1

        if step.get("sleep_ms"):
            await asyncio.sleep(step["sleep_ms"] / 1000.0)
        if "error" in step and ("times" not in step or played < step["times"]):
            raise ModelError(step["error"])

        if step.get("echo_input"):
            text = _echo_input(request.messages)
        elif step.get("text_from_last_tool_result"):
            text = _last_tool_result(request.messages)
        else:
            text = step.get("text", "")
        if step.get("delay_ms"):
            await asyncio.sleep(step["delay_ms"] / 1000.0)
        latency = step.get("token_latency_ms", 0) / 1000.0
        for token in split_words(text):
            if latency:
                await asyncio.sleep(latency)
            yield TextDelta(token)

        kill = step.get("kill")
        if kill == "sidecar":
            os.kill(os.getppid(), signal.SIGKILL)
        if kill:
            os.kill(os.getpid(), signal.SIGKILL)

        for n, call in enumerate(step.get("tool_calls", ())):
            args = call.get("arguments", {})
            yield ToolCallRequest(
                call_id=call.get("id") or f"call_{request.iteration}_{n}",
                name=call["name"],
                arguments_json=args if isinstance(args, str) else json.dumps(args),
            )

        usage = {"input_tokens": count_input_words(request.messages), "output_tokens": len(text.split())}
        usage.update(step.get("usage", {}))
        yield UsageReport(**usage)

    async def aclose(self) -> None:
        """Nothing to release; present because the interface requires it."""

"""``openai``: any OpenAI-compatible chat-completions endpoint, streamed.

One POST to ``{base_url}/chat/completions`` per model call, with ``stream: true``
and ``stream_options.include_usage``. Text deltas are yielded as they arrive;
tool-call fragments (streamed by index: id, name and argument pieces) are put
together and yielded once the stream ends, then the usage.

Transient failures (connect/transport errors, 429, 5xx) are retried with
exponential backoff and jitter, honouring ``Retry-After`` -- but only while
nothing has been yielded for the call, since a half-streamed answer cannot be
taken back. Anything else, or exhausted retries, raises ModelError with the
status and an excerpt of the body, which fails the turn with LLM_API_FAILURE.
The endpoint may be a buggy proxy or a hostile server, so what is read is
bounded (openai_body: error excerpts, whole replies, SSE lines, decompression;
openai_wire: the answer's size, its tool calls, each field's JSON type) and
redirects are not followed: any answer ends the call with a ModelError naming
the cause, within bounded memory.

OpenAI function names may not contain '.', while sidecar tool names are dotted
(``discord.send_message``), so names are mapped to a safe form on the way in
(``discord__send_message``) and back on the way out.

httpx is imported lazily: worker processes import this package, and only a
worker that actually uses this backend should pay for httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from agent_sidecar.models import openai_body as body_io
from agent_sidecar.models.base import ModelError, ModelEvent, ModelRequest
from agent_sidecar.models.openai_wire import (
    ANSWER_CAP,
    LINE_CAP,
    Retryable,
    StreamParser,
    call_tag,
    convert_message,
    events_from_message,
    excerpt,
    loads_chunk,
    retry_after_s,
    safe_tool_name,
)

# Lines of a stream read in one go at most: lines already received are read
# without waiting, so a fast stream would hold the worker's loop for as long
# as it keeps coming.
YIELD_EVERY_LINES = 64

_OPTIONS = frozenset({
    "base_url", "model", "api_key_env", "temperature", "max_retries", "backoff_initial_s",
    "backoff_max_s", "retry_after_max_s", "timeout_s", "extra_headers",
})


def _number(options: dict[str, Any], key: str, default: float, positive: bool = False) -> float:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (positive and value == 0):
        raise ValueError(f"openai backend: {key} must be a number {'>' if positive else '>='} 0, got {value!r}")
    return float(value)


class OpenAIModel:
    """Options: ``model`` (required), ``base_url`` (https://api.openai.com/v1),
    ``api_key_env`` (env var holding the key; optional for local servers),
    ``temperature``, ``max_retries`` (4), ``backoff_initial_s`` (0.5),
    ``backoff_max_s`` (8), ``retry_after_max_s`` (60: cap on a server's
    Retry-After), ``timeout_s`` (120), ``extra_headers`` (dict)."""

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        options = dict(options or {})
        unknown = set(options) - _OPTIONS
        if unknown:
            raise ValueError(f"openai backend: unknown option(s) {sorted(unknown)}; known: {sorted(_OPTIONS)}")
        if not isinstance(options.get("model"), str) or not options["model"]:
            raise ValueError("openai backend: option 'model' is required")
        self.model: str = options["model"]
        base_url = options.get("base_url") or "https://api.openai.com/v1"
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"openai backend: base_url must be an http:// or https:// URL, got {base_url!r}")
        self.url = base_url.rstrip("/") + "/chat/completions"
        # Sent as given; a string or a negative number would fail every call with the endpoint's HTTP 400.
        self.temperature = None if options.get("temperature") is None else _number(options, "temperature", 0)
        self.max_retries = int(_number(options, "max_retries", 4))
        self.backoff_initial_s = _number(options, "backoff_initial_s", 0.5)
        self.backoff_max_s = _number(options, "backoff_max_s", 8)
        self.retry_after_max_s = _number(options, "retry_after_max_s", 60)
        self.timeout_s = _number(options, "timeout_s", 120, positive=True)  # 0 would fail every call
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream",
                        "Accept-Encoding": body_io.ACCEPT_ENCODING}
        key_env = options.get("api_key_env")
        if key_env is not None and not isinstance(key_env, str):
            raise ValueError(f"openai backend: api_key_env must be the name of an environment variable, "
                             f"got {key_env!r}")
        if key_env:
            key = os.environ.get(key_env)
            if not key:
                raise ValueError(f"openai backend: environment variable {key_env!r} (api_key_env) is not set")
            self.headers["Authorization"] = f"Bearer {key}"
        extra = options.get("extra_headers") or {}
        if not isinstance(extra, dict):
            raise ValueError("openai backend: extra_headers must be a table of strings")
        self.headers.update({str(k): str(v) for k, v in extra.items()})
        self._client: Any = None  # httpx.AsyncClient, created on first use

    def _http(self) -> Any:
        if self._client is None:
            import httpx

            self._client = httpx.AsyncClient(timeout=httpx.Timeout(self.timeout_s), headers=self.headers)
        return self._client

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    def build_body(self, request: ModelRequest) -> tuple[dict[str, Any], dict[str, str]]:
        """The request JSON, plus the safe->original tool-name map for the reply."""
        names: dict[str, str] = {}

        def safe(name: str) -> str:
            mapped = safe_tool_name(name)
            names.setdefault(mapped, name)
            return mapped

        tools = [
            {"type": "function", "function": {
                "name": safe(t["name"]),
                "description": t.get("description", ""),
                "parameters": t.get("parameters") or {"type": "object", "properties": {}},
            }}
            for t in request.tools
        ]
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [convert_message(m, safe) for m in request.messages],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if tools:
            body["tools"] = tools
        if self.temperature is not None:
            body["temperature"] = self.temperature
        return body, names

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        body, names = self.build_body(request)
        payload = json.dumps(body).encode()
        tag = call_tag(request.request_id, request.iteration)  # for call ids the server leaves out
        headers = {"traceparent": request.traceparent} if request.traceparent else None
        attempt = 0
        while True:
            yielded = False
            try:
                # aclosing: if our consumer stops early, the HTTP response is
                # closed now rather than whenever the generator is collected.
                async with contextlib.aclosing(self._attempt(payload, tag, names, headers)) as events:
                    async for event in events:
                        yielded = True
                        yield event
                return
            except Retryable as exc:
                if yielded:
                    raise ModelError(f"openai backend: stream broke after output started: {exc}") from None
                if attempt >= self.max_retries:
                    raise ModelError(f"openai backend: giving up after {attempt + 1} attempts: {exc}") from None
                delay = min(self.backoff_max_s, self.backoff_initial_s * (2 ** attempt))
                delay *= 0.5 + random.random() / 2
                if exc.retry_after is not None:
                    if exc.retry_after > self.retry_after_max_s:  # waiting less would be refused again
                        raise ModelError(f"openai backend: {exc}; it asks to retry after {exc.retry_after:g} s, "
                                         f"more than retry_after_max_s ({self.retry_after_max_s:g})") from None
                    delay = max(delay, exc.retry_after)
                attempt += 1
                await asyncio.sleep(delay)

    async def _attempt(self, payload: bytes, tag: str, names: dict[str, str],
                       headers: dict[str, str] | None = None) -> AsyncGenerator[ModelEvent, None]:
        """One HTTP exchange (``headers``: this call's own, besides the client's).
        Raises Retryable for transient failures. What is read of the body is
        bounded (openai_body), so no answer can hold the worker's memory."""
        import httpx

        try:
            async with self._http().stream("POST", self.url, content=payload, headers=headers) as response:
                if response.status_code >= 300:
                    await self._refuse(response)
                if "text/event-stream" not in response.headers.get("content-type", ""):
                    for event in await self._whole_reply(response, tag, names):
                        yield event
                    return
                parser, n = StreamParser(tag, names), 0
                async for line in body_io.lines(response, LINE_CAP):
                    for event in parser.feed(line):
                        yield event
                    if parser.done:
                        break
                    n += 1
                    if n % YIELD_EVERY_LINES == 0:  # a fast stream: the worker's other sessions
                        await asyncio.sleep(0)  # get the loop between its lines
                for event in parser.finish():
                    yield event
        except httpx.TransportError as exc:
            raise Retryable(f"{type(exc).__name__}: {exc} ({self.url})") from None

    async def _refuse(self, response: Any) -> None:
        """A status of 300 or more: always raises. An error's message carries
        an excerpt of its body, of which only the first few KB are read (an
        error body may be huge or endless). Redirects are not followed -- the
        request carries the API key, and base_url is the operator's to fix."""
        status = response.status_code
        if status < 400:
            where = response.headers.get("location") or "nowhere (no Location)"
            raise ModelError(f"openai backend: HTTP {status} from {self.url}: a redirect to {where}, which is "
                             f"not followed (the request carries the API key); set base_url to the endpoint itself")
        snippet = excerpt(await body_io.read_prefix(response, 4096))
        message = f"HTTP {status} from {self.url}: {snippet}"
        if status == 429 or status >= 500:
            raise Retryable(message, retry_after_s(response.headers.get("retry-after")))
        raise ModelError(f"openai backend: {message}")

    async def _whole_reply(self, response: Any, tag: str, names: dict[str, str]) -> list[ModelEvent]:
        """A reply that is not an event stream: a server that ignored
        stream=true sends one chat.completion JSON, read up to ANSWER_CAP."""
        what = (f"HTTP {response.status_code} from {self.url} (Content-Type "
                f"{response.headers.get('content-type', 'none')!r}, not an event stream)")
        data = loads_chunk(await body_io.read_all(response, ANSWER_CAP, what), what)
        return events_from_message(data, tag, names)

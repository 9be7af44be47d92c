"""A real (tiny) OpenAI-compatible HTTP server for tests.

It listens on 127.0.0.1 with an ephemeral port in a background thread and plays
a script of responses, one per request to ``/v1/chat/completions``; past the end
the last entry repeats. Used by the model-backend tests and reusable by gRPC-level
tests (``model_options = {"base_url": fake.url, ...}``).

Script entries (dicts):
- ``{"status": 500, "body": "...", "headers": {...}}``: an error response
  (``{"status": 429, "headers": {"Retry-After": "1"}}`` for rate limiting).
- ``{"text": "hello world"}``: streamed text, one chunk per word.
- ``{"tool_calls": [{"name": "test.add", "arguments": {...}, "id": "..."}]}``:
  streamed tool calls, each split over several chunks (name and id first, then
  the arguments JSON in pieces). Names are sent in the safe form (dots -> "__"),
  as a real model would. Combine with ``text`` for text first.
- ``"usage": {...}``: override the usage chunk (default derived from words);
  ``"usage": None`` sends none.
- ``{"hold": True}``: start a stream (its first chunk) and send nothing more
  until the client hangs up; ``.holding`` is set once it is held,
  ``.hung_up`` once the client closed it.
- ``"wait_for": threading.Event``: answer once the test sets it (``.holding``
  is set when the request has come).
- ``"delay_s": N``: wait before answering; ``"truncate": True``: close the
  stream after the text without finish_reason or [DONE] (a broken connection).
- ``{"status": 302, "body": "", "headers": {"Location": ...}}``: any status
  other than 200, or a ``body`` with a 200, is sent as it is, its Content-Type
  ``"content_type"`` (default application/json).

Hostile answers (a buggy proxy, a misconfigured gateway), each sent with
``"status"`` (200) and ``"content_type"`` (text/event-stream):
- ``"raw": "..."``: this body verbatim (malformed SSE lines, wrong shapes;
  a surrogate escape such as "\udcff" is the byte 0xff, invalid UTF-8);
- ``"endless": "piece"``: ``"prefix"`` (default "") then the piece over and
  over until the client hangs up -- an endless error body, JSON reply, SSE line
  or stream of chunks;
- ``"gzip_mb": N``: a gzip body (Content-Encoding: gzip) of ``"prefix"`` then
  N MiB of "a" -- a few dozen KB on the wire.

A request with ``"stream": false`` gets a plain chat.completion JSON reply.
``.requests`` holds the parsed JSON bodies, ``.headers`` the request headers
(lower-cased names), in arrival order.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _pieces(text: str, n: int = 3) -> list[str]:
    """Split text into up to n non-empty pieces (to exercise fragment merging)."""
    size = max(1, -(-len(text) // n))
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


class FakeOpenAI:
    def __init__(self, script: list[dict[str, Any]] | None = None, model: str = "fake-model") -> None:
        self.script = list(script or [{"text": "ok"}])
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.arrivals: list[float] = []  # monotonic arrival time of each request
        self.holding, self.hung_up = threading.Event(), threading.Event()  # a "hold" entry's stream
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------
    @property
    def url(self) -> str:
        assert self._server is not None, "FakeOpenAI not started"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> FakeOpenAI:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def do_POST(self) -> None:
                fake._handle(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,),
                                        name="fake-openai", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @classmethod
    @contextlib.contextmanager
    def several(cls, scripts: dict[str, list[dict[str, Any]]]) -> Iterator[dict[str, FakeOpenAI]]:
        """One started server per named script (a test module's profiles,
        one per scenario); every one is stopped on the way out."""
        servers: dict[str, FakeOpenAI] = {}
        try:
            for name, script in scripts.items():
                servers[name] = cls(script).start()
            yield servers
        finally:
            for server in servers.values():
                server.stop()

    # -- serving -----------------------------------------------------------
    def _next_entry(self, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        with self._lock:
            n = len(self.requests)
            self.requests.append(body)
            self.headers.append(headers)
            self.arrivals.append(time.monotonic())
            return self.script[min(n, len(self.script) - 1)]

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        raw = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        if h.path.rstrip("/") != "/v1/chat/completions":
            return self._send(h, 404, b'{"error": {"message": "not found"}}')
        try:
            body = json.loads(raw)
        except ValueError:
            return self._send(h, 400, b'{"error": {"message": "bad json"}}')
        entry = self._next_entry(body, {k.lower(): v for k, v in h.headers.items()})
        if entry.get("delay_s"):
            time.sleep(entry["delay_s"])
        if entry.get("hold"):
            return self._hold(h)
        if "wait_for" in entry:
            self.holding.set()
            entry["wait_for"].wait(120)
        if {"raw", "endless", "gzip_mb"} & entry.keys():
            return self._hostile(h, entry)
        if entry.get("status", 200) != 200 or "body" in entry:
            payload = entry["body"] if "body" in entry else json.dumps(
                {"error": {"message": f"fake error {entry['status']}"}})
            return self._send(h, entry.get("status", 200), payload.encode(), entry.get("headers"),
                              entry.get("content_type", "application/json"))
        if body.get("stream") is False:
            return self._send(h, 200, json.dumps(self._completion(entry)).encode())
        self._stream(h, entry)

    def _send(self, h: BaseHTTPRequestHandler, status: int, payload: bytes, headers: dict | None = None,
              content_type: str = "application/json") -> None:
        h.send_response(status)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(payload)))
        for k, v in (headers or {}).items():
            h.send_header(k, str(v))
        h.end_headers()
        h.wfile.write(payload)

    def _hostile(self, h: BaseHTTPRequestHandler, entry: dict[str, Any]) -> None:
        h.send_response(entry.get("status", 200))
        h.send_header("Content-Type", entry.get("content_type", "text/event-stream"))
        prefix = entry.get("prefix", "").encode()
        if "gzip_mb" in entry:
            packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: a gzip header
            block = b"a" * 2**20
            payload = packer.compress(prefix) + b"".join(packer.compress(block) for _ in range(entry["gzip_mb"]))
            payload += packer.flush()
            h.send_header("Content-Encoding", "gzip")
            h.send_header("Content-Length", str(len(payload)))
        else:
            payload = prefix + entry.get("raw", "").encode("utf-8", "surrogateescape")
        h.end_headers()  # HTTP/1.0 without a length: the body ends when the connection closes
        try:
            h.wfile.write(payload)
            piece = entry.get("endless", "").encode()
            piece *= 65536 // max(1, len(piece))
            while piece:  # until the client hangs up
                h.wfile.write(piece)
        except OSError:  # the client hung up: what an endless answer waits for
            pass

    def _hold(self, h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        h.wfile.write(self._chunk({"role": "assistant", "content": ""}))
        h.wfile.flush()
        self.holding.set()
        try:
            while h.rfile.read(1):  # nothing more comes from a client but its hang-up
                pass
        except OSError:
            pass
        self.hung_up.set()

    def _usage(self, entry: dict[str, Any]) -> dict[str, Any] | None:
        if "usage" in entry:
            return entry["usage"]
        words = len(entry.get("text", "").split())
        return {"prompt_tokens": 10, "completion_tokens": words, "total_tokens": 10 + words}

    def _chunk(self, delta: dict[str, Any] | None, finish: str | None = None, usage: Any = None) -> bytes:
        chunk: dict[str, Any] = {"id": "chatcmpl-fake", "object": "chat.completion.chunk",
                                 "created": int(time.time()), "model": self.model,
                                 "choices": [] if delta is None else
                                 [{"index": 0, "delta": delta, "finish_reason": finish}]}
        if usage is not None:
            chunk["usage"] = usage
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"

    def _stream(self, h: BaseHTTPRequestHandler, entry: dict[str, Any]) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Cache-Control", "no-cache")
        h.end_headers()  # HTTP/1.0: the body ends when the connection closes
        out = [self._chunk({"role": "assistant", "content": ""})]
        words = entry.get("text", "").split(" ")
        for i, word in enumerate(words if entry.get("text") else []):
            out.append(self._chunk({"content": word if i == len(words) - 1 else word + " "}))
        if entry.get("truncate"):
            h.wfile.write(b"".join(out))
            return
        for idx, call in enumerate(entry.get("tool_calls", [])):
            args = call.get("arguments", {})
            args = args if isinstance(args, str) else json.dumps(args)
            name = call["name"].replace(".", "__")
            out.append(self._chunk({"tool_calls": [{"index": idx, "id": call.get("id", f"call_fake_{idx}"),
                                                    "type": "function",
                                                    "function": {"name": name, "arguments": ""}}]}))
            for piece in _pieces(args):
                out.append(self._chunk({"tool_calls": [{"index": idx, "function": {"arguments": piece}}]}))
        out.append(self._chunk({}, "tool_calls" if entry.get("tool_calls") else "stop"))
        usage = self._usage(entry)
        if usage is not None:
            out.append(self._chunk(None, usage=usage))
        out.append(b"data: [DONE]\n\n")
        for piece in out:  # one write per chunk, so the client sees a real stream
            h.wfile.write(piece)
            h.wfile.flush()

    def _completion(self, entry: dict[str, Any]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": entry.get("text") or None}
        if entry.get("tool_calls"):
            message["tool_calls"] = [
                {"id": c.get("id", f"call_fake_{i}"), "type": "function",
                 "function": {"name": c["name"].replace(".", "__"),
                              "arguments": c["arguments"] if isinstance(c.get("arguments"), str)
                              else json.dumps(c.get("arguments", {}))}}
                for i, c in enumerate(entry["tool_calls"])]
        return {"id": "chatcmpl-fake", "object": "chat.completion", "model": self.model,
                "choices": [{"index": 0, "message": message,
                             "finish_reason": "tool_calls" if entry.get("tool_calls") else "stop"}],
                "usage": self._usage(entry)}

"""Helpers for the recovery tests (issue 5: test_recovery.py, test_crash_loop.py,
test_doctor.py): TOML snippets, a Prompt stream on a thread, WatchActivity
readers, a tool host that never answers, health polling and stdlib-sqlite3
reads of a data dir. Plain functions and classes, no fixtures."""

from __future__ import annotations

import queue
import sqlite3
import threading
from contextlib import closing
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agent_sidecar.v1 import prompt_service_pb2 as ppb
from agent_sidecar.v1 import session_service_pb2 as spb
from agent_sidecar.v1 import tool_service_pb2 as tpb
from helpers_common import PromptRun, rid, source, toml_value, wait_until  # noqa: F401
from sidecar_proc import error_info

D = ppb.DeliveryMode
TERMINAL = ("completed", "failed", "superseded")
RESUME_PREFIX = "[The previous turn was interrupted"


def kind(frame) -> str:
    return frame.WhichOneof("event")


# -- TOML --------------------------------------------------------------------------------

tv = toml_value


def table(name: str, **kv: Any) -> str:
    return f"[{name}]\n" + "".join(f"{k} = {tv(v)}\n" for k, v in kv.items()) + "\n"


def profile(name: str, model: str = "echo", options: dict | None = None, **extra: Any) -> str:
    if options:
        extra = {"model_options": options, **extra}
    return table(f"profiles.{name}", model=model, **extra)


def echo(name: str, latency_ms: float = 0) -> str:
    return profile(name, "echo", {"token_latency_ms": latency_ms} if latency_ms else None)


def scripted(name: str, steps: list, **extra: Any) -> str:
    return profile(name, "scripted", {"steps": steps}, **extra)


# -- streams -----------------------------------------------------------------------------

def watch_request(prompts, request_id: str, timeout: float = 20) -> tuple[list, str | None]:
    """WatchActivity(request_id): persisted frames then live ones up to the
    terminal one. Returns (frames, error reason or None)."""
    frames, reason = [], None
    try:
        for r in prompts.WatchActivity(ppb.WatchActivityRequest(request_id=request_id),
                                       timeout=timeout):
            if kind(r.frame) != "keepalive":
                frames.append(r.frame)
    except grpc.RpcError as e:
        reason = error_info(e)[0] or e.code().name
    return frames, reason


class Watcher:
    """A never-ending WatchActivity (by platform or session key) read in a thread."""

    def __init__(self, prompts, **kw):
        self.frames: list = []
        self.call = prompts.WatchActivity(ppb.WatchActivityRequest(**kw), timeout=120)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for r in self.call:
                if kind(r.frame) != "keepalive":
                    self.frames.append(r.frame)
        except grpc.RpcError:
            pass

    def request_ids(self, prefix: str = "") -> list[str]:
        return list(dict.fromkeys(f.request_id for f in list(self.frames)
                                  if f.request_id.startswith(prefix)))

    def close(self) -> None:
        self.call.cancel()
        self.thread.join(5)


class SilentToolHost:
    """A ServeTools stream that registers tools and never answers an invocation."""

    def __init__(self, tools_stub, namespace: str, names: list[str]):
        self._out: queue.Queue = queue.Queue()
        self.invocations: list = []
        self.registered = threading.Event()
        self.invoked = threading.Event()
        self._out.put(tpb.ServeToolsRequest(register=tpb.RegisterTools(namespace=namespace, tools=[
            tpb.ToolSpec(name=n, description=n, parameters_json_schema='{"type": "object"}')
            for n in names])))
        self.call = tools_stub.ServeTools(iter(self._out.get, None), timeout=120)
        threading.Thread(target=self._read, daemon=True).start()
        assert self.registered.wait(10), "tool host not registered"

    def _read(self) -> None:
        try:
            for r in self.call:
                which = r.WhichOneof("message")
                if which == "registered":
                    self.registered.set()
                elif which == "invocation":
                    self.invocations.append(r.invocation)
                    self.invoked.set()
        except grpc.RpcError:
            pass

    def close(self) -> None:
        self._out.put(None)
        self.call.cancel()


# -- sessions, health --------------------------------------------------------------------

def get_session(sc, key: str):
    return sc.sessions().GetSession(spb.GetSessionRequest(session_key=key), timeout=10).session


def transcript(sc, session_id: str) -> list:
    out, token = [], ""
    while True:
        r = sc.sessions().GetTranscript(spb.GetTranscriptRequest(
            session_id=session_id, include_rewound=True, page_token=token), timeout=10)
        out += list(r.messages)
        token = r.next_page_token
        if not token:
            return out


def health(target: str, timeout: float = 1.0):
    """The health status name, or the RPC error code name when it does not answer."""
    try:
        with grpc.insecure_channel(target) as ch:
            r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
            return health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
    except grpc.RpcError as e:
        return e.code().name


def serving_lines(sc) -> int:
    try:
        return sc.log_path.read_bytes().count(b'"msg":"serving"')
    except OSError:
        return 0


def restart(sc, timeout: float = 30):
    """Start (again) and wait for the sidecar's own "serving" log line, i.e. until the
    startup restore and the auto-resume submissions are done. Health alone is not
    enough: it says SERVING before that (see test_crash_loop's health test)."""
    before = serving_lines(sc)
    sc.start(timeout)
    wait_until(lambda: serving_lines(sc) > before, timeout, 0.01, "the 'serving' log line")
    return sc


# -- the store, read with stdlib sqlite3 -------------------------------------------------------

def db_path(sc) -> str:
    return str(sc.data_dir / "sidecar.db")


def query(sc, sql: str, args: tuple = ()) -> list[tuple]:
    """Rows of one statement against the data dir's store (sidecar running or not)."""
    with closing(sqlite3.connect(db_path(sc), timeout=10)) as conn:
        return conn.execute(sql, args).fetchall()


def routing(sc, key: str) -> dict:
    with closing(sqlite3.connect(db_path(sc), timeout=10)) as conn:
        conn.row_factory = sqlite3.Row
        row = conn.execute("SELECT * FROM routing WHERE session_key = ?", (key,)).fetchone()
        return dict(row) if row else {}


def marker(sc) -> bool:
    return (sc.data_dir / ".clean_shutdown").exists()


def resume_rows(sc, sid: str) -> list[tuple]:
    """(request_id, status, text) of the session's auto-resume turns, oldest first."""
    return query(sc, "SELECT request_id, status, text FROM prompts WHERE request_id LIKE ?"
                     " ORDER BY created_at", (f"resume:{sid}:%",))


def started_count(sc, request_id: str) -> int:
    return query(sc, "SELECT count(*) FROM frames WHERE request_id = ? AND kind = 'started'",
                 (request_id,))[0][0]


def user_rows(sc, request_id: str) -> int:
    return query(sc, "SELECT count(*) FROM messages WHERE request_id = ? AND role = 'user'",
                 (request_id,))[0][0]


def words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))

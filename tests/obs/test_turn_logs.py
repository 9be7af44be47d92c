"""Logs (issue 17): one ``turn finished`` line per turn with its fields, the
turn's request_id and session_key on every line its work causes (in the
parent and in its worker), an ``rpc`` access-log line per call at debug
level, RFC 3339 timestamps on every line. The log lines are the behaviour
under test here, so they are what these tests read (helpers.logs)."""

from __future__ import annotations

import asyncio
import io
import logging
import re
import sys
from datetime import UTC, datetime, timedelta

import grpc
import orjson
import pytest
from helpers.config import echo, profile, table
from helpers.fake_openai import FakeOpenAI
from helpers.ids import source
from helpers.logs import log_lines
from helpers.streams import assert_failed, assert_well_formed, prompt_req, run, start
from helpers.waiting import wait_until
from sidecar_proc import Sidecar

from agent_sidecar import logs
from agent_sidecar.v1 import prompt_service_pb2 as ppb

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
ADD = [{"tool_calls": [{"name": "test.add", "arguments": {"a": 2, "b": 3}, "id": "call_l"}]},
       {"text": "the answer is 5"}]
SCRIPTS = {
    "tools": ADD * 2,  # two turns with a tool call each
    "down": [{"status": 400, "body": '{"error": {"message": "no such model"}}'}],
}


@pytest.fixture(scope="module")
def fakes():
    with FakeOpenAI.several(SCRIPTS) as servers:
        yield servers


@pytest.fixture(scope="module")
def sc(tmp_path_factory, fakes):
    # Idle agents are shed at once, so a session's next turn rebuilds its agent in the worker.
    config = (table("agent.agent_cache", idle_ttl_secs=0.3, sweep_interval_secs=0.2) + echo("main")
              + table("sidecar", keepalive_s=0.2)  # a watch's first response comes at once
              + "".join(profile(name, "openai", {"base_url": fake.url, "model": "gpt-test", "max_retries": 0},
                                tools=["test.*"]) for name, fake in fakes.items()))
    s = Sidecar(tmp_path_factory.mktemp("turnlogs") / "data", config=config).start()
    yield s
    s.stop()


def finished_line(sc, rid: str) -> dict:
    lines = wait_until(lambda: [x for x in log_lines(sc, "turn finished") if x.get("request_id") == rid],
                       what=f"the turn finished line of {rid}")
    assert len(lines) == 1, lines
    return lines[0]


def test_a_completed_turn_logs_one_line_with_its_fields(sc, host):
    out = run(sc.prompts(), prompt_req(text="add 2 and 3", profile="tools"))
    assert_well_formed(out)
    line = finished_line(sc, out.request_id)
    fields = {k: line[k] for k in ("session_key", "platform", "profile", "outcome", "reason", "frames",
                                   "input_tokens", "output_tokens")}
    assert fields == {"session_key": out.key, "platform": "telegram", "profile": "tools",
                      "outcome": "completed", "reason": "", "frames": out.last.seq,
                      "input_tokens": out.usage()[0], "output_tokens": out.usage()[1]}
    assert out.usage() == (20, 4) and line["duration_ms"] > 0 and line["level"] == "info"
    assert "detail" not in line


def test_a_failed_turn_logs_its_reason_and_detail(sc):
    out = run(sc.prompts(), prompt_req(text="hello", profile="down"))
    assert_failed(out, "LLM_API_FAILURE", grpc.StatusCode.UNAVAILABLE)
    line = finished_line(sc, out.request_id)
    assert (line["outcome"], line["reason"], line["frames"], line["session_key"]) == (
        "failed", "LLM_API_FAILURE", out.last.seq, out.key)
    assert "HTTP 400" in line["detail"] and "no such model" in line["detail"]


def test_lines_a_turn_causes_carry_its_request_id_and_session_key(sc, host):
    out = run(sc.prompts(), prompt_req(text="add 2 and 3", profile="tools"))
    assert_well_formed(out)
    ids = {"request_id": out.request_id, "session_key": out.key}
    # In the parent: the tool call's line, logged by a task the turn's message started.
    (tool,) = [x for x in log_lines(sc, "tool call") if x.get("call_id") == "call_l"
               and x.get("request_id") == out.request_id]
    assert {k: tool[k] for k in ids} == ids and tool["ok"] is True
    # The Prompt call's access line, logged when the call ended.
    (access,) = [x for x in log_lines(sc, "rpc") if x.get("request_id") == out.request_id]
    assert (access["method"], access["code"], access["session_key"]) == (
        "/agent_sidecar.v1.PromptService/Prompt", "OK", out.key)

    # In the worker: the second turn of a session whose agent was shed rebuilds it there.
    first = start(sc.prompts(), text="first", src=source()).result(10)
    evicted = wait_until(lambda: [x for x in log_lines(sc, "agents evicted") if first.key in x.get("keys", [])],
                         what="the idle agent shed")
    assert all("request_id" not in x for x in evicted), "housekeeping is no turn's work"
    second = start(sc.prompts(), text="second", key=first.key).result(10)
    assert second.end == "completed"
    (rebuilt,) = wait_until(lambda: [x for x in log_lines(sc, "agent rebuilt from store")
                                     if x.get("key") == first.key], what="the agent rebuilt")
    assert (rebuilt["request_id"], rebuilt["session_key"]) == (second.request_id, first.key)


def test_each_rpc_gets_an_access_line_with_its_code(sc):
    with pytest.raises(grpc.RpcError) as e:
        list(sc.prompts().Prompt(prompt_req(request_id=""), timeout=10))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    lines = wait_until(lambda: [x for x in log_lines(sc, "rpc") if x.get("code") == "INVALID_ARGUMENT"],
                       what="the refused call's access line")
    line = lines[-1]
    assert line["method"] == "/agent_sidecar.v1.PromptService/Prompt" and line["level"] == "debug"
    assert line["peer"].startswith("unix:") and line["duration_ms"] >= 0


def test_calls_cancelled_by_their_client_get_their_line_and_the_sidecar_goes_on(sc):
    """A watch never ends by itself: the client cancels it. Each one's line says
    CANCELLED (reading the call's peer after such an end once crashed the process)."""
    out = run(sc.prompts(), prompt_req(text="hello"))
    for _ in range(3):
        call = sc.prompts().WatchActivity(ppb.WatchActivityRequest(session_key=out.key), timeout=10)
        next(call)
        call.cancel()
    wait_until(lambda: len([x for x in log_lines(sc, "rpc") if x["code"] == "CANCELLED" and
                            x["method"].endswith("/WatchActivity")]) >= 3, what="three CANCELLED lines")
    assert run(sc.prompts(), prompt_req(text="still here")).end == "completed"


def test_every_line_has_an_rfc3339_timestamp(sc):
    run(sc.prompts(), prompt_req(text="hello"))
    lines = log_lines(sc)
    assert len(lines) > 10
    bad = [x for x in lines if not RFC3339.match(str(x.get("ts")))]
    assert not bad, bad[:3]
    now = datetime.now(UTC)
    for x in lines:
        assert now - timedelta(minutes=10) < datetime.fromisoformat(x["ts"]) <= now + timedelta(seconds=1)


def test_the_text_format_has_the_timestamp_the_fields_and_the_bound_turn():
    record = logging.makeLogRecord({"name": "agent_sidecar.turns", "levelname": "INFO", "msg": "turn finished",
                                    "created": 1_700_000_000.25, "outcome": "completed"})
    token = logs.bind_turn("r-1", "agent:main:telegram:dm:1")
    try:
        line = logs.TextFormatter().format(record)
    finally:
        logs.TURN.reset(token)
    assert line == ("2023-11-14T22:13:20.250Z INFO agent_sidecar.turns: turn finished outcome=completed"
                    " request_id=r-1 session_key=agent:main:telegram:dm:1")


def test_a_callers_line_break_cannot_forge_a_text_log_line(tmp_path):
    """The text format wrote field values as they came: a request id or a
    chat id (in the session key) with a line break put a line of the
    caller's making into the log, timestamp, level and all. Control
    characters in a value are now escaped, so every event stays one line."""
    forged = "\n2026-01-01T00:00:00.000Z CRITICAL agent_sidecar.store: the store is corrupt"
    sc = Sidecar(tmp_path / "data", config=echo("main"), workers=1,
                 extra_args=["--log-format", "text", "--log-level", "info"]).start()
    try:
        out = run(sc.prompts(), prompt_req(request_id="r-forge" + forged, text="hi",
                                           source=source(chat_id="c-forge" + forged)))
        assert out.end == "completed"
    finally:
        sc.stop()
    lines = sc.log_path.read_text().splitlines()
    (finished,) = [x for x in lines if " turn finished " in x]
    assert "request_id=r-forge\\n2026-01-01T00:00:00.000Z CRITICAL" in finished, finished
    assert "session_key=agent:main:telegram:dm:c-forge\\n2026-01-01" in finished, finished
    assert not [x for x in lines if "CRITICAL" in x and x is not finished], lines


@pytest.mark.parametrize("created, ts", [(1_700_000_000.0, "2023-11-14T22:13:20.000Z"),
                                         (1_700_000_000.0995, "2023-11-14T22:13:20.099Z"),
                                         (1_700_000_000.9995, "2023-11-14T22:13:20.999Z")])
def test_the_json_format_keeps_its_own_keys_ahead_of_the_fields(created, ts):
    """A field named like one of the line's own keys (ts, level, logger, msg)
    does not replace it; the milliseconds are cut, never rounded up."""
    record = logging.makeLogRecord({"name": "agent_sidecar.turns", "levelname": "INFO", "msg": "turn finished",
                                    "created": created, "outcome": "completed", "ts": "forged", "level": "x"})
    line = orjson.loads(logs.JsonFormatter().format(record))
    assert list(line)[:5] == ["ts", "level", "logger", "msg", "outcome"]
    assert (line["ts"], line["level"], line["msg"], line["outcome"]) == (ts, "info", "turn finished", "completed")
    record.codes = {200: 1}  # a key JSON cannot have is written as text, not a logging error
    assert orjson.loads(logs.JsonFormatter().format(record))["codes"] == {"200": 1}
    record.big = 1 << 70  # and so is an int past 64 bits
    assert orjson.loads(logs.JsonFormatter().format(record))["big"] == str(1 << 70)


def test_lines_of_one_loop_iteration_go_out_in_one_write_in_the_order_logged(monkeypatch):
    """``info_fields`` on a running loop holds its line until the iteration
    ends, then writes the iteration's lines in one write; a line logged by
    other means writes them first, so the order stays as logged. Without a
    running loop the line is written at once."""
    class Stream(io.StringIO):
        def __init__(self):
            super().__init__()
            self.writes = 0

        def write(self, s):
            self.writes += 1
            return super().write(s)

    stream = Stream()
    monkeypatch.setattr(sys, "stderr", stream)
    saved = logging.getLogger().handlers[:], logging.getLogger().level
    try:
        logs.setup("json", "info")
        turns = logging.getLogger("agent_sidecar.turns")

        async def one_iteration():
            for i in range(3):
                logs.info_fields(turns, "turn finished", {"n": i})
            assert stream.writes == 0  # held back: nothing written yet
            await asyncio.sleep(0)  # the iteration ends
            assert stream.writes == 1
            logs.info_fields(turns, "turn finished", {"n": 3})
            turns.warning("something else")  # writes the held line first
        asyncio.run(one_iteration())
        logs.info_fields(turns, "turn finished", {"n": 4})  # no loop: at once
        lines = [orjson.loads(x) for x in stream.getvalue().splitlines()]
        assert [x.get("n", x["msg"]) for x in lines] == [0, 1, 2, 3, "something else", 4]
    finally:
        logging.getLogger().handlers[:], level = saved
        logging.getLogger().setLevel(level)
        logs._HANDLER = None


# A model backend that logs as a third party's would: through the logging module, in its worker.
NOISY_BACKEND = """\
import asyncio
import gc
import logging
from agent_sidecar.models.base import TextDelta
log = logging.getLogger("noisy_backend")
async def forgotten():
    pass
class Place:
    def __str__(self):
        return "here"
class Noisy:
    def __init__(self, options):
        pass
    async def stream(self, request):
        forgotten()  # a coroutine never awaited: Python warns when it is collected
        gc.collect()
        log.info("noisy info", extra={"n": 1})
        log.warning("noisy warning", extra={"n": 2, "codes": {200: 1}, "place": Place()})
        try:
            1 / 0
        except ZeroDivisionError:
            log.exception("noisy error")
        await asyncio.to_thread(log.warning, "noisy thread")
        yield TextDelta(text="ok")
    async def aclose(self):
        pass
"""


def _noisy_plugin(root) -> str:
    """A distribution on ``root`` with the backend ``noisy``; returns ``root`` for PYTHONPATH."""
    info = root / "noisy_backend-1.0.dist-info"
    info.mkdir(parents=True)
    (root / "noisy_backend.py").write_text(NOISY_BACKEND)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: noisy-backend\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[agent_sidecar.models]\nnoisy = noisy_backend:Noisy\n")
    return str(root)


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_a_workers_lines_keep_their_level_logger_and_fields(tmp_path, fmt):
    """A line logged in a worker (a model backend's, through the logging
    module) went to stderr bare, its message alone, in neither format, with no
    level, time or turn; and the worker's own lines were relogged by the
    parent at INFO whatever their level. Each now reaches the log as the
    worker logged it: its level, its logger, its fields, the turn's ids and
    its traceback, in the configured format."""
    sc = Sidecar(tmp_path / "data", config=profile("main", "noisy"), workers=1,
                 env={"PYTHONPATH": _noisy_plugin(tmp_path / "site")},
                 extra_args=["--log-format", fmt, "--log-level", "warning"])
    with sc:
        out = run(sc.prompts(), prompt_req(text="hi"))
        assert out.end == "completed", out.kinds()
        wait_until(lambda: "noisy thread" in sc.log_path.read_text(), what="the worker's last line")
    text = sc.log_path.read_text()
    assert "noisy info" not in text, "below the configured level"
    if fmt == "json":
        (warning,) = log_lines(sc, "noisy warning")
        (error,) = log_lines(sc, "noisy error")
        assert (warning["level"], warning["logger"], warning["n"]) == ("warning", "noisy_backend", 2)
        assert (warning["codes"], warning["place"]) == ({"200": 1}, "here"), "fields JSON has no type for"
        assert (error["level"], error["logger"]) == ("error", "noisy_backend")
        assert "ZeroDivisionError" in error["exc"]
        (thread,) = log_lines(sc, "noisy thread")  # logged on an executor's thread
        assert (thread["level"], thread["logger"]) == ("warning", "noisy_backend")
        for line in (warning, error):
            assert (line["request_id"], line["session_key"], line["worker"]) == (out.request_id, out.key, 0)
    else:
        (warning,) = [x for x in text.splitlines() if "noisy warning" in x]
        (error,) = [x for x in text.splitlines() if "noisy error" in x]
        assert RFC3339.match(warning.split(" ")[0]), warning
        assert " WARNING noisy_backend: noisy warning " in warning and " n=2 " in warning, warning
        assert " ERROR noisy_backend: noisy error " in error and "ZeroDivisionError" in error, error
        assert f"request_id={out.request_id}" in warning and f"session_key={out.key}" in error


def test_a_python_warning_is_a_log_line(tmp_path):
    """A Python warning (a coroutine a backend never awaited) was printed to
    stderr by the warnings module itself: two bare lines in no format, which
    a pipeline parsing each line as JSON drops or chokes on. It is now one
    ``python warning`` line, with its category, text and place."""
    sc = Sidecar(tmp_path / "data", config=profile("main", "noisy"), workers=1,
                 env={"PYTHONPATH": _noisy_plugin(tmp_path / "site")})
    with sc:
        out = run(sc.prompts(), prompt_req(text="hi"))
        assert out.end == "completed", out.kinds()
        (line,) = wait_until(lambda: log_lines(sc, "python warning"), what="the warning's line")
    assert (line["level"], line["logger"], line["category"]) == ("warning", "py.warnings", "RuntimeWarning")
    assert "forgotten" in line["warning"] and "never awaited" in line["warning"]
    assert "noisy_backend.py:" in line["where"] and line["request_id"] == out.request_id
    assert "never awaited" not in "".join(x for x in sc.log_path.read_text().splitlines()
                                          if not x.startswith("{")), "a bare line"


def test_at_debug_a_librarys_lines_below_warning_come_only_when_asked_for(tmp_path):
    """At --log-level debug the workers forwarded every library's lines (a
    dozen of httpcore's debug lines and httpx's info line per model call) and
    the parent logged gRPC's: the sidecar's own debug lines were buried in
    them. The libraries' lines now come from ``[sidecar] library_log_level``
    (default warning) while the sidecar's own keep ``log_level``; asked for
    at debug, a worker's library lines come again, as the worker logged them."""
    with FakeOpenAI([{"text": "hello there"}]) as fake:
        model = profile("main", "openai", {"base_url": fake.url, "model": "gpt-test", "max_retries": 0})
        for asked in ("", "debug"):
            config = model + (table("sidecar", library_log_level=asked) if asked else "")
            with Sidecar(tmp_path / (asked or "default"), config=config, workers=1) as sc:  # at debug
                out = run(sc.prompts(), prompt_req(text="hi"))
                assert out.end == "completed", out.kinds()
                wait_until(lambda: log_lines(sc, "rpc"), what="the sidecar's own debug line")
            libraries = [x for x in log_lines(sc) if not x["logger"].startswith(("agent_sidecar", "py.warnings"))]
            if not asked:
                assert not libraries, libraries
            else:
                assert any(x["logger"].startswith("httpcore") and x["level"] == "debug" and x["worker"] == 0
                           for x in libraries), libraries

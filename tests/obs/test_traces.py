"""Traces (issue 17): a sidecar started with the standard OTEL_* variables
exports, over real OTLP/HTTP to a collector in this process, the span tree of
a prompt: the Prompt RPC's span (a child of the caller's traceparent), the
turn's span under it, one span per model call and per tool call under that;
and the traceparent goes on to the OpenAI-compatible server (an HTTP header
naming the model call's span) and to the tool host (the invocation's
trace_context naming the tool call's span). Off by default: then nothing of
OpenTelemetry is imported and nothing is propagated."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers.config import profile, slow_echo
from helpers.fake_openai import FakeOpenAI
from helpers.ids import source, words
from helpers.logs import log_lines
from helpers.otlp import Collector
from helpers.streams import QUEUE, assert_well_formed, collect, prompt_req, start
from helpers.tools import AB_SCHEMA, ToolHost, answers
from helpers.waiting import wait_until
from sidecar_proc import Sidecar

from agent_sidecar.v1 import prompt_service_pb2 as ppb

SERVER, CLIENT = 2, 3  # opentelemetry.proto SpanKind
ERROR = 2  # Status.code
SCRIPTS = {
    "tools": [{"tool_calls": [{"name": "test.add", "arguments": {"a": 2, "b": 3}, "id": "call_t"}]},
              {"text": "the answer is 5"}],
    "down": [{"status": 400, "body": '{"error": {"message": "no such model"}}'}],
    "outside": [{"tool_calls": [{"name": "zz.outside", "arguments": {}, "id": "call_o"}]}],
}


@pytest.fixture(scope="module")
def fakes():
    with FakeOpenAI.several(SCRIPTS) as servers:
        yield servers


@pytest.fixture(scope="module")
def collector():
    with Collector() as c:
        yield c


@pytest.fixture(scope="module")
def sc(tmp_path_factory, fakes, collector):
    profiles = "".join(profile(name, "openai", {"base_url": fake.url, "model": "gpt-test", "max_retries": 0},
                               tools=["test.*"]) for name, fake in fakes.items())
    s = Sidecar(tmp_path_factory.mktemp("traces") / "data", config=profiles,
                env=collector.env()).start()
    yield s
    s.stop()


def _traceparent() -> tuple[str, str, str]:
    trace_id, span_id = os.urandom(16).hex(), os.urandom(8).hex()
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def _prompt(sc, profile_name: str, traceparent: str):
    req = prompt_req(text="add 2 and 3", profile=profile_name)
    out = collect(sc.prompts().Prompt(req, timeout=30, metadata=[("traceparent", traceparent)]))
    return req.request_id, out


def _tree(collector, trace_id: str, rid: str, model_calls: int, tool_calls: int):
    """The trace's spans once its turn and every child have arrived."""
    def complete(spans):
        mine = [s for s in spans if s.trace_id == trace_id]
        turns = [s for s in mine if s.name == "turn" and s.attributes["agent_sidecar.request_id"] == rid]
        if not turns:
            return None
        kids = [s for s in mine if s.parent_id == turns[0].span_id]
        rpc = [s for s in mine if s.span_id == turns[0].parent_id]
        models = [s for s in kids if s.name == "chat gpt-test"]
        tools = [s for s in kids if s.name.startswith("execute_tool")]
        if rpc and len(models) == model_calls and len(tools) == tool_calls:
            return rpc[0], turns[0], sorted(models, key=lambda s: s.start_ns), tools
        return None
    return collector.wait_for(complete, what=f"the span tree of {rid}")


def test_a_prompt_exports_its_span_tree_and_passes_the_traceparent_on(sc, fakes, collector, host):
    traceparent, trace_id, caller_span = _traceparent()
    rid, out = _prompt(sc, "tools", traceparent)
    assert_well_formed(out)
    rpc, turn, models, (tool,) = _tree(collector, trace_id, rid, model_calls=2, tool_calls=1)

    assert rpc.name == "agent_sidecar.v1.PromptService/Prompt" and rpc.kind == SERVER
    assert rpc.parent_id == caller_span, "the caller's traceparent is the RPC span's parent"
    assert (rpc.attributes["rpc.system"], rpc.attributes["rpc.grpc.status_code"]) == ("grpc", 0)
    assert turn.attributes["agent_sidecar.session_key"] == out.key
    assert (turn.attributes["agent_sidecar.outcome"], turn.attributes["agent_sidecar.profile"]) == (
        "completed", "tools")
    assert rpc.start_ns <= turn.start_ns <= models[0].start_ns < tool.start_ns < models[1].start_ns
    assert models[1].end_ns <= turn.end_ns <= rpc.end_ns
    assert [m.attributes["agent_sidecar.iteration"] for m in models] == [0, 1]
    assert all(m.kind == CLIENT and m.attributes["agent_sidecar.model_backend"] == "openai" for m in models)
    assert (tool.name, tool.attributes["gen_ai.tool.call.id"]) == ("execute_tool test.add", "call_t")

    # The model server saw each call's own span as the parent of its request.
    sent = [h["traceparent"] for h in fakes["tools"].headers[-2:]]
    assert sent == [f"00-{trace_id}-{m.span_id}-01" for m in models]
    # The tool host got the tool call's span in the invocation.
    (inv,) = [i for i in host.invocations if i.request_id == rid]
    assert dict(inv.trace_context) == {"traceparent": f"00-{trace_id}-{tool.span_id}-01"}


def test_a_failed_turn_marks_its_spans_as_errors(sc, fakes, collector):
    traceparent, trace_id, _ = _traceparent()
    rid, out = _prompt(sc, "down", traceparent)
    assert out.end == "failed" and out.last.failed.reason == "LLM_API_FAILURE"
    rpc, turn, (model,), _ = _tree(collector, trace_id, rid, model_calls=1, tool_calls=0)
    assert turn.status == ERROR and turn.attributes["agent_sidecar.reason"] == "LLM_API_FAILURE"
    assert model.status == ERROR
    assert rpc.status == ERROR and rpc.attributes["rpc.grpc.status_code"] == 14  # UNAVAILABLE
    assert fakes["down"].headers[-1]["traceparent"] == f"00-{trace_id}-{model.span_id}-01"


def test_a_tool_call_the_worker_refuses_has_its_span_with_the_reason(sc, collector):
    """A call outside the profile's tools is refused in the worker and never
    reaches the parent: it was counted in tool_call_errors_total, but had no
    span, so the trace of a turn failed TOOL_SCOPE_VIOLATION did not show
    the call that failed it. It now has its ``execute_tool`` span, an error
    naming the reason, like a call the parent refuses."""
    traceparent, trace_id, _ = _traceparent()
    rid, out = _prompt(sc, "outside", traceparent)
    assert out.end == "failed" and out.last.failed.reason == "TOOL_SCOPE_VIOLATION"
    _, turn, (model,), (tool,) = _tree(collector, trace_id, rid, model_calls=1, tool_calls=1)
    assert (tool.name, tool.kind, tool.status) == ("execute_tool zz.outside", CLIENT, ERROR)
    assert tool.attributes["agent_sidecar.reason"] == "TOOL_SCOPE_VIOLATION"
    assert tool.attributes["gen_ai.tool.call.id"] == "call_o"
    assert model.end_ns <= tool.start_ns <= tool.end_ns <= turn.end_ns


def test_a_watch_its_client_ends_is_no_error(sc, collector):
    """A watch never ends by itself: its client cancels it. gRPC then closes
    the handler from another context, where the RPC span's context could not
    be detached: the SDK logged an ERROR (``Failed to detach context``, with
    a traceback) for every watch a client ended, and for every Prompt it
    stopped reading. The span ends as before, and nothing is logged."""
    out = collect(sc.prompts().Prompt(prompt_req(text="hi", profile="down"), timeout=30))
    traceparent, trace_id, _ = _traceparent()
    for _ in range(3):
        call = sc.prompts().WatchActivity(ppb.WatchActivityRequest(session_key=out.frames[0].session_key),
                                          timeout=10, metadata=[("traceparent", traceparent)])
        next(call)
        call.cancel()
    collector.wait_for(lambda spans: len([s for s in spans if s.trace_id == trace_id and
                                          s.name.endswith("/WatchActivity")]) == 3,
                       what="the three watches' spans")
    errors = [x for x in log_lines(sc) if x["level"] == "error"]
    assert not errors, errors


def test_a_prompt_without_a_traceparent_starts_a_trace(sc, collector, host):
    req = prompt_req(text="add", profile="tools")
    assert_well_formed(collect(sc.prompts().Prompt(req, timeout=30)))
    turn = collector.wait_for(lambda spans: next((s for s in spans if s.name == "turn" and
                              s.attributes["agent_sidecar.request_id"] == req.request_id), None))
    rpc = collector.wait_for(lambda spans: next((s for s in spans if s.span_id == turn.parent_id), None))
    assert rpc.parent_id == "" and rpc.trace_id == turn.trace_id and rpc.service == "agent-sidecar"


def test_a_turn_still_queued_at_shutdown_exports_its_span(tmp_path, collector):
    """A turn that leaves the sidecar without a terminal frame (queued when a
    drain ran out: it runs after the next start) ends its span as it goes;
    before, the span was never ended, so never exported."""
    sc = Sidecar(tmp_path / "data", config=slow_echo("main", 100) + "[sidecar]\ndrain_timeout = 0.5\n",
                 env=collector.env()).start()
    try:
        running = start(sc.prompts(), text=words(100), src=source())
        running.wait_for("started")
        queued = start(sc.prompts(), text="later", key=running.key, delivery=QUEUE)
    finally:
        sc.stop()
    turn = collector.wait_for(lambda spans: next((s for s in spans if s.name == "turn" and
                              s.attributes["agent_sidecar.request_id"] == queued.request_id), None),
                              what="the queued turn's span")
    assert turn.status == ERROR
    assert (turn.attributes["agent_sidecar.outcome"], turn.attributes["agent_sidecar.reason"]) == (
        "left", "shutdown")


def test_the_store_is_closed_and_marked_clean_before_the_last_spans_are_sent(tmp_path):
    """A clean stop exports the spans still buffered; it used to do that before
    the store's last write and the clean-shutdown marker, so a collector that
    hangs (probed: ~10 s, the exporter's timeout) or a slow one held them back,
    into the supervisor's stop timeout and a SIGKILL without the marker. Spans
    are best effort, the store is not: the marker is on disk when they go."""
    marker = tmp_path / "data" / ".clean_shutdown"
    marked_at_export: list[bool] = []
    with Collector(on_export=lambda: marked_at_export.append(marker.exists())) as c:
        sc = Sidecar(tmp_path / "data", config=profile("main", "echo"),
                     env={**c.env(), "OTEL_BSP_SCHEDULE_DELAY": "600000"}).start()  # only the stop exports
        try:
            done = start(sc.prompts(), text="traced", src=source()).result()
            assert done.kinds()[-1] == "completed", done.kinds()
        finally:
            assert sc.stop() == 0
        c.wait_for(lambda spans: any(s.name == "turn" for s in spans), what="the turn's span")
    assert marked_at_export and all(marked_at_export), marked_at_export


def test_a_collector_that_never_answers_holds_the_stop_one_export_timeout_at_most(tmp_path):
    """The SDK's shutdown exports the queue batch after batch, each up to the
    exporter's timeout, for up to 30 s: with a collector that takes
    connections and never answers, a stop lasted about that long after the
    store was done (probed: 20-30 s at the default 10 s timeout), against
    the docs' one exporter timeout, and into a supervisor's stop timeout.
    Here a timeout of 1 s and one span per batch make the SDK's way last
    30 s; the stop now ends after that one second, leaving what was not
    exported (a warning says so), well inside the 15 s this test gives it."""
    import socket

    from helpers.logs import log_lines
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(512)  # the kernel completes the handshakes; nobody reads
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{mute.getsockname()[1]}",
               "OTEL_EXPORTER_OTLP_TIMEOUT": "1", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "1",
               "OTEL_BSP_SCHEDULE_DELAY": "50"}
        sc = Sidecar(tmp_path / "data", config=profile("main", "echo"), env=env, workers=1).start()
        try:
            for _ in range(10):  # about 40 spans queued behind exports that each take a second
                assert start(sc.prompts(), text="traced", src=source()).result().end == "completed"
        finally:
            code = sc.stop(timeout=15)
    assert code == 0, sc.log()
    (line,) = log_lines(sc, "stopped")
    assert line["clean"] is True, line
    assert log_lines(sc, "spans still buffered at the stop were not exported: the exporter did not finish"
                         " within its timeout"), sc.log()


def test_a_collector_that_refuses_exports_is_logged_once_per_episode(tmp_path):
    """The OTLP exporter logs each failed export (and each retry): a
    collector refusing them for an hour wrote thousands of lines. The first
    failure of an episode is now told, the exporter is quiet while it lasts,
    and one line says when exports work again."""
    from helpers.logs import log_lines
    with Collector() as collector:
        collector.refuse_with = 400  # not retried: one failed export per batch
        sc = Sidecar(tmp_path / "data", config=profile("main", "echo"), env=collector.env(), workers=1).start()
        try:
            for _ in range(6):  # a batch each: the exporter sends every 50 ms
                refused = collector.refused
                assert start(sc.prompts(), text="refused", src=source()).result().end == "completed"
                wait_until(lambda n=refused: collector.refused > n, what="one more export refused")
            collector.refuse_with = 0
            later = start(sc.prompts(), text="taken", src=source()).result()
            collector.wait_for(lambda spans: any(s.name == "turn" and s.attributes[
                "agent_sidecar.request_id"] == later.request_id for s in spans), what="the spans taken again")
        finally:
            assert sc.stop() == 0
    assert collector.refused >= 6
    sdk = [x for x in log_lines(sc) if x["logger"].startswith("opentelemetry.exporter")]
    assert len(sdk) <= 1, sdk  # the first refusal's own line, if the exporter writes one
    assert len(log_lines(sc, "trace export failing: spans are dropped until it works again")) == 1
    assert len(log_lines(sc, "trace export works again")) == 1


def test_a_full_span_queue_is_told_once_while_the_collector_hangs(tmp_path):
    """A collector that takes connections and never answers holds the SDK's
    export thread, so its span queue fills and every span after is dropped.
    The SDK said so with a warning of its own (``Queue full, dropping Span.``,
    carrying the ids of whichever turn ended a span then) once every 20 s
    for as long as it lasted (probed: three a minute, for hours), beside
    the one ``trace export failing`` line of the episode. Now the full queue
    is told once per episode, as the failing export is: the window of the
    SDK's own repeat filter is crossed here before the last turn."""
    import socket
    import time
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(512)  # the kernel completes the handshakes; nobody reads
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{mute.getsockname()[1]}",
               "OTEL_EXPORTER_OTLP_TIMEOUT": "2", "OTEL_BSP_MAX_QUEUE_SIZE": "1",
               "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "1", "OTEL_BSP_SCHEDULE_DELAY": "50"}
        sc = Sidecar(tmp_path / "data", config=profile("main", "echo"), env=env, workers=1).start()
        try:
            window = time.time() // 20  # the SDK repeats a line in each new 20 s window
            while time.time() // 20 == window:
                assert start(sc.prompts(), text="traced", src=source()).result().end == "completed"
            for _ in range(3):  # spans into a queue that is still full, in the next window
                assert start(sc.prompts(), text="traced", src=source()).result().end == "completed"
        finally:
            assert sc.stop(timeout=15) == 0
    told = [x for x in log_lines(sc) if "Queue full" in x["msg"] or x["msg"].startswith("trace span queue full")]
    assert len(told) == 1, told
    assert "request_id" not in told[0], told[0]  # no one turn's doing


@pytest.mark.parametrize("setting, refused", [
    ({"OTEL_PROPAGATORS": "tracecontxt"}, "Propagator tracecontxt not found"),
    ({"OTEL_BSP_MAX_QUEUE_SIZE": "100"}, "max_export_batch_size must be less than or equal to max_queue_size"),
])
def test_an_otel_setting_the_sdk_refuses_leaves_the_sidecar_serving_without_traces(tmp_path, setting, refused):
    """A misspelt propagator (the SDK's import raises) or a queue smaller than
    the default batch: the start died with a traceback, exit 1, after the
    workers and the writer were up. Traces are best effort, as for an
    exporter that cannot be made: one error line, and the sidecar serves."""
    from helpers.logs import log_lines
    sc = Sidecar(tmp_path / "data", config=profile("main", "echo"),
                 env={"OTEL_TRACES_EXPORTER": "console", **setting}, workers=1).start()
    try:
        assert start(sc.prompts(), text="untraced", src=source()).result().end == "completed"
        (line,) = log_lines(sc, "tracing not available")
        assert line["level"] == "error" and refused in line["error"], line
        assert log_lines(sc, "tracing on") == []
    finally:
        assert sc.stop() == 0


def test_tracing_off_propagates_nothing(tmp_path):
    """No OTEL_* variables: no trace context reaches the model server or the tool host."""
    with FakeOpenAI(SCRIPTS["tools"]) as fake:
        sc = Sidecar(tmp_path / "data", config=profile("main", "openai", {
            "base_url": fake.url, "model": "gpt-test"}, tools=["test.*"])).start()
        try:
            with ToolHost(sc.tools(), "test", [("test.add", "test.add", AB_SCHEMA)],
                          answers({"test.add": lambda a: a["a"] + a["b"]})) as h:
                out = collect(sc.prompts().Prompt(prompt_req(text="add"), timeout=30, metadata=[
                    ("traceparent", _traceparent()[0])]))
                assert_well_formed(out)
                assert [inv.trace_context for inv in h.invocations] == [{}]
            assert len(fake.headers) == 2 and not any("traceparent" in x for x in fake.headers)
        finally:
            sc.stop()


def test_tracing_off_imports_no_opentelemetry_and_workers_never_do():
    """Off is free: the whole server imported and tracing configured from an
    empty environment leave OpenTelemetry unimported; a worker's modules never
    import it (nor grpc), on or off."""
    code = (
        "import importlib, pkgutil, sys, agent_sidecar\n"
        "from agent_sidecar.obs import tracing\n"
        "import agent_sidecar.turns.worker\n"
        "worker = sorted(m for m in sys.modules if m.startswith(('opentelemetry', 'grpc')))\n"
        "for m in pkgutil.walk_packages(agent_sidecar.__path__, 'agent_sidecar.'):\n"
        "    if m.name != 'agent_sidecar.obs.otel' and not m.name.startswith('agent_sidecar.bench'):\n"
        "        importlib.import_module(m.name)\n"
        "assert tracing.configure('0', env={}) is False and tracing.ACTIVE is None\n"
        "print(worker, sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] []", out.stdout


def test_tracing_is_on_only_when_the_environment_asks():
    from agent_sidecar.obs.tracing import exporter_names
    assert exporter_names({}) == []
    assert exporter_names({"OTEL_TRACES_EXPORTER": "none"}) == []
    assert exporter_names({"OTEL_TRACES_EXPORTER": "console, otlp"}) == ["console", "otlp"]
    assert exporter_names({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}) == ["otlp"]
    assert exporter_names({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}) == []

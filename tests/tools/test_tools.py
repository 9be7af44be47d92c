"""ToolService through a real sidecar (issue 4, docs/api.md "ToolService"): a tool
host in the test process registers tools over ServeTools and answers
invocations; a scripted model calls them. Scope violations, hosts that error
or disconnect mid-call, tools with no host, and namespace checks."""

from __future__ import annotations

import json

import grpc
import pytest
from helpers.config import scripted
from helpers.ids import rid, source
from helpers.sessions import transcript
from helpers.streams import D, start
from helpers.tools import ToolHost, tool_calls_answered, unanswered_calls
from helpers.waiting import wait_until
from sidecar_proc import Sidecar, error_info

from agent_sidecar.v1 import prompt_service_pb2 as ppb
from agent_sidecar.v1 import tool_service_pb2 as tpb

ADD_SCHEMA = {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
              "required": ["a", "b"]}


def calls_then_echo(name: str, args: dict | None = None, call_id: str = "") -> list:
    call = {"name": name, "arguments": args or {}}
    if call_id:
        call["id"] = call_id
    return [{"tool_calls": [call]}, {"text_from_last_tool_result": True}]


HANG_STEPS = [{"tool_calls": [{"name": "test.hang", "id": "x1"}]}, {"text": "after"}]
CONFIG = (scripted("tadd", calls_then_echo("test.add", {"a": 2, "b": 3}, "c1"), tools=["test.*"])
          + scripted("tscope", [{"text": "let me see", "tool_calls": [{"name": "other.x", "id": "bad1"}]},
                                {"text": "should not run"}], tools=["test.*"])
          + scripted("tdisc", calls_then_echo("test.slow", {}, "d1"), tools=["test.*"])
          + scripted("terr", calls_then_echo("test.fail", {}, "e1"), tools=["test.*"])
          + scripted("tnohost", calls_then_echo("test.nohost", {}, "n1"), tools=["test.*"])
          + scripted("tfail", [{"tool_calls": [{"name": "test.gone"}], "repeat": True}], tools=["test.*"])
          + scripted("thang", HANG_STEPS, tools=["test.*"])
          + scripted("thangt", HANG_STEPS, tools=["test.*"], timeout_s=1)
          + scripted("tdropped", calls_then_echo("again.b", {}, "r1"), tools=["again.*"])
          + scripted("treplica", calls_then_echo("replica.who", {}, "w1"), tools=["replica.*"]))


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    s = Sidecar(tmp_path_factory.mktemp("tools") / "data", config=CONFIG, workers=1).start()
    yield s
    s.stop()


def adder(inv):
    args = json.loads(inv.arguments_json)
    return True, json.dumps({"sum": args["a"] + args["b"]}), ""


def test_host_registers_and_answers(sc):
    host = ToolHost(sc.tools(), "test", [("test.add", "Add two numbers", ADD_SCHEMA)], adder)
    try:
        host.wait_registered()
        assert host.registered_msg.namespace == "test"
        assert list(host.registered_msg.tool_names) == ["test.add"]
        p = start(sc.prompts(), text="add 2 and 3", src=source(), profile="tadd").result(15)
        assert p.end == "completed", (p.kinds(), p.error)
        assert json.loads(p.final_text) == {"sum": 5}
        call, result = p.frame("tool_call").tool_call, p.frame("tool_result").tool_result
        assert (call.call_id, call.name, json.loads(call.arguments_json)) == ("c1", "test.add", {"a": 2, "b": 3})
        assert (result.call_id, result.ok, json.loads(result.result_json)) == ("c1", True, {"sum": 5})
        kinds = p.kinds()
        assert kinds.index("tool_call") < kinds.index("tool_result") < kinds.index("completed")
        inv = host.invocations[0]
        assert (inv.tool_name, inv.session_key, inv.request_id) == ("test.add", p.key, p.request_id)
        assert inv.session_id == p.session_id and inv.timeout_ms > 0
        msgs = transcript(sc.sessions(), p.session_id)
        assert [m.role for m in msgs] == ["user", "assistant", "tool", "assistant"]
        tool = msgs[2]
        assert tool.tool_call_id == "c1" and tool.tool_name == "test.add"
        assert json.loads(tool.content) == {"sum": 5}
        calls, answered = tool_calls_answered(msgs)
        assert calls == ["c1"] and answered == {"c1"}
    finally:
        host.close()


def test_call_outside_scope_is_tool_scope_violation(sc):
    host = ToolHost(sc.tools(), "other", [("other.x", "not for this profile", {"type": "object"})],
                    lambda inv: (True, "{}", ""))
    try:
        host.wait_registered()
        p = start(sc.prompts(), text="try it", src=source(), profile="tscope").result(15)
        assert p.end == "failed" and p.last.failed.reason == "TOOL_SCOPE_VIOLATION"
        assert p.error.code() == grpc.StatusCode.PERMISSION_DENIED
        assert p.reason == "TOOL_SCOPE_VIOLATION"
        assert host.invocations == []  # never reached the host
        msgs = transcript(sc.sessions(), p.session_id)
        calls, answered = tool_calls_answered(msgs)
        assert calls == ["bad1"] and answered == {"bad1"} and unanswered_calls(msgs) == []
        assert msgs[-1].role == "tool" and "error" in json.loads(msgs[-1].content)
        # the transcript is valid: a next turn on the session runs
        nxt = start(sc.prompts(), text="again", key=p.key).result(15)
        assert nxt.end == "failed" and nxt.reason == "TOOL_SCOPE_VIOLATION"
    finally:
        host.close()


def test_host_disconnecting_mid_call_gives_an_error_result(sc):
    holder = {}

    def vanish(inv):
        holder["host"].close()  # receives the invocation, then closes its stream
        return None

    host = holder["host"] = ToolHost(sc.tools(), "test", [("test.slow", "never answers", {"type": "object"})],
                                     vanish)
    host.wait_registered()
    p = start(sc.prompts(), text="go", src=source(), profile="tdisc").result(20)
    assert host.invocations and host.invocations[0].tool_name == "test.slow"
    assert p.end == "completed", (p.kinds(), p.error)
    result = p.frame("tool_result").tool_result
    assert result.call_id == "d1" and result.ok is False
    assert "error" in json.loads(result.result_json)
    assert p.final_text == result.result_json and "disconnect" in p.final_text
    calls, answered = tool_calls_answered(transcript(sc.sessions(), p.session_id))
    assert calls == ["d1"] and answered == {"d1"}


def test_host_error_reaches_the_model(sc):
    host = ToolHost(sc.tools(), "test", [("test.fail", "fails", {"type": "object"})],
                    lambda inv: (False, "", "disk on fire"))
    try:
        host.wait_registered()
        p = start(sc.prompts(), text="go", src=source(), profile="terr").result(15)
        assert p.end == "completed"
        result = p.frame("tool_result").tool_result
        assert result.ok is False and json.loads(result.result_json) == {"error": "disk on fire"}
        assert json.loads(p.final_text) == {"error": "disk on fire"}
    finally:
        host.close()


@pytest.mark.parametrize("result_json", ["12:00", ""])
def test_a_result_that_is_no_json_is_a_failed_call_naming_the_field(sc, result_json):
    """docs/api.md: a tool_result's result_json is JSON. A host answering ok with
    text that is none got it passed on as is, to the model and to every adapter."""
    result = _tool_result_of_a_host_answering(sc, result_json)
    assert result.ok is False and json.loads(result.result_json)["error"].startswith("result_json: "), result


def test_a_result_nested_past_what_parsers_read_is_a_failed_call_saying_so(sc):
    """JSON nested 5,000 levels deep: valid, but no parser on its way reads
    it; the error said "is not JSON", which sent the host's author looking
    for a syntax error."""
    result = _tool_result_of_a_host_answering(sc, "[" * 5000 + "]" * 5000)
    error = json.loads(result.result_json)["error"]
    assert result.ok is False and error.startswith("result_json: ") and "nested too deeply" in error, error


# JSON that a tool host's own encoder writes (JSON.stringify, json.dumps) for a
# string cut in the middle of an emoji (a lone surrogate, escaped), and a number
# too large for a double: valid JSON, though orjson refuses both.
@pytest.mark.parametrize("result_json", ['{"snippet": "caf\\u00e9 \\ud83d"}', "[1e400]"])
def test_a_result_that_is_json_passes_as_it_is(sc, result_json):
    json.loads(result_json)  # JSON indeed
    result = _tool_result_of_a_host_answering(sc, result_json)
    assert result.ok is True and result.result_json == result_json, result


def test_a_result_past_the_text_cap_fails_its_call_and_the_host_serves_on(sc):
    """A host's result longer than limits.max_text_bytes (256 KiB) is the
    call's error result, naming the limit, as an in-process tool's is. It
    was refused on the wire, which ended the host's stream: the model saw
    "the tool host disconnected" and every later call "no tool host serves"."""
    big = json.dumps("x" * (300 * 1024))
    host = ToolHost(sc.tools(), "test", [("test.fail", "answers as told", {"type": "object"})],
                    lambda inv: (True, big, ""))
    try:
        host.wait_registered()
        for _ in range(2):  # the second call is answered by the same stream
            p = start(sc.prompts(), text="go", src=source(), profile="terr").result(15)
            assert p.end == "completed", (p.kinds(), p.error)
            result = p.frame("tool_result").tool_result
            assert result.ok is False and "limits.max_text_bytes" in json.loads(result.result_json)["error"]
        assert len(host.invocations) == 2 and host.error is None, host.error
    finally:
        host.close()


def _tool_result_of_a_host_answering(sc, result_json: str):
    """The tool_result frame of a turn whose host answers ok with ``result_json``."""
    host = ToolHost(sc.tools(), "test", [("test.fail", "answers as told", {"type": "object"})],
                    lambda inv: (True, result_json, ""))
    try:
        host.wait_registered()
        p = start(sc.prompts(), text="go", src=source(), profile="terr").result(15)
        assert p.end == "completed", (p.kinds(), p.error)
        return p.frame("tool_result").tool_result
    finally:
        host.close()


def test_tool_with_no_host_is_an_error_result(sc):
    p = start(sc.prompts(), text="go", src=source(), profile="tnohost").result(15)
    assert p.end == "completed", (p.kinds(), p.error)
    result = p.frame("tool_result").tool_result
    assert result.call_id == "n1" and result.ok is False
    assert "test.nohost" in json.loads(result.result_json)["error"]
    assert "test.nohost" in p.final_text


def test_repeated_tool_failures_end_with_tool_invoke_failed(sc):
    p = start(sc.prompts(), text="keep trying", src=source(), profile="tfail").result(15)
    assert p.end == "failed" and p.last.failed.reason == "TOOL_INVOKE_FAILED", p.kinds()
    assert p.error.code() == grpc.StatusCode.UNAVAILABLE and p.reason == "TOOL_INVOKE_FAILED"
    results = [f.tool_result for f in p.frames if f.WhichOneof("event") == "tool_result"]
    assert len(results) >= 2 and not any(r.ok for r in results)
    msgs = transcript(sc.sessions(), p.session_id)
    assert unanswered_calls(msgs) == [] and msgs[-1].role == "tool"


def test_a_registration_again_on_a_stream_replaces_its_tools(sc):
    host = ToolHost(sc.tools(), "again", [("again.a", "kept", {"type": "object"}),
                                          ("again.b", "dropped later", {"type": "object"})],
                    lambda inv: (True, json.dumps(inv.tool_name), ""))
    try:
        host.wait_registered()
        host.send_register("again", [("again.a", "kept", {"type": "object"})])
        wait_until(lambda: list(host.registered_msg.tool_names) == ["again.a"], what="the second registration")
        p = start(sc.prompts(), text="go", src=source(), profile="tdropped").result(15)
        result = p.frame("tool_result").tool_result
        assert result.ok is False and "no tool host serves 'again.b'" in result.result_json, result
        assert host.invocations == []
    finally:
        host.close()


def test_when_the_newest_host_of_a_tool_leaves_the_one_before_it_serves_it_again(sc):
    """Two hosts register one name (replicas): the newest answers; when it
    goes, the older one, still connected, answers again."""
    def who(name: str) -> ToolHost:
        return ToolHost(sc.tools(), "replica", [("replica.who", "who answers", {"type": "object"})],
                        lambda inv: (True, json.dumps(name), "")).wait_registered()

    older = who("older")
    try:
        newer = who("newer")
        assert start(sc.prompts(), text="who", src=source(), profile="treplica").result(15).final_text == '"newer"'
        newer.close()
        assert newer.ended.wait(10)  # its stream ended: the sidecar unregistered it first
        p = start(sc.prompts(), text="who", src=source(), profile="treplica").result(15)
        assert p.final_text == '"older"', (p.kinds(), p.final_text)
    finally:
        older.close()


def test_registering_outside_the_namespace_is_invalid_argument(sc):
    host = ToolHost(sc.tools(), "test", [("test.ok", "fine", {}), ("other.y", "not ours", {})])
    assert host.ended.wait(10)
    assert not host.registered.is_set()
    assert host.error is not None and host.error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(host.error) == ("INVALID_ARGUMENT", "register.tools[1].name")


@pytest.mark.parametrize("namespace, tools, field", [
    ("bad ns", [("bad ns.x", "", {})], "register.namespace"),
    ("*", [("*.x", "", {})], "register.namespace"),
    ("t", [("t..x", "", {})], "register.tools[0].name"),
    ("t", [("t.a b", "", {})], "register.tools[0].name"),
    ("t", [("t.ok", "", {}), ("t.ok", "", {})], "register.tools[1].name"),
    ("t", [("t.n", "", 42)], "register.tools[0].parameters_json_schema"),
    ("t", [("t.l", "", [1, 2])], "register.tools[0].parameters_json_schema"),
])
def test_names_a_model_cannot_call_and_schemas_that_are_no_object_are_invalid_argument(sc, namespace,
                                                                                        tools, field):
    """A name is dotted parts of letters, digits, '_' and '-' (no space, no scope wildcard, no
    empty part), a tool is named once per registration, and its schema is a JSON object:
    before, all of these registered, and a model was offered what it could not call."""
    host = ToolHost(sc.tools(), namespace, tools)
    assert host.ended.wait(10)
    assert not host.registered.is_set()
    assert host.error.code() == grpc.StatusCode.INVALID_ARGUMENT, host.error.details()
    assert error_info(host.error) == ("INVALID_ARGUMENT", field), host.error.details()


def nested(levels: int) -> dict:
    """ADD_SCHEMA with a keyword that makes it ``levels`` arrays and objects deep."""
    return {**ADD_SCHEMA, "x": json.loads("[" * (levels - 1) + "]" * (levels - 1))}


def test_a_schema_nested_past_the_cap_is_invalid_argument(sc):
    """A schema nested past 64 levels is refused where it comes in: before,
    one of 300 levels registered, and every turn that offered the tool then
    hung in its dispatch to a worker (orjson writes no value past 254 levels)."""
    host = ToolHost(sc.tools(), "test", [("test.add", "", nested(65))])
    assert host.ended.wait(10)
    assert not host.registered.is_set()
    assert error_info(host.error) == ("INVALID_ARGUMENT", "register.tools[0].parameters_json_schema")
    deep = ToolHost(sc.tools(), "test", [], register=False)
    deep._out.put(tpb.ServeToolsRequest(register=tpb.RegisterTools(namespace="test", tools=[
        tpb.ToolSpec(name="test.add", parameters_json_schema='{"x":' + "[" * 300 + "]" * 300 + "}")])))
    assert deep.ended.wait(10)
    assert error_info(deep.error) == ("INVALID_ARGUMENT", "register.tools[0].parameters_json_schema")


def offered_and_called(sc, schema: dict) -> None:
    """A host registers test.add with ``schema``; a turn that offers it calls
    it and runs to its end."""
    host = ToolHost(sc.tools(), "test", [("test.add", "", schema)], adder)
    try:
        host.wait_registered()
        p = start(sc.prompts(), text="add 2 and 3", src=source(), profile="tadd").result(15)
        assert p.end == "completed", (p.kinds(), p.error)
        assert json.loads(p.final_text) == {"sum": 5}
    finally:
        host.close()


def test_a_schema_nested_to_the_cap_is_offered_and_called(sc):
    """At the cap, a turn that offers the tool runs to its end."""
    offered_and_called(sc, nested(64))


def test_a_second_namespace_on_one_stream_is_invalid_argument(sc):
    host = ToolHost(sc.tools(), "test", [("test.a", "a", {"type": "object"})])
    try:
        host.wait_registered()
        host.send_register("other", [("other.b", "b", {"type": "object"})])
        assert host.ended.wait(10)
        assert host.error.code() == grpc.StatusCode.INVALID_ARGUMENT, host.error.details()
        assert error_info(host.error) == ("INVALID_ARGUMENT", "register.namespace")
    finally:
        host.close()


def test_bad_schema_is_invalid_argument(sc):
    host = ToolHost(sc.tools(), "test", [], register=False)
    host._out.put(tpb.ServeToolsRequest(register=tpb.RegisterTools(namespace="test", tools=[
        tpb.ToolSpec(name="test.j", parameters_json_schema="{not json")])))
    assert host.ended.wait(10)
    assert error_info(host.error) == ("INVALID_ARGUMENT", "register.tools[0].parameters_json_schema")


@pytest.mark.parametrize("schema, where", [
    ({"type": "string"}, "type"),
    ({"type": 5}, "type"),
    ({"properties": []}, "properties"),
    ({"type": "object", "properties": {"a": {"type": "nope"}}}, "properties.a.type"),
    ({"type": "object", "properties": {"a": 7}}, "properties.a"),
    ({"type": "object", "required": "a"}, "required"),
    ({"type": "object", "properties": {"l": {"type": "array", "items": {"type": ["string", "string"]}}}},
     "properties.l.items.type"),
    ({"type": "object", "anyOf": []}, "anyOf"),
    ({"type": "object", "description": {"x": 1}}, "description"),
])
def test_a_schema_that_is_no_json_schema_of_an_object_is_invalid_argument(sc, schema, where):
    """A model API refuses a request whose function schema is no JSON Schema of an
    arguments object (OpenAI's answers 400): before, such a schema registered, and
    every turn offered the tool, of every session in scope, failed at its model."""
    host = ToolHost(sc.tools(), "test", [("test.add", "", schema)])
    assert host.ended.wait(10)
    assert not host.registered.is_set()
    assert error_info(host.error) == ("INVALID_ARGUMENT", "register.tools[0].parameters_json_schema")
    assert f"parameters_json_schema: {where}: " in host.error.details(), host.error.details()


RICH_SCHEMA = {"type": "object", "title": "add", "$defs": {"n": {"type": ["number", "null"]}},
               "properties": {"a": {"$ref": "#/$defs/n"}, "b": {"anyOf": [{"type": "number"}, True]},
                              "opts": {"type": "array", "items": {"enum": [1, "x", None]}, "minItems": 0},
                              "my_keyword": {"x-vendor": [1, {"type": 5}], "default": {"type": 5}}},
               "required": ["a", "b"], "additionalProperties": False}


def test_a_json_schema_with_the_keywords_models_take_is_offered_and_called(sc):
    """The check is of shapes JSON Schema gives its keywords: a schema using many of
    them, with a keyword of its own and values that only look like schemas, registers."""
    offered_and_called(sc, RICH_SCHEMA)


@pytest.mark.parametrize("how", ["cancel", "interrupt", "timeout"])
def test_turn_ended_during_a_tool_call_leaves_a_valid_transcript(sc, how):
    first = []

    def answer_later_calls(inv):
        if not first:
            first.append(inv)
            return None  # the first call hangs
        return True, json.dumps("ok"), ""

    host = ToolHost(sc.tools(), "test", [("test.hang", "hangs once", {"type": "object"})], answer_later_calls)
    try:
        host.wait_registered()
        p = start(sc.prompts(), text="call it", src=source(), profile="thangt" if how == "timeout" else "thang")
        assert host.on_invocation.wait(10)
        if how == "cancel":
            assert sc.prompts().Cancel(ppb.CancelRequest(request_id=p.request_id), timeout=10).cancelled
        elif how == "interrupt":
            nxt = start(sc.prompts(), text="new", key=p.key, delivery=D.DELIVERY_MODE_INTERRUPT)
        p.result(10)
        assert p.end == "failed"
        assert p.reason == {"cancel": "CANCELLED", "interrupt": "CANCELLED", "timeout": "AGENT_TIMEOUT"}[how]
        if how == "interrupt":
            assert nxt.result(10).final_text == "after"
        msgs = transcript(sc.sessions(), p.session_id)
        calls, _ = tool_calls_answered(msgs)
        assert "x1" in calls
        assert unanswered_calls(msgs) == [], [(m.role, m.tool_call_id, m.tool_calls_json) for m in msgs]
    finally:
        host.close()


# -- every ServeTools stream ends with a status (issue 14, item 8) ---------------------------

def _register(ns: str) -> tpb.ServeToolsRequest:
    return tpb.ServeToolsRequest(register=tpb.RegisterTools(namespace=ns, tools=[
        tpb.ToolSpec(name=f"{ns}.x" if ns else "x", parameters_json_schema='{"type": "object"}')]))


@pytest.mark.parametrize("second, code, field", [
    (None, grpc.StatusCode.OK, None),  # register, then half-close
    ("", grpc.StatusCode.INVALID_ARGUMENT, "register.namespace"),  # then register("")
    ("ztwo", grpc.StatusCode.INVALID_ARGUMENT, "register.namespace"),  # then a second namespace
])
def test_serve_tools_ends_with_a_status_before_the_deadline(sc, second, code, field):
    """Register, then end the stream one of three ways, 20 times each: every
    call ends with its status (the first registration acknowledged first),
    never a hang past the client's deadline, never INTERNAL or UNKNOWN."""
    outcomes = []
    for _ in range(20):
        msgs = [_register("zone")] + ([] if second is None else [_register(second)])
        got, status = [], grpc.StatusCode.OK
        try:
            for r in sc.tools().ServeTools(iter(msgs), timeout=5):
                got.append(r.WhichOneof("message"))
        except grpc.RpcError as e:
            status = e.code()
            assert error_info(e) == ("INVALID_ARGUMENT", field), (e.code(), e.details())
        outcomes.append((status, got))
    assert outcomes == [(code, ["registered"])] * 20, outcomes


# -- a host serves only the platforms of its credential (issue 14, item 7) -------------------

class _Bearer:
    """A ToolService stub whose ServeTools calls carry a bearer token."""

    def __init__(self, stub, token: str):
        self.stub, self.metadata = stub, [("authorization", f"Bearer {token}")]

    def ServeTools(self, requests, timeout=None):
        return self.stub.ServeTools(requests, timeout=timeout, metadata=self.metadata)


def _prompt(prompts, token: str, platform: str, profile: str = "spy"):
    """One turn over TCP with ``token``: (frames, error or None)."""
    frames = []
    req = ppb.PromptRequest(request_id=rid(profile), text="go", profile=profile,
                            source=source(platform=platform))
    try:
        for r in prompts.Prompt(req, timeout=20, metadata=[("authorization", f"Bearer {token}")]):
            if r.frame.WhichOneof("event") != "keepalive":
                frames.append(r.frame)
    except grpc.RpcError as e:
        return frames, e
    return frames, None


def test_a_host_never_serves_a_session_of_a_platform_its_token_does_not_cover(tmp_path):
    """A host on a telegram token registers telegram.spy; a discord session
    whose profile allows telegram.* calls it: the call never reaches the host,
    the model gets an error result, the turn fails TOOL_SCOPE_VIOLATION. The
    same tool called from a telegram session is served as usual."""
    cfg = (scripted("spy", calls_then_echo("telegram.spy", {}, "s1"), tools=["telegram.*"])
           + '[[auth.tokens]]\ntoken = "tg"\nplatforms = ["Telegram"]\n'
           + '[[auth.tokens]]\ntoken = "dc"\nplatforms = ["discord"]\n')
    sc = Sidecar(tmp_path / "data", config=cfg, tcp=True, workers=1).start()
    host = ToolHost(_Bearer(sc.tools(tcp=True), "tg"), "telegram",
                    [("telegram.spy", "reads a telegram chat", {"type": "object"})],
                    lambda inv: (True, json.dumps("telegram secrets"), ""))
    try:
        host.wait_registered()
        prompts = sc.prompts(tcp=True)
        frames, err = _prompt(prompts, "dc", "discord")
        assert err is not None and err.code() == grpc.StatusCode.PERMISSION_DENIED, err
        assert error_info(err)[0] == "TOOL_SCOPE_VIOLATION"
        assert frames[-1].failed.reason == "TOOL_SCOPE_VIOLATION"
        assert host.invocations == [], "the call must never reach the host"
        msgs = transcript(sc.sessions(), frames[0].session_id)
        assert unanswered_calls(msgs) == [] and msgs[-1].role == "tool"
        assert json.loads(msgs[-1].content)["reason"] == "TOOL_SCOPE_VIOLATION"
        assert "telegram secrets" not in " ".join(m.content for m in msgs)
        frames, err = _prompt(prompts, "tg", "telegram")
        assert err is None and frames[-1].completed.final_text == '"telegram secrets"', (err, frames[-1])
        assert [i.tool_name for i in host.invocations] == ["telegram.spy"]
    finally:
        host.cancel()
        sc.stop()


def test_a_tool_two_hosts_serve_is_answered_by_the_newest_whose_token_covers_the_session(tmp_path):
    """An admin host and, registered after it, a telegram-scoped replica serve
    telegram.who: a telegram session's call goes to the replica, a discord
    session's to the admin host (not refused because the newest host may not
    serve it)."""
    cfg = (scripted("who", calls_then_echo("telegram.who", {}, "w1"), tools=["telegram.*"])
           + '[[auth.tokens]]\ntoken = "adm"\nadmin = true\n'
           + '[[auth.tokens]]\ntoken = "tg"\nplatforms = ["telegram"]\n'
           + '[[auth.tokens]]\ntoken = "dc"\nplatforms = ["discord"]\n')
    sc = Sidecar(tmp_path / "data", config=cfg, tcp=True, workers=1).start()
    hosts = [ToolHost(_Bearer(sc.tools(tcp=True), token), "telegram", [("telegram.who", "who", {"type": "object"})],
                      lambda inv, token=token: (True, json.dumps(token), "")).wait_registered()
             for token in ("adm", "tg")]
    try:
        prompts = sc.prompts(tcp=True)
        for token, platform, answered_by in (("tg", "telegram", "tg"), ("dc", "discord", "adm")):
            frames, err = _prompt(prompts, token, platform, profile="who")
            assert err is None and frames[-1].completed.final_text == json.dumps(answered_by), (err, frames[-1])
    finally:
        for host in hosts:
            host.cancel()
        sc.stop()

"""Third-party extensions through Python entry points, installed for real: a
distribution (dist-info with entry_points.txt) on the sidecar's path adds a
model backend (``agent_sidecar.models``) and an in-process tool
(``agent_sidecar.tools``), and a profile uses both."""

from __future__ import annotations

import json
import textwrap
import threading
import time

from helpers.config import scripted
from helpers.ids import rid
from helpers.sessions import transcript
from helpers.streams import run
from helpers.tools import ToolHost
from sidecar_proc import Sidecar, error_info

from agent_sidecar.v1 import common_pb2 as c
from agent_sidecar.v1 import prompt_service_pb2 as ppb

PLUGIN = '''
from agent_sidecar.models.base import TextDelta, ToolCallRequest, UsageReport


class ShoutModel:
    """Calls plug.upper on the user's text, then answers with the tool's result."""

    def __init__(self, options):
        self.suffix = options.get("suffix", "")

    async def stream(self, request):
        last = request.messages[-1]
        if last["role"] == "tool":
            yield TextDelta(last["content"].strip('"') + self.suffix)
        else:
            import json
            yield ToolCallRequest("c1", "plug.upper", json.dumps({"text": last["content"]}))
        yield UsageReport(input_tokens=1, output_tokens=1)

    async def aclose(self):
        pass


class BrokenModel:
    """Yields one event whose field is of the wrong type (model_options.bad)."""

    def __init__(self, options):
        self.bad = options["bad"]

    async def stream(self, request):
        yield TextDelta("fine so far ")
        if self.bad == "text":
            yield TextDelta(5)
        elif self.bad == "call_id":
            yield ToolCallRequest(7, "plug.upper", "{}")
        elif self.bad == "arguments":
            yield ToolCallRequest("c1", "plug.upper", {"text": "a dict"})
        elif self.bad == "usage":
            yield UsageReport(input_tokens="lots")
        elif self.bad == "cost":
            yield UsageReport(cost_usd=float("nan"))

    async def aclose(self):
        pass


class BigModel:
    """48 deltas of 100 Ki characters back to back: 4.8 Mi characters inside
    one coalescing window."""

    def __init__(self, options):
        pass

    async def stream(self, request):
        for i in range(48):
            yield TextDelta(chr(ord("a") + i % 26) * (100 << 10))

    async def aclose(self):
        pass


def tools():
    return [{"name": "plug.upper", "description": "Upper-case a text.",
             "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
             "handler": upper},
            {"name": "plug.big", "description": "A lot of text.", "parameters": {"type": "object"},
             "handler": big}]


def big():
    return "x" * (5 << 20)


def upper(text):
    if text == "nap":  # a plain function that blocks: it must hold up its own turn only
        import time
        time.sleep(3)
    return text.upper()
'''


def plugin_sidecar(tmp_path, config: str, **kw) -> Sidecar:
    """A sidecar (not started) whose Python path holds the plugin distribution."""
    plugin_dir = tmp_path / "site"
    plugin_dir.mkdir()
    _install_plugin(plugin_dir)
    return Sidecar(tmp_path / "data", config=config, env={"PYTHONPATH": str(plugin_dir)}, **kw)


def _install_plugin(root):
    (root / "sidecar_plugin.py").write_text(PLUGIN)
    info = root / "sidecar_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sidecar-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(textwrap.dedent("""\
        [agent_sidecar.models]
        shout = sidecar_plugin:ShoutModel
        broken = sidecar_plugin:BrokenModel
        big = sidecar_plugin:BigModel

        [agent_sidecar.tools]
        plug = sidecar_plugin:tools
        """))


def test_model_and_tool_from_entry_points(tmp_path):
    config = textwrap.dedent("""\
        [profiles.plug]
        model = "shout"
        tools = ["plug.*"]
        model_options = { suffix = "!" }
        """)
    sc = plugin_sidecar(tmp_path, config).start()
    try:
        frames = []
        req = ppb.PromptRequest(request_id=rid(), source=c.SessionSource(platform="t", chat_id="p"),
                                text="hello plugin", profile="plug")
        for r in sc.prompts().Prompt(req, timeout=30):
            frames.append(r.frame)
        kinds = [f.WhichOneof("event") for f in frames]
        assert kinds[-1] == "completed", kinds
        call = next(f.tool_call for f in frames if f.WhichOneof("event") == "tool_call")
        result = next(f.tool_result for f in frames if f.WhichOneof("event") == "tool_result")
        assert call.name == "plug.upper"
        assert result.ok and result.result_json == '"HELLO PLUGIN"'
        assert frames[-1].completed.final_text == "HELLO PLUGIN!"
        # A remote host may not take an in-process tool's name: once it left,
        # the tool would be gone until the next restart.
        host = ToolHost(sc.tools(), "plug", [("plug.upper", "shadow", {"type": "object"})])
        try:
            assert host.ended.wait(10) and not host.registered.is_set()
            assert error_info(host.error) == ("INVALID_ARGUMENT", "register.tools[0].name")
        finally:
            host.close()
        frames = [r.frame for r in sc.prompts().Prompt(ppb.PromptRequest(
            request_id=rid(), source=c.SessionSource(platform="t", chat_id="p2"),
            text="still here", profile="plug"), timeout=30)]
        assert frames[-1].completed.final_text == "STILL HERE!", [f.WhichOneof("event") for f in frames]
        # A blocking in-process tool runs off the event loop: a turn started
        # after it, on another session, ends first.
        done: list[str] = []

        def turn(chat_id, text):
            out = [r.frame for r in sc.prompts().Prompt(ppb.PromptRequest(
                request_id=rid(), source=c.SessionSource(platform="t", chat_id=chat_id),
                text=text, profile="plug"), timeout=30)]
            done.append(out[-1].completed.final_text)
        napper = threading.Thread(target=turn, args=("p3", "nap"))
        napper.start()
        time.sleep(0.5)
        turn("p4", "quick")
        napper.join()
        assert done == ["QUICK!", "NAP!"], done
    finally:
        sc.stop()


BROKEN = {"text": "TextDelta.text", "call_id": "ToolCallRequest.call_id",
          "arguments": "ToolCallRequest.arguments_json", "usage": "UsageReport.input_tokens",
          "cost": "UsageReport.cost_usd"}


def test_a_backend_event_of_the_wrong_type_fails_the_turn_naming_it(tmp_path):
    """A third-party backend's bug (an int where the interface says str, a
    count that is no count) fails its turn LLM_API_FAILURE naming the field,
    in the worker, before anything reaches a frame; a text that was no str
    left the turn hanging past its timeout, its stream never ending."""
    config = "".join(f'[profiles.{bad}]\nmodel = "broken"\ntools = ["plug.*"]\ntimeout_s = 10\n'
                     f'model_options = {{ bad = "{bad}" }}\n' for bad in BROKEN)
    with plugin_sidecar(tmp_path, config, workers=1) as sc:
        for bad, field in BROKEN.items():
            out = run(sc.prompts(), text="hi", src=c.SessionSource(platform="t", chat_id=bad), profile=bad)
            assert out.end == "failed", (bad, out.kinds(), out.code, out.details)
            assert out.last.failed.reason == "LLM_API_FAILURE" and field in out.last.failed.message, \
                (bad, out.last)


def test_a_reply_past_max_reply_chars_fails_the_turn_keeping_the_text_so_far(tmp_path):
    """A model streaming 4.8 Mi characters inside one coalescing window: they
    went out as one text_delta frame, and whole again in the completed frame,
    past the 4 MiB a gRPC client takes in one message by default: the
    client's stream died RESOURCE_EXHAUSTED, whatever the turn did. A reply
    is now held to limits.max_reply_chars (512 Ki characters)."""
    config = '[profiles.burst]\nmodel = "big"\nmodel_options = { shape = "burst" }\n'
    with plugin_sidecar(tmp_path, config, workers=1) as sc:
        out = run(sc.prompts(), text="hi", src=c.SessionSource(platform="t", chat_id="big"), profile="burst",
                  timeout=60)
        assert out.end == "failed", (out.code, out.details)
        assert out.last.failed.reason == "RESOURCE_EXHAUSTED" and "max_reply_chars" in out.last.failed.message
        kept = "".join(chr(ord("a") + i) * (100 << 10) for i in range(5))  # the sixth passed 512 Ki
        assert out.text() == kept
        said = [m.content for m in transcript(sc.sessions(), out.session_id) if m.role == "assistant"]
        assert said == [kept]


def test_an_in_process_tool_result_past_max_text_bytes_reaches_the_model_as_an_error(tmp_path):
    """An in-process tool returning 5 Mi characters: the result went out whole
    in the tool_result frame, past the 4 MiB a gRPC client takes by default,
    and the client's stream died with the turn still running. Now the model
    gets an error result naming the limit (a host's result has that bound on
    the wire already) and the turn goes on."""
    config = scripted("bigtool", [{"tool_calls": [{"name": "plug.big", "id": "b1"}]},
                                  {"text_from_last_tool_result": True}], tools=["plug.*"])
    with plugin_sidecar(tmp_path, config, workers=1) as sc:
        out = run(sc.prompts(), text="hi", src=c.SessionSource(platform="t", chat_id="bt"), profile="bigtool",
                  timeout=60)
        assert out.end == "completed", (out.kinds(), out.code, out.details)
        result = out.frame("tool_result").tool_result
        assert not result.ok and "limits.max_text_bytes" in json.loads(result.result_json)["error"]


def _dist(root, dirname, text):
    info = root / dirname
    info.mkdir()
    (info / "entry_points.txt").write_text(textwrap.dedent(text))


def test_the_reader_answers_as_importlib_metadata_does(tmp_path, monkeypatch):
    """agent_sidecar.entry_points reads entry_points.txt without importing
    importlib.metadata (and the email package with it): for this environment's
    distributions and for hand-made ones it finds the same entry points."""
    import importlib.metadata
    import sys

    from agent_sidecar.entry_points import entry_points

    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    _dist(first, "My.Plugin-2.0.dist-info", """\
        # a comment
        [agent_sidecar.models]
        loud = sidecar_plugin:ShoutModel [extra]
        [agent_sidecar.tools]
        plug=sidecar_plugin:tools
        """)
    _dist(second, "my_plugin-1.0.dist-info", "[agent_sidecar.models]\nold = elsewhere:Old\n")  # shadowed
    _dist(second, "other-1.0.egg-info", "[agent_sidecar.models]\nother = os.path:join\n")
    monkeypatch.setattr(sys, "path", [str(first), str(second), *sys.path])
    importlib.invalidate_caches()
    for group in ("agent_sidecar.models", "agent_sidecar.tools", "console_scripts", "pytest11"):
        ours = sorted((ep.name, ep.value) for ep in entry_points(group))
        theirs = sorted((ep.name, ep.value) for ep in importlib.metadata.entry_points(group=group))
        assert ours == theirs, group
    models = {ep.name: ep for ep in entry_points("agent_sidecar.models")}
    assert "old" not in models and models["loud"].value == "sidecar_plugin:ShoutModel [extra]"
    import os.path
    assert models["other"].load() is os.path.join


def test_a_malformed_entry_point_fails_to_load_with_its_name(tmp_path, monkeypatch):
    import sys

    import pytest

    from agent_sidecar.entry_points import entry_points

    _dist(tmp_path, "broken-1.0.dist-info", "[agent_sidecar.tools]\nbad = not a module path!\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    (ep,) = entry_points("agent_sidecar.tools")
    with pytest.raises(ValueError, match="'bad'"):
        ep.load()

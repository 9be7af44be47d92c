"""Text delta coalescing (issue 18 item 4, ``[stream] coalesce_ms``): the
deltas a turn's model produces within one window are persisted and sent as
one ``text_delta`` frame whose text is theirs concatenated, exactly; any
other frame (a tool call, usage, the terminal frame) sends the waiting text
first; ``coalesce_ms = 0`` keeps one frame per model delta; a bad value is
refused naming the key.

The models here produce their deltas in one burst (no latency between
them), so what a window holds does not depend on timing: the first delta
goes out at once, the rest wait for the next other frame."""

from __future__ import annotations

import grpc
import pytest
from helpers.config import echo, scripted, table
from helpers.sessions import transcript
from helpers.streams import assert_failed, assert_well_formed, prompt_req, run
from sidecar_proc import Sidecar

from agent_sidecar.config import ConfigError, load_config

TEXT = "the quick brown fox jumps over the lazy dog, twice: the quick brown fox"
WORDS = len(TEXT.split())
PROFILES = (
    echo("main")
    + scripted("calls", [{"text": TEXT, "tool_calls": [{"name": "nowhere.tool", "arguments": {}}]}],
               tools=["test.*"])
    + scripted("slow", [{"text": TEXT, "token_latency_ms": 150}], timeout_s=1)
)


def _with_window(tmp_path_factory, name: str, coalesce_ms: float):
    s = Sidecar(tmp_path_factory.mktemp(name) / "data",
                config=table("stream", coalesce_ms=coalesce_ms) + PROFILES, workers=1).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A window far longer than any of these turns."""
    yield from _with_window(tmp_path_factory, "coalesce", 1000)


@pytest.fixture(scope="module")
def off(tmp_path_factory):
    yield from _with_window(tmp_path_factory, "coalesce-off", 0)


def deltas(out) -> list[str]:
    return [f.text_delta.text for f in out.frames if f.WhichOneof("event") == "text_delta"]


def test_deltas_in_one_window_are_one_frame_with_the_exact_text(wide):
    out = run(wide.prompts(), prompt_req(text=TEXT))
    assert_well_formed(out)
    # the first delta at once, every later one of the burst in one frame, sent before the usage
    assert out.kinds() == ["accepted", "started", "text_delta", "text_delta", "usage", "completed"]
    assert deltas(out) == ["the ", TEXT[len("the "):]]
    assert out.text() == TEXT and out.last.completed.final_text == TEXT
    assert out.usage()[1] == WORDS  # usage counts the model's tokens, not the frames
    (user, reply) = transcript(wide.sessions(), out.session_id)
    assert (user.content, reply.content) == (TEXT, TEXT)


def test_text_before_a_tool_call_is_sent_before_it(wide):
    """A model answer of text and a tool call: the text, whole, then the call
    (the model call's usage comes between them: it sent the text already)."""
    out = run(wide.prompts(), prompt_req(text="go", profile="calls"))
    assert_failed(out, "TOOL_SCOPE_VIOLATION", grpc.StatusCode.PERMISSION_DENIED)
    kinds = out.kinds()
    assert kinds[2:] == ["text_delta", "text_delta", "usage", "tool_call", "tool_result", "failed"], kinds
    assert "".join(deltas(out)) == TEXT


def test_the_terminal_frame_sends_the_waiting_text_first(wide):
    """Cut off by its timeout mid-stream: what the model said reached the
    stream before ``failed``, and it is what the transcript kept."""
    out = run(wide.prompts(), prompt_req(text="go", profile="slow"))
    assert_failed(out, "AGENT_TIMEOUT", grpc.StatusCode.DEADLINE_EXCEEDED)
    kinds = out.kinds()
    assert kinds[-1] == "failed" and kinds.count("text_delta") >= 1, kinds
    streamed = "".join(deltas(out))
    assert streamed and TEXT.startswith(streamed) and streamed != TEXT
    messages = transcript(wide.sessions(), out.session_id)
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[1].content == streamed


def test_coalesce_ms_0_sends_one_frame_per_model_delta(off):
    out = run(off.prompts(), prompt_req(text=TEXT))
    assert_well_formed(out)
    assert len(deltas(out)) == WORDS
    assert out.text() == TEXT


def test_a_bad_coalesce_ms_is_refused_naming_the_key(tmp_path):
    path = tmp_path / "c.toml"
    for value in ("-1", "1001", '"soon"'):
        path.write_text(f"[stream]\ncoalesce_ms = {value}\n")
        with pytest.raises(ConfigError) as e:
            load_config(str(path), environ={})
        assert any("stream.coalesce_ms" in line for line in e.value.problems), e.value.problems
    path.write_text("[stream]\ncoalesce_ms = 25\n")
    assert load_config(str(path), environ={}).stream.coalesce_ms == 25

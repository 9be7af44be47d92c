"""The session context section a turn's model reads is GetSessionContext's
for the lane's latest source (seed 001 §9: where the current message came
from), through a real sidecar and a real OpenAI-compatible server on loopback
(FakeOpenAI records each request). A chat renamed mid-conversation: the next
turn's system prompt names it as it is now, as GetSessionContext and the
Session's display name do; the section was cached per incarnation, so every
later turn kept the first turn's chat name."""

from __future__ import annotations

import pytest
from helpers.config import profile
from helpers.fake_openai import FakeOpenAI
from helpers.ids import source
from helpers.sessions import get_session
from helpers.streams import PromptRun
from sidecar_proc import Sidecar

from agent_sidecar.v1 import session_service_pb2 as pb


@pytest.fixture(scope="module")
def fake():
    with FakeOpenAI([{"text": "fine"}]) as server:
        yield server


@pytest.fixture(scope="module")
def sc(tmp_path_factory, fake):
    s = Sidecar(tmp_path_factory.mktemp("context") / "data",
                config=profile("main", "openai", {"base_url": fake.url, "model": "m"})).start()
    yield s
    s.stop()


def _system_prompt_of_turn(sc, fake, src) -> str:
    out = PromptRun(sc.prompts(), text="hi", src=src).result(30)
    assert out.end == "completed", out.kinds()
    first = fake.requests[-1]["messages"][0]
    assert first["role"] == "system"
    return first["content"]


def test_a_renamed_chat_is_named_as_it_is_now(sc, fake):
    old = source("telegram", chat_type="group", chat_name="Old name", user_id="u1")
    renamed = source("telegram", chat_id=old.chat_id, chat_type="group", chat_name="New name",
                     user_id="u1", chat_topic="trips")
    assert "Old name" in _system_prompt_of_turn(sc, fake, old)
    text = _system_prompt_of_turn(sc, fake, renamed)
    context = sc.sessions().GetSessionContext(pb.GetSessionContextRequest(source=renamed),
                                              timeout=10).prompt_section
    assert text.endswith("\n\n" + context), (text, context)
    assert "New name" in text and "Old name" not in text and "trips" in text
    key = sc.sessions().GetOrCreateSession(pb.GetOrCreateSessionRequest(source=renamed),
                                           timeout=10).session.session_key
    assert get_session(sc.sessions(), key).display_name == "New name"

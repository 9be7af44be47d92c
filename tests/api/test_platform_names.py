"""Platform names through the real sidecar (issue 14, item 17; seed 001 §9):
names are case-insensitive wherever a platform enters (a source, a session key
a caller spells, the ListSessions and WatchActivity filters, token scopes, the
``[platforms.*]`` tables), and ``[platforms.NAME] pii_safe`` decides whether a
plugin platform's ids are redacted in the system prompt, both in
GetSessionContext and in the prompt a turn's model gets."""

from __future__ import annotations

import grpc
import pytest
from helpers.config import echo, profile
from helpers.fake_openai import FakeOpenAI
from helpers.ids import uniq
from helpers.sessions import create, rpc_error
from helpers.streams import PromptRun, Watcher
from helpers.waiting import wait_until
from sidecar_proc import Sidecar

from agent_sidecar.v1 import common_pb2 as c
from agent_sidecar.v1 import prompt_service_pb2 as ppb
from agent_sidecar.v1 import session_service_pb2 as pb

RAW_USER = "424242"
HASHED_USER = "user_833dfc7e3eb1"  # sha256("424242")[:12]
PLATFORMS = """\
[sidecar]
redact_pii = true

[platforms.MyPlugin]
pii_safe = true

[platforms.slack]
pii_safe = false
"""


@pytest.fixture(scope="module")
def fake():
    f = FakeOpenAI([{"text": "ok"}]).start()
    yield f
    f.stop()


@pytest.fixture(scope="module")
def sc(tmp_path_factory, fake):
    profiles = echo("main") + profile("gpt", "openai", {"base_url": fake.url, "model": "m"})
    s = Sidecar(tmp_path_factory.mktemp("platforms") / "data", config=PLATFORMS + profiles).start()
    yield s
    s.stop()


def _context(sc, platform: str) -> str:
    source = c.SessionSource(platform=platform, chat_id=uniq(), user_id=RAW_USER)
    return sc.sessions().GetSessionContext(pb.GetSessionContextRequest(source=source),
                                           timeout=10).prompt_section


@pytest.mark.parametrize("platform, redacted", [
    ("myplugin", True), ("MYPLUGIN", True),  # marked pii_safe, in any spelling
    ("otherplugin", False),  # a plugin platform not marked: left alone
    ("slack", False),  # a built-in pii-safe platform turned off
    ("Telegram", True),  # a built-in one, spelled differently
])
def test_pii_safe_comes_from_the_platforms_table(sc, platform, redacted):
    text = _context(sc, platform)
    assert (HASHED_USER in text, RAW_USER in text) == (redacted, not redacted), text


def test_a_turn_on_a_pii_safe_plugin_platform_gets_redacted_ids(sc, fake):
    for platform, redacted in (("MyPlugin", True), ("otherplugin", False)):
        src = c.SessionSource(platform=platform, chat_id=uniq(), user_id=RAW_USER)
        run = PromptRun(sc.prompts(), text="hi", src=src, profile="gpt").result(20)
        assert run.end == "completed", (run.kinds(), run.error)
        system = fake.requests[-1]["messages"][0]["content"]
        assert (HASHED_USER in system, RAW_USER in system) == (redacted, not redacted), system


def test_two_spellings_of_a_platform_are_one_lane(sc):
    chat = uniq()
    first, created = create(sc.sessions(), c.SessionSource(platform="Telegram", chat_id=chat))
    again, created_again = create(sc.sessions(), c.SessionSource(platform="telegram", chat_id=chat))
    assert created and not created_again
    key = f"agent:main:telegram:dm:{chat}"
    assert first.session_key == again.session_key == key and first.platform == "telegram"
    assert again.session_id == first.session_id
    spelled = f"agent:main:TeleGram:dm:{chat}"
    got = sc.sessions().GetSession(pb.GetSessionRequest(session_key=spelled), timeout=10).session
    assert got.session_id == first.session_id
    by_key = Watcher(sc.prompts(), session_key=spelled)
    by_platform = Watcher(sc.prompts(), platform="TELEGRAM")
    try:
        run = PromptRun(sc.prompts(), text="one lane", key=spelled).result(20)
        assert run.end == "completed", (run.kinds(), run.error)
        assert run.key == key and run.session_id == first.session_id
        for w in (by_key, by_platform):
            wait_until(lambda w=w: run.request_id in w.request_ids(), 10, what="the turn's frames")
    finally:
        by_key.close()
        by_platform.close()
    listed = sc.sessions().ListSessions(pb.ListSessionsRequest(platform="Telegram"), timeout=10)
    assert key in [s.session_key for s in listed.sessions]
    queue = sc.prompts().GetQueue(ppb.GetQueueRequest(session_key=spelled), timeout=10)
    assert not queue.HasField("pending") and list(queue.queued) == []


def test_a_platform_longer_than_the_cap_in_lower_case_is_invalid_argument(sc):
    """The name a session keeps is the lower case one: before, "İ" x 200 (200
    characters, 400 in lower case) made a session whose Session.platform and
    origin the API then refused back (ListSessions' platform, a source) as
    longer than 256 characters."""
    for platform in ("İ" * 200, "İ" * 129):
        with rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "source.platform"):
            create(sc.sessions(), c.SessionSource(platform=platform, chat_id=uniq()))
    s, created = create(sc.sessions(), c.SessionSource(platform="İ" * 128, chat_id=uniq()))
    assert created and len(s.platform) == 256
    listed = sc.sessions().ListSessions(pb.ListSessionsRequest(platform=s.platform), timeout=10)
    assert [x.session_key for x in listed.sessions] == [s.session_key]
    again, created_again = create(sc.sessions(), s.origin)
    assert not created_again and again.session_id == s.session_id

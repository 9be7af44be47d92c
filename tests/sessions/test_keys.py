"""Unit tests for agent_sidecar.sessions.keys and SessionSource serialisation."""

import pytest
from helpers.key_cases import KEY_CASES, WHATSAPP_ALIASES

from agent_sidecar.sessions.keys import (
    build_session_key,
    canonical_whatsapp_identifier,
    is_shared_multi_user_session,
    split_session_key,
)
from agent_sidecar.sessions.source import SessionSource

pytestmark = pytest.mark.store_free("session keys and sources, in-process")


@pytest.mark.parametrize("case", KEY_CASES, ids=[c["id"] for c in KEY_CASES])
def test_key_table(case):
    source = SessionSource(**case["source"])
    key = build_session_key(source, case["profile"], **case["flags"])
    assert key == case["key"]
    assert is_shared_multi_user_session(source, **case["flags"]) is case["shared"]
    assert split_session_key(key) == (
        case["profile"], case["source"]["platform"], case["source"].get("chat_type") or "dm"
    )


def test_seed_rows_are_covered():
    keys = {c["key"] for c in KEY_CASES}
    for row in [
        "agent:main:telegram:dm:12345",
        "agent:main:telegram:dm:12345:thread_678",
        "agent:main:signal:dm:user_abc",
        "agent:main:telegram:dm",
        "agent:main:telegram:group:-10012345",
        "agent:main:telegram:group:-10012345:user_abc",
        "agent:main:discord:group:12345:thread_678",
        "agent:main:discord:group:12345:thread_678:user_abc",
        "agent:main:slack:channel:C12345",
    ]:
        assert row in keys


def test_default_arguments_are_seed_defaults():
    src = SessionSource(platform="discord", chat_type="group", chat_id="1", thread_id="2", user_id="u")
    assert build_session_key(src) == "agent:main:discord:group:1:2"
    assert is_shared_multi_user_session(src) is True
    grp = SessionSource(platform="telegram", chat_type="group", chat_id="1", user_id="u")
    assert build_session_key(grp) == "agent:main:telegram:group:1:u"
    assert is_shared_multi_user_session(grp) is False


@pytest.mark.parametrize("alias", WHATSAPP_ALIASES)
def test_whatsapp_aliases_canonicalise(alias):
    assert canonical_whatsapp_identifier(alias) == "+15551234567"


@pytest.mark.parametrize(
    "value, expected",
    [
        ("", ""),
        ("   ", ""),
        ("120363012345678901@g.us", "120363012345678901"),
        ("120363012345678901", "120363012345678901"),  # 18 digits: not E.164, left alone
        ("15551234567-1612345678@g.us", "15551234567-1612345678"),  # legacy group id keeps dash
        ("status@broadcast", "status"),
        ("123456789012345@lid", "+123456789012345"),
        ("123456789012345:4@lid", "+123456789012345"),
        ("alice", "alice"),
        ("alice@s.whatsapp.net", "alice"),
        ("someone@example.com", "someone@example.com"),
        ("+44 20 7946 0958", "+442079460958"),
        ("0044 20 7946 0958", "+442079460958"),
    ],
)
def test_canonical_whatsapp_edge_cases(value, expected):
    assert canonical_whatsapp_identifier(value) == expected


def test_whatsapp_canonicalisation_only_on_whatsapp():
    src = SessionSource(platform="signal", chat_type="dm", chat_id="+1 (555) 123-4567")
    assert build_session_key(src) == "agent:main:signal:dm:+1 (555) 123-4567"


@pytest.mark.parametrize(
    "source_kwargs, flags, expected",
    [
        ({"chat_type": "dm", "thread_id": "t"}, {}, False),
        ({"chat_type": "dm"}, {"group_sessions_per_user": False}, False),
        ({"chat_type": ""}, {"group_sessions_per_user": False}, False),
        ({"chat_type": "group"}, {}, False),
        ({"chat_type": "group"}, {"group_sessions_per_user": False}, True),
        ({"chat_type": "channel"}, {"group_sessions_per_user": False}, True),
        ({"chat_type": "group", "thread_id": "t"}, {}, True),
        ({"chat_type": "group", "thread_id": "t"}, {"thread_sessions_per_user": True}, False),
        ({"chat_type": "thread", "thread_id": "t"}, {"group_sessions_per_user": False,
                                                      "thread_sessions_per_user": True}, False),
        ({"chat_type": "thread"}, {"group_sessions_per_user": False}, True),
    ],
)
def test_is_shared_multi_user_session(source_kwargs, flags, expected):
    src = SessionSource(platform="telegram", chat_id="c", user_id="u", **source_kwargs)
    assert is_shared_multi_user_session(src, **flags) is expected


@pytest.mark.parametrize(
    "kwargs, profile, field",
    [
        ({"platform": ""}, "main", "source.platform"),
        ({"platform": "tele:gram"}, "main", "source.platform"),
        ({"platform": "telegram"}, "", "profile"),
        ({"platform": "telegram"}, "a:b", "profile"),
        ({"platform": "telegram", "chat_type": "gr:oup"}, "main", "source.chat_type"),
    ],
)
def test_validation_errors_name_the_field(kwargs, profile, field):
    with pytest.raises(ValueError) as err:
        build_session_key(SessionSource(**kwargs), profile)
    assert str(err.value).startswith(field + ":")


@pytest.mark.parametrize(
    "key", ["", "agent", "agent:main:telegram", "agent::telegram:dm", "session:main:telegram:dm",
            "agent:main:telegram:dm:", "agent:main::dm:1"],
)
def test_split_session_key_rejects_malformed(key):
    with pytest.raises(ValueError) as err:
        split_session_key(key)
    assert str(err.value).startswith("session_key:")


def test_split_session_key_keeps_colons_in_ids():
    assert split_session_key("agent:ops:matrix:group:!r:example.org:@a:example.org") == (
        "ops", "matrix", "group")
    assert split_session_key("agent:main:telegram:dm") == ("main", "telegram", "dm")


# --- SessionSource -------------------------------------------------------------------

def test_source_is_frozen_with_fifteen_fields():
    from dataclasses import FrozenInstanceError, fields

    assert [f.name for f in fields(SessionSource)] == [
        "platform", "chat_id", "chat_name", "chat_type", "user_id", "user_name", "thread_id",
        "chat_topic", "user_id_alt", "chat_id_alt", "is_bot", "guild_id", "parent_chat_id",
        "message_id", "role_authorized",
    ]
    src = SessionSource(platform="telegram")
    with pytest.raises(FrozenInstanceError):
        src.chat_id = "x"  # type: ignore[misc]
    assert src.chat_type == "dm" and src.chat_id == "" and src.is_bot is False


def test_to_dict_omits_empty_and_round_trips():
    src = SessionSource(platform="slack", chat_id="C1", chat_type="channel", user_id="U1",
                        is_bot=True, guild_id="T1")
    d = src.to_dict()
    assert d == {"platform": "slack", "chat_id": "C1", "chat_type": "channel", "user_id": "U1",
                 "is_bot": True, "guild_id": "T1"}
    assert SessionSource.from_dict(d) == src
    assert SessionSource(platform="x").to_dict() == {"platform": "x", "chat_type": "dm"}


def test_from_dict_is_tolerant():
    src = SessionSource.from_dict({"platform": "telegram", "chat_id": -100123, "user_name": None,
                                   "role_authorized": 1, "scope_id": "ignored", "future": [1]})
    assert src == SessionSource(platform="telegram", chat_id="-100123", role_authorized=True)
    with pytest.raises(ValueError, match="^source.platform:"):
        SessionSource.from_dict({"chat_id": "1"})


def test_participant_id():
    assert SessionSource(platform="s", user_id="a", user_id_alt="b").participant_id == "b"
    assert SessionSource(platform="s", user_id="a").participant_id == "a"
    assert SessionSource(platform="s").participant_id == ""

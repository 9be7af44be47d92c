"""Session-key cases as data (seed 001 §4 tables, isolation flags, WhatsApp aliases).

Shared by the unit tests (sessions/test_keys.py) and gRPC-level tests, so keep it plain data:
``from helpers.key_cases import KEY_CASES``. Each case is a dict with

* ``id``: a short unique name (use it as the pytest id),
* ``source``: ``SessionSource`` fields (``platform`` always present),
* ``profile``: the profile the key is built under,
* ``flags``: ``group_sessions_per_user`` / ``thread_sessions_per_user`` (the defaults are
  ``True`` / ``False``; every case spells both out),
* ``key``: the expected session key,
* ``shared``: the expected ``is_shared_multi_user_session`` result under the same flags.
"""

DEFAULT_FLAGS = {"group_sessions_per_user": True, "thread_sessions_per_user": False}
SHARED_GROUPS = {"group_sessions_per_user": False, "thread_sessions_per_user": False}
PER_USER_THREADS = {"group_sessions_per_user": True, "thread_sessions_per_user": True}
SHARED_GROUPS_PER_USER_THREADS = {"group_sessions_per_user": False, "thread_sessions_per_user": True}


def _case(id, source, key, *, shared, flags=DEFAULT_FLAGS, profile="main"):
    return {
        "id": id, "source": source, "profile": profile, "flags": dict(flags),
        "key": key, "shared": shared,
    }


KEY_CASES = [
    # --- seed 001 §4, DM table -------------------------------------------------------
    _case("dm-chat-id", {"platform": "telegram", "chat_type": "dm", "chat_id": "12345"},
          "agent:main:telegram:dm:12345", shared=False),
    _case("dm-chat-id-thread",
          {"platform": "telegram", "chat_type": "dm", "chat_id": "12345", "thread_id": "thread_678"},
          "agent:main:telegram:dm:12345:thread_678", shared=False),
    _case("dm-participant-fallback", {"platform": "signal", "chat_type": "dm", "user_id": "user_abc"},
          "agent:main:signal:dm:user_abc", shared=False),
    _case("dm-bare", {"platform": "telegram", "chat_type": "dm"},
          "agent:main:telegram:dm", shared=False),
    _case("dm-whatsapp-canonical",
          {"platform": "whatsapp", "chat_type": "dm", "chat_id": "15551234567@s.whatsapp.net"},
          "agent:main:whatsapp:dm:+15551234567", shared=False),
    # DM details: the user id never joins a DM key that has a chat id, flags do not matter.
    _case("dm-chat-id-ignores-user",
          {"platform": "telegram", "chat_type": "dm", "chat_id": "12345", "user_id": "user_abc"},
          "agent:main:telegram:dm:12345", shared=False, flags=PER_USER_THREADS),
    _case("dm-participant-prefers-alt",
          {"platform": "signal", "chat_type": "dm", "user_id": "+15550000000", "user_id_alt": "user_abc"},
          "agent:main:signal:dm:user_abc", shared=False),
    _case("dm-empty-chat-type",
          {"platform": "telegram", "chat_type": "", "chat_id": "12345"},
          "agent:main:telegram:dm:12345", shared=False),
    _case("dm-participant-thread",
          {"platform": "signal", "chat_type": "dm", "user_id": "user_abc", "thread_id": "t1"},
          "agent:main:signal:dm:user_abc:t1", shared=False),
    # --- seed 001 §4, Group/Channel table ----------------------------------------------
    _case("group-shared", {"platform": "telegram", "chat_type": "group", "chat_id": "-10012345",
                           "user_id": "user_abc"},
          "agent:main:telegram:group:-10012345", shared=True, flags=SHARED_GROUPS),
    _case("group-no-user", {"platform": "telegram", "chat_type": "group", "chat_id": "-10012345"},
          "agent:main:telegram:group:-10012345", shared=False),
    _case("group-per-user", {"platform": "telegram", "chat_type": "group", "chat_id": "-10012345",
                             "user_id": "user_abc"},
          "agent:main:telegram:group:-10012345:user_abc", shared=False),
    _case("thread-shared", {"platform": "discord", "chat_type": "group", "chat_id": "12345",
                            "thread_id": "thread_678", "user_id": "user_abc"},
          "agent:main:discord:group:12345:thread_678", shared=True),
    _case("thread-per-user", {"platform": "discord", "chat_type": "group", "chat_id": "12345",
                              "thread_id": "thread_678", "user_id": "user_abc"},
          "agent:main:discord:group:12345:thread_678:user_abc", shared=False, flags=PER_USER_THREADS),
    _case("channel", {"platform": "slack", "chat_type": "channel", "chat_id": "C12345",
                      "user_id": "U999"},
          "agent:main:slack:channel:C12345", shared=True, flags=SHARED_GROUPS),
    _case("channel-per-user", {"platform": "slack", "chat_type": "channel", "chat_id": "C12345",
                               "user_id": "U999"},
          "agent:main:slack:channel:C12345:U999", shared=False),
    _case("whatsapp-group",
          {"platform": "whatsapp", "chat_type": "group", "chat_id": "120363012345678901@g.us",
           "user_id": "15551234567:7@s.whatsapp.net"},
          "agent:main:whatsapp:group:120363012345678901:+15551234567", shared=False),
    # --- flags the other way round ---------------------------------------------------
    _case("thread-per-user-groups-shared",
          {"platform": "discord", "chat_type": "group", "chat_id": "12345",
           "thread_id": "thread_678", "user_id": "user_abc"},
          "agent:main:discord:group:12345:thread_678:user_abc", shared=False,
          flags=SHARED_GROUPS_PER_USER_THREADS),
    _case("thread-shared-groups-shared",
          {"platform": "discord", "chat_type": "group", "chat_id": "12345",
           "thread_id": "thread_678", "user_id": "user_abc"},
          "agent:main:discord:group:12345:thread_678", shared=True, flags=SHARED_GROUPS),
    _case("group-per-user-threads-flag-irrelevant",
          {"platform": "telegram", "chat_type": "group", "chat_id": "-10012345", "user_id": "user_abc"},
          "agent:main:telegram:group:-10012345", shared=True, flags=SHARED_GROUPS_PER_USER_THREADS),
    _case("group-participant-prefers-alt",
          {"platform": "signal", "chat_type": "group", "chat_id": "grp1", "user_id": "+15550000000",
           "user_id_alt": "uuid-1"},
          "agent:main:signal:group:grp1:uuid-1", shared=False),
    # chat_type "thread" is group-like: without thread_id the group flag decides ...
    _case("thread-chat-type-no-thread-id",
          {"platform": "discord", "chat_type": "thread", "chat_id": "999", "user_id": "user_abc"},
          "agent:main:discord:thread:999:user_abc", shared=False),
    # ... with a thread_id the thread flag does.
    _case("thread-chat-type-with-thread-id",
          {"platform": "telegram", "chat_type": "thread", "chat_id": "-10012345",
           "thread_id": "42", "user_id": "user_abc"},
          "agent:main:telegram:thread:-10012345:42", shared=True),
    # ids may contain ':' (Matrix); only the leading fields must be ':'-free.
    _case("matrix-colon-ids",
          {"platform": "matrix", "chat_type": "group", "chat_id": "!room:example.org",
           "user_id": "@alice:example.org"},
          "agent:main:matrix:group:!room:example.org:@alice:example.org", shared=False),
    # --- non-default profile ----------------------------------------------------------
    _case("profile-support-dm", {"platform": "telegram", "chat_type": "dm", "chat_id": "12345"},
          "agent:support:telegram:dm:12345", shared=False, profile="support"),
    _case("profile-support-group",
          {"platform": "discord", "chat_type": "group", "chat_id": "12345",
           "thread_id": "thread_678", "user_id": "user_abc"},
          "agent:support:discord:group:12345:thread_678", shared=True, profile="support"),
]

# Every alias of one WhatsApp number must give one DM key and one group participant.
WHATSAPP_ALIASES = [
    "+15551234567",
    "15551234567",
    "+1 (555) 123-4567",
    "1-555-123-4567",
    "+1 555.123.4567",
    "0015551234567",
    "00 1 555 123 4567",
    "15551234567@s.whatsapp.net",
    "15551234567@c.us",
    "15551234567:3@s.whatsapp.net",
    "15551234567.0:3@s.whatsapp.net",
    "15551234567:3",
    " 15551234567@S.WHATSAPP.NET ",
]

for _i, _alias in enumerate(WHATSAPP_ALIASES):
    KEY_CASES.append(_case(
        f"whatsapp-dm-alias-{_i}", {"platform": "whatsapp", "chat_type": "dm", "chat_id": _alias},
        "agent:main:whatsapp:dm:+15551234567", shared=False))
    KEY_CASES.append(_case(
        f"whatsapp-dm-participant-alias-{_i}", {"platform": "whatsapp", "chat_type": "dm", "user_id": _alias},
        "agent:main:whatsapp:dm:+15551234567", shared=False))
    KEY_CASES.append(_case(
        f"whatsapp-group-participant-alias-{_i}",
        {"platform": "whatsapp", "chat_type": "group", "chat_id": "120363012345678901@g.us",
         "user_id": _alias},
        "agent:main:whatsapp:group:120363012345678901:+15551234567", shared=False))
del _i, _alias

assert len({c["id"] for c in KEY_CASES}) == len(KEY_CASES), "duplicate case id"

"""A store written by an older sidecar opens in this one: the migrations run at
startup, and what the old store held still reads the same through the API.

Migration 4 (frames and transcript rows found through the ledger) rebuilds the
frames table; what a user must not notice: an old request's frames replay in
full, and a frame cursor the old sidecar handed out is never handed out again."""

from __future__ import annotations

import time
from pathlib import Path

import apsw
import pytest
from helpers.store import query
from helpers.streams import assert_well_formed, prompt_req, run, watch
from sidecar_proc import Sidecar

from agent_sidecar.recovery import startup
from agent_sidecar.store.sqlite import schema as migrations

pytestmark = pytest.mark.sqlite_only("the SQLite schema's migrations (PostgreSQL's: test_postgres_backend.py)")

KEY = "agent:main:telegram:dm:old-chat"
SID = "sid-old"
OLD_RID = "old-request"
KINDS = ("accepted", "started", "text_delta", "usage", "completed")
BODIES = (b'{"queue_position":0}', None, b'{"text":"hi there"}',
          b'{"input_tokens":3,"output_tokens":2}', b'{"final_text":"hi there"}')


def v3_store(db: str) -> None:
    """What a sidecar at schema version 3 left behind: one session with one
    finished turn, and a later request whose frames were deleted again (so the
    frames AUTOINCREMENT counter is past the highest frame id still there)."""
    conn = apsw.Connection(db)
    conn.execute("PRAGMA journal_mode=WAL")
    migrations.applied_versions(conn)
    for version, name, sql in migrations.MIGRATIONS[:3]:
        with conn:
            conn.execute(sql)
            conn.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)", (version, name, time.time()))
    now = time.time() - 3600
    with conn:
        conn.execute("INSERT INTO routing (session_key, session_id, profile, platform, chat_type,"
                     " created_at, updated_at) VALUES (?, ?, 'main', 'telegram', 'dm', ?, ?)",
                     (KEY, SID, now, now))
        conn.execute("INSERT INTO incarnations (session_id, session_key, created_at, turn_count,"
                     " next_seq) VALUES (?, ?, ?, 1, 3)", (SID, KEY, now))
        conn.execute("INSERT INTO prompts (request_id, session_key, session_id, platform, status,"
                     " delivery, text, created_at, started_at, finished_at, last_seq)"
                     " VALUES (?, ?, ?, 'telegram', 'completed', 2, 'hi there', ?, ?, ?, 5)",
                     (OLD_RID, KEY, SID, now, now, now))
        conn.executemany("INSERT INTO messages (session_id, seq, role, content, created_at, request_id)"
                         " VALUES (?, ?, ?, 'hi there', ?, ?)",
                         [(SID, 1, "user", now, OLD_RID), (SID, 2, "assistant", now, OLD_RID)])
        conn.executemany("INSERT INTO frames (request_id, seq, session_key, session_id, platform, at,"
                         " kind, body) VALUES (?, ?, ?, ?, 'telegram', ?, ?, ?)",
                         [(OLD_RID, i + 1, KEY, SID, now, k, b) for i, (k, b) in enumerate(zip(KINDS, BODIES))]
                         + [("gone", s, KEY, SID, now, "accepted", None) for s in (1, 2, 3)])
        conn.execute("DELETE FROM frames WHERE request_id = 'gone'")
    assert conn.execute("SELECT max(id) FROM frames").fetchone()[0] == 5
    assert conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'frames'").fetchone()[0] == 8
    conn.close()
    startup.write_marker(str(Path(db).parent))  # it stopped cleanly: nothing to resume


def test_a_version_3_store_migrates_and_keeps_its_frames_and_cursors(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    v3_store(str(data / "sidecar.db"))
    with Sidecar(data).start() as sc:
        old = watch(sc.prompts(), request_id=OLD_RID)
        assert_well_formed(old)
        assert [f.cursor for f in old.frames] == [1, 2, 3, 4, 5]
        assert old.text() == "hi there"

        new = run(sc.prompts(), prompt_req(session_key=KEY, text="and again"))
        assert_well_formed(new)
        assert watch(sc.prompts(), request_id=new.frames[0].request_id).frames == new.frames
    # the frames the old sidecar deleted (ids 6-8) are never numbered again
    assert min(f.cursor for f in new.frames) == 9
    assert query(sc, "SELECT first_frame, first_seq FROM prompts WHERE request_id = ?", (OLD_RID,)) == [(1, 1)]
    assert query(sc, "SELECT version FROM schema_migrations ORDER BY version") == [(v,) for v in range(1, 7)]
    indexes = {name for (name,) in query(
        sc, "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name IN ('frames', 'messages')")}
    assert "messages_by_request" not in indexes
    assert not any(name.startswith("sqlite_autoindex_frames") for name in indexes)
    assert "frames_by_platform" in indexes and "frames_by_key" not in indexes
    # migration 5: the old frames' keys are in frame_keys, all of them below the mark
    assert query(sc, "SELECT id FROM frame_keys WHERE id <= 5 ORDER BY id") == [(i,) for i in range(1, 6)]
    assert query(sc, "SELECT value FROM meta WHERE key = 'frames_keyed'")[0][0] >= 5

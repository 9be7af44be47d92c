"""Numbered schema migrations, recorded in the database itself.

Each migration runs once, in order, inside one transaction together with its row
in ``schema_migrations``. Add new ones at the end; never edit a shipped one.

Hot columns (keys, ids, seq, timestamps, flags) are real columns with indexes that
serve every lookup and list on a request path; payloads are orjson blobs.
"""

from __future__ import annotations

import time

import apsw

from ..interface import refuse_newer_schema

MIGRATIONS: list[tuple[int, str, str]] = [
    (1, "initial schema", """
-- seed 001's sessions.json as a table: one row per conversation lane.
CREATE TABLE routing (
    session_key         TEXT PRIMARY KEY,
    session_id          TEXT NOT NULL,
    profile             TEXT NOT NULL,
    platform            TEXT NOT NULL,
    chat_type           TEXT NOT NULL,
    created_at          REAL NOT NULL,
    updated_at          REAL NOT NULL,
    origin              BLOB,
    display_name        TEXT NOT NULL DEFAULT '',
    input_tokens        INTEGER NOT NULL DEFAULT 0,
    output_tokens       INTEGER NOT NULL DEFAULT 0,
    cache_read_tokens   INTEGER NOT NULL DEFAULT 0,
    cache_write_tokens  INTEGER NOT NULL DEFAULT 0,
    total_tokens        INTEGER NOT NULL DEFAULT 0,
    estimated_cost_usd  REAL NOT NULL DEFAULT 0,
    cost_status         TEXT NOT NULL DEFAULT 'unknown',
    last_prompt_tokens  INTEGER NOT NULL DEFAULT 0,
    was_auto_reset      INTEGER NOT NULL DEFAULT 0,
    auto_reset_reason   TEXT NOT NULL DEFAULT '',
    reset_had_activity  INTEGER NOT NULL DEFAULT 0,
    is_fresh_reset      INTEGER NOT NULL DEFAULT 0,
    expiry_finalized    INTEGER NOT NULL DEFAULT 0,
    suspended           INTEGER NOT NULL DEFAULT 0,
    resume_pending      INTEGER NOT NULL DEFAULT 0,
    resume_reason       TEXT NOT NULL DEFAULT '',
    last_resume_marked_at REAL,
    running             INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX routing_by_updated ON routing (updated_at DESC, session_key);
CREATE INDEX routing_by_platform ON routing (platform, updated_at DESC, session_key);
CREATE INDEX routing_resume_pending ON routing (updated_at) WHERE resume_pending = 1;
CREATE INDEX routing_running ON routing (session_key) WHERE running = 1;
CREATE INDEX routing_by_session_id ON routing (session_id);

-- Every incarnation (session_id) a key ever had; seed 000's session row.
CREATE TABLE incarnations (
    session_id   TEXT PRIMARY KEY,
    session_key  TEXT NOT NULL,
    created_at   REAL NOT NULL,
    ended_at     REAL,
    end_reason   TEXT,
    turn_count   INTEGER NOT NULL DEFAULT 0,
    next_seq     INTEGER NOT NULL DEFAULT 1,
    -- bumped whenever live rows are hidden (rewind, rewrite, rollback), so a
    -- worker's cached transcript knows it no longer matches the store
    rev          INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX incarnations_by_key ON incarnations (session_key, created_at);

-- Append-only transcripts; rewind/rewrite/rollback clear `active`, never delete.
CREATE TABLE messages (
    id          INTEGER PRIMARY KEY,
    session_id  TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    role        TEXT NOT NULL,
    content     TEXT NOT NULL,
    extra       BLOB,
    created_at  REAL NOT NULL,
    active      INTEGER NOT NULL DEFAULT 1,
    hidden_by   TEXT,
    request_id  TEXT,
    UNIQUE (session_id, seq)
);
CREATE INDEX messages_by_request ON messages (request_id) WHERE request_id IS NOT NULL;

-- Per-turn state snapshot (seed 000), overwritten every turn.
CREATE TABLE turn_state (
    session_id  TEXT PRIMARY KEY,
    request_id  TEXT NOT NULL,
    updated_at  REAL NOT NULL,
    state       BLOB NOT NULL
);

-- The prompt ledger: one row per request id, for dedup and recovery.
CREATE TABLE prompts (
    request_id   TEXT PRIMARY KEY,
    session_key  TEXT NOT NULL,
    session_id   TEXT NOT NULL,
    platform     TEXT NOT NULL,
    status       TEXT NOT NULL,
    delivery     INTEGER NOT NULL,
    text         TEXT NOT NULL,
    payload      BLOB,
    created_at   REAL NOT NULL,
    started_at   REAL,
    finished_at  REAL,
    reason       TEXT,
    last_seq     INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX prompts_by_created ON prompts (created_at);
CREATE INDEX prompts_open ON prompts (session_key, created_at) WHERE status IN ('queued', 'running');

-- Prompts waiting for their session: the single follow-up slot and the FIFO.
CREATE TABLE prompt_queue (
    request_id   TEXT PRIMARY KEY,
    session_key  TEXT NOT NULL,
    slot         TEXT NOT NULL CHECK (slot IN ('pending', 'fifo')),
    position     INTEGER NOT NULL,
    enqueued_at  REAL NOT NULL
);
CREATE INDEX prompt_queue_by_key ON prompt_queue (session_key, slot, position);

-- Activity frames; id is the global cursor, seq is per request. AUTOINCREMENT:
-- a cursor handed to a client must never be handed out again, even after the
-- newest frames are deleted (DeleteSession, ClearAll).
CREATE TABLE frames (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    request_id   TEXT NOT NULL,
    seq          INTEGER NOT NULL,
    session_key  TEXT NOT NULL,
    session_id   TEXT NOT NULL,
    platform     TEXT NOT NULL,
    at           REAL NOT NULL,
    kind         TEXT NOT NULL,
    body         BLOB,
    UNIQUE (request_id, seq)
);
CREATE INDEX frames_by_key ON frames (session_key, id);
CREATE INDEX frames_by_platform ON frames (platform, id);

-- Stuck-loop detection: consecutive restarts with the session in flight.
CREATE TABLE restart_counts (
    session_key  TEXT PRIMARY KEY,
    count        INTEGER NOT NULL,
    updated_at   REAL NOT NULL
);

CREATE TABLE meta (
    key    TEXT PRIMARY KEY,
    value  BLOB
);
"""),
    (2, "message full-text index", """
-- A derived index: dropped and rebuilt by `agent-sidecar doctor --rebuild-fts`.
CREATE VIRTUAL TABLE messages_fts USING fts5 (
    content, content='messages', content_rowid='id', tokenize='unicode61'
);
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts (rowid, content) VALUES (new.id, new.content);
END;
CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts (messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
END;
"""),
    (3, "deferred full-text indexing", """
-- Messages are indexed in batches (sessions/transcripts.py: index_pending), not
-- by a trigger per row: meta.fts_indexed_id is the last message id indexed.
-- Every message id up to it is in the index, none above it.
DROP TRIGGER messages_fts_insert;
DROP TRIGGER messages_fts_delete;
CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages
WHEN old.id <= coalesce((SELECT value FROM meta WHERE key = 'fts_indexed_id'), 0) BEGIN
    INSERT INTO messages_fts (messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
END;
INSERT INTO meta (key, value) VALUES ('fts_indexed_id', (SELECT coalesce(max(id), 0) FROM messages))
    ON CONFLICT (key) DO UPDATE SET value = excluded.value;
"""),
    (4, "frames and transcript rows found through the ledger", """
-- A request id is random, so an index keyed on it costs a random b-tree page per
-- turn in every commit that touches the turn. The ledger row now records where
-- its frames start (first_frame: the accepted frame's id) and where its transcript
-- rows start (first_seq), and a request's frames and messages are found through
-- frames_by_key and UNIQUE (session_id, seq) from there.
ALTER TABLE prompts ADD COLUMN first_frame INTEGER;
ALTER TABLE prompts ADD COLUMN first_seq INTEGER;
UPDATE prompts SET
    first_frame = (SELECT min(id) FROM frames WHERE frames.request_id = prompts.request_id),
    first_seq = (SELECT min(seq) FROM messages WHERE messages.request_id = prompts.request_id
                 AND messages.session_id = prompts.session_id);
DROP INDEX messages_by_request;
-- frames without UNIQUE (request_id, seq): seq is handed out by the one process
-- that owns the turn, gapless per request.
CREATE TABLE frames_v4 (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    request_id   TEXT NOT NULL,
    seq          INTEGER NOT NULL,
    session_key  TEXT NOT NULL,
    session_id   TEXT NOT NULL,
    platform     TEXT NOT NULL,
    at           REAL NOT NULL,
    kind         TEXT NOT NULL,
    body         BLOB
);
INSERT INTO frames_v4 (id, request_id, seq, session_key, session_id, platform, at, kind, body)
    SELECT id, request_id, seq, session_key, session_id, platform, at, kind, body FROM frames;
-- The cursor high-water mark carries over: a cursor once handed out is never reused.
DELETE FROM sqlite_sequence WHERE name = 'frames_v4';
INSERT INTO sqlite_sequence (name, seq) SELECT 'frames_v4', seq FROM sqlite_sequence WHERE name = 'frames';
DROP TABLE frames;
ALTER TABLE frames_v4 RENAME TO frames;
CREATE INDEX frames_by_key ON frames (session_key, id);
CREATE INDEX frames_by_platform ON frames (platform, id);
"""),
    (5, "frame keys indexed in batches", """
-- frames_by_key took a random b-tree page per streamed frame in every commit
-- (the sessions' streams interleave): frame_keys holds the same pairs, filled in
-- batches sorted by key, with the highest id indexed in meta (frame_keys.py).
CREATE TABLE frame_keys (
    id           INTEGER PRIMARY KEY,
    session_key  TEXT NOT NULL
);
INSERT INTO frame_keys (id, session_key) SELECT id, session_key FROM frames ORDER BY id;
CREATE INDEX frame_keys_by_key ON frame_keys (session_key, id);
INSERT INTO meta (key, value) VALUES ('frames_keyed', (SELECT coalesce(max(id), 0) FROM frames))
    ON CONFLICT (key) DO UPDATE SET value = excluded.value;
DROP INDEX frames_by_key;
"""),
    (6, "frame cursors start at 2", """
-- A stream ended for not reading (STREAM_TOO_SLOW) names its resume point, the
-- cursor before the first frame it was due, and after_cursor = 0 means "live
-- only": so no frame is cursor 1. A store that wrote frames already is past it.
INSERT INTO sqlite_sequence (name, seq) SELECT 'frames', 1
    WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'frames');
"""),
]

# What `doctor --rebuild-fts` recreates (then it indexes every message).
FTS_SCHEMA = """
CREATE VIRTUAL TABLE messages_fts USING fts5 (
    content, content='messages', content_rowid='id', tokenize='unicode61'
);
CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages
WHEN old.id <= coalesce((SELECT value FROM meta WHERE key = 'fts_indexed_id'), 0) BEGIN
    INSERT INTO messages_fts (messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
END;
INSERT INTO meta (key, value) VALUES ('fts_indexed_id', 0)
    ON CONFLICT (key) DO UPDATE SET value = excluded.value;
"""


def applied_versions(conn: apsw.Connection) -> set[int]:
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations ("
        " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
    )
    return {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}


def migrate(conn: apsw.Connection) -> list[int]:
    """Apply every migration not yet recorded; returns the versions applied now.
    A store with migrations this release lacks raises StoreOpenError."""
    done = applied_versions(conn)
    refuse_newer_schema(done, [v for v, _, _ in MIGRATIONS])
    applied = []
    for version, name, sql in MIGRATIONS:
        if version in done:
            continue
        with conn:
            conn.execute(sql)
            conn.execute(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                (version, name, time.time()),
            )
        applied.append(version)
    return applied

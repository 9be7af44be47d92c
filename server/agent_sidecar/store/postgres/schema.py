"""The PostgreSQL schema: numbered migrations recorded in the database itself.

Each migration runs once, in order, in one transaction with its row in
``schema_migrations``, under an advisory lock: several sidecars starting at
once on one database migrate it exactly once. Add new ones at the end; never
edit a shipped one.

The tables are the SQLite backend's (store/sqlite/schema.py), in PostgreSQL's
types: times are ``double precision`` seconds since the epoch (the records'
unit on every backend), flags ``boolean``, payloads ``jsonb``, request ids
``COLLATE "C"`` (byte order, as SQLite's: a prefix of ids is an index range
whatever the database's locale). Every lookup
and list on a request path has its index. Full-text search is a generated
``tsvector`` column with a GIN index (the ``simple`` configuration: no
stemming, so every language's words match as typed), of the text with its
punctuation as spaces (``search_text``, migration 3: the words SQLite's
tokenizer makes); ``doctor --rebuild-fts``
rebuilds the index. Cluster tables: ``leases`` (one row per lane: owner node,
epoch, expiry on the database's clock) and ``nodes`` (each sidecar's advertised
address, heartbeat, clean-stop marker).
"""

from __future__ import annotations

import time

from ..interface import refuse_newer_schema

MIGRATION_LOCK = 0x5AD3_CA12  # pg_advisory_xact_lock key serialising migrations

MIGRATIONS: list[tuple[int, str, str]] = [
    (1, "initial schema", """
CREATE TABLE routing (
    session_key           text PRIMARY KEY,
    session_id            text NOT NULL,
    profile               text NOT NULL,
    platform              text NOT NULL,
    chat_type             text NOT NULL,
    created_at            double precision NOT NULL,
    updated_at            double precision NOT NULL,
    origin                jsonb,
    display_name          text NOT NULL DEFAULT '',
    input_tokens          bigint NOT NULL DEFAULT 0,
    output_tokens         bigint NOT NULL DEFAULT 0,
    cache_read_tokens     bigint NOT NULL DEFAULT 0,
    cache_write_tokens    bigint NOT NULL DEFAULT 0,
    total_tokens          bigint NOT NULL DEFAULT 0,
    estimated_cost_usd    double precision NOT NULL DEFAULT 0,
    cost_status           text NOT NULL DEFAULT 'unknown',
    last_prompt_tokens    bigint NOT NULL DEFAULT 0,
    was_auto_reset        boolean NOT NULL DEFAULT false,
    auto_reset_reason     text NOT NULL DEFAULT '',
    reset_had_activity    boolean NOT NULL DEFAULT false,
    is_fresh_reset        boolean NOT NULL DEFAULT false,
    expiry_finalized      boolean NOT NULL DEFAULT false,
    suspended             boolean NOT NULL DEFAULT false,
    resume_pending        boolean NOT NULL DEFAULT false,
    resume_reason         text NOT NULL DEFAULT '',
    last_resume_marked_at double precision,
    running               boolean NOT NULL DEFAULT false
);
CREATE INDEX routing_by_updated ON routing (updated_at DESC, session_key);
CREATE INDEX routing_by_platform ON routing (platform, updated_at DESC, session_key);
CREATE INDEX routing_resume_pending ON routing (updated_at) WHERE resume_pending;
CREATE INDEX routing_running ON routing (session_key) WHERE running;
CREATE INDEX routing_by_session_id ON routing (session_id);

CREATE TABLE incarnations (
    session_id   text PRIMARY KEY,
    session_key  text NOT NULL,
    created_at   double precision NOT NULL,
    ended_at     double precision,
    end_reason   text,
    turn_count   bigint NOT NULL DEFAULT 0,
    next_seq     bigint NOT NULL DEFAULT 1,
    rev          bigint NOT NULL DEFAULT 0
);
CREATE INDEX incarnations_by_key ON incarnations (session_key, created_at);

CREATE TABLE messages (
    id           bigserial PRIMARY KEY,
    session_id   text NOT NULL,
    seq          bigint NOT NULL,
    role         text NOT NULL,
    content      text NOT NULL,
    extra        jsonb,
    created_at   double precision NOT NULL,
    active       boolean NOT NULL DEFAULT true,
    hidden_by    text,
    request_id   text COLLATE "C",
    content_tsv  tsvector GENERATED ALWAYS AS (to_tsvector('simple', content)) STORED,
    UNIQUE (session_id, seq)
);
CREATE INDEX messages_fts ON messages USING gin (content_tsv);  -- FTS_INDEX

CREATE TABLE turn_state (
    session_id  text PRIMARY KEY,
    request_id  text COLLATE "C" NOT NULL,
    updated_at  double precision NOT NULL,
    state       jsonb NOT NULL
);

CREATE TABLE prompts (
    request_id   text COLLATE "C" PRIMARY KEY,
    session_key  text NOT NULL,
    session_id   text NOT NULL,
    platform     text NOT NULL,
    status       text NOT NULL,
    delivery     integer NOT NULL,
    text         text NOT NULL,
    payload      jsonb,
    created_at   double precision NOT NULL,
    started_at   double precision,
    finished_at  double precision,
    reason       text,
    last_seq     bigint NOT NULL DEFAULT 0,
    first_frame  bigint,
    first_seq    bigint
);
CREATE INDEX prompts_by_created ON prompts (created_at);
CREATE INDEX prompts_open ON prompts (session_key, created_at) WHERE status IN ('queued', 'running');
CREATE INDEX prompts_by_key ON prompts (session_key);

CREATE TABLE prompt_queue (
    request_id   text COLLATE "C" PRIMARY KEY,
    session_key  text NOT NULL,
    slot         text NOT NULL CHECK (slot IN ('pending', 'fifo')),
    position     bigint NOT NULL,
    enqueued_at  double precision NOT NULL
);
CREATE INDEX prompt_queue_by_key ON prompt_queue (session_key, slot, position);

-- id is the global cursor: a sequence never hands a value out twice, and every
-- frame insert takes the frames lock first (store/postgres/ledger.py), so ids
-- grow with commit order across every sidecar of the cluster.
CREATE TABLE frames (
    id           bigserial PRIMARY KEY,
    request_id   text COLLATE "C" NOT NULL,
    seq          bigint NOT NULL,
    session_key  text NOT NULL,
    session_id   text NOT NULL,
    platform     text NOT NULL,
    at           double precision NOT NULL,
    kind         text NOT NULL,
    body         jsonb
);
CREATE INDEX frames_by_key ON frames (session_key, id);
CREATE INDEX frames_by_platform ON frames (platform, id);

CREATE TABLE restart_counts (
    session_key  text PRIMARY KEY,
    count        bigint NOT NULL,
    updated_at   double precision NOT NULL
);

CREATE TABLE meta (
    key    text PRIMARY KEY,
    value  jsonb
);

-- Cluster: at most one sidecar runs a lane's turns at a time. ``epoch`` grows
-- with every change of holder; a write of a turn is refused unless the row
-- still names its node and epoch (the fence). Times on the database's clock.
CREATE TABLE leases (
    session_key  text PRIMARY KEY,
    node_id      text NOT NULL,
    epoch        bigint NOT NULL,
    expires_at   timestamptz NOT NULL,
    address      text NOT NULL DEFAULT '',
    released     boolean NOT NULL DEFAULT false  -- let go by its node (not run out)
);
CREATE INDEX leases_by_node ON leases (node_id);

CREATE TABLE nodes (
    node_id       text PRIMARY KEY,
    address       text NOT NULL DEFAULT '',
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now(),
    clean_stop    boolean NOT NULL DEFAULT false
);
"""),
    (2, "frame cursors start at 2", """
-- A stream ended for not reading (STREAM_TOO_SLOW) names its resume point, the
-- cursor before the first frame it was due, and after_cursor = 0 means "live
-- only": so no frame is cursor 1. A store that wrote frames already is past it.
SELECT setval('frames_id_seq', 1) WHERE NOT (SELECT is_called FROM frames_id_seq);
"""),
    (3, "full-text index reads words as SQLite's does", r"""
-- What the full-text index reads of a message: its text with ASCII punctuation,
-- the escapes of NUL and of the escape mark (codec.py) and the two marks of
-- search snippets (reads.py) as spaces, one for one (a position in it is the
-- same position in the text). The index then holds the words SQLite's FTS5
-- tokenizer makes, letters and digits between separators: the parser's URL,
-- e-mail, host, dotted-number and hyphenated tokens made "github" unfindable
-- in "https://github.com", "bob" in "bob@example.com", "world" after a NUL.
-- (regexp_replace: translate reads its list of characters again for each
-- character of the text, which made a long message's insert slow.)
CREATE OR REPLACE FUNCTION search_text(content text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
SELECT regexp_replace(replace(replace(content, E'\uFFFF\uFFFF', '  '), E'\uFFFF0', '  '),
                      E'[!-/:-@[-`{-~\uFDD0\uFDD1]', ' ', 'g')
$$;
ALTER TABLE messages DROP COLUMN IF EXISTS content_tsv;  -- its index with it
ALTER TABLE messages ADD COLUMN content_tsv tsvector
    GENERATED ALWAYS AS (to_tsvector('simple', search_text(content))) STORED;
CREATE INDEX messages_fts ON messages USING gin (content_tsv);  -- FTS_INDEX
"""),
]

# The derived full-text index (maintenance.py rebuilds it).
FTS_INDEX = "CREATE INDEX messages_fts ON messages USING gin (content_tsv)"


def migrate(conn) -> list[int]:
    """Apply every migration not yet recorded (``conn``: a psycopg connection,
    not in a transaction); returns the versions applied now. A database with
    migrations this release lacks raises StoreOpenError.

    A database already migrated needs no right to create anything: a role
    with only the rights to read and write the tables (the schema migrated
    by its owner) starts. ``CREATE TABLE IF NOT EXISTS`` of the migrations'
    own table is refused such a role even when the table exists ("permission
    denied for schema public"), so it is only created when missing."""
    applied: list[int] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        if conn.execute("SELECT to_regclass('schema_migrations')").fetchone() == (None,):
            conn.execute("CREATE TABLE schema_migrations ("
                         " version integer PRIMARY KEY, name text NOT NULL, applied_at double precision NOT NULL)")
        done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
        refuse_newer_schema(done, [v for v, _, _ in MIGRATIONS])
        for version, name, sql in MIGRATIONS:
            if version in done:
                continue
            conn.execute(sql)
            conn.execute("INSERT INTO schema_migrations (version, name, applied_at) VALUES (%s, %s, %s)",
                         (version, name, time.time()))
            applied.append(version)
    return applied

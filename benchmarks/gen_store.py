"""Build a large data dir the way a crash would leave it, for the restart benchmark.

    python benchmarks/gen_store.py DIR --sessions 100000 --frames 1000000

The schema is the server's own (``agent_sidecar.store.sqlite.schema.migrate`` on a
fresh file); rows are bulk-inserted with apsw in big transactions and the
full-text index is built once at the end. What a crash
leaves behind is included: lanes with ``running = 1`` and an open ``running``
ledger row (some with a dangling tool call), lanes active within the last two
minutes (which startup marks ``resume_pending``), lanes already
``resume_pending`` (fresh and stale), queued prompts (FIFO and follow-up slot),
``restart_counts`` rows — and no ``.clean_shutdown`` marker. Most history is old
(up to 30 days; a slice older than the 7-day retention).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import time
from pathlib import Path

import _common  # noqa: F401  (import path to the in-tree server)
import apsw
import orjson

from agent_sidecar.store.sqlite import frame_keys
from agent_sidecar.store.sqlite.messages import SqliteMessages
from agent_sidecar.store.sqlite.schema import migrate

PLATFORMS = ("telegram", "discord", "slack", "whatsapp")
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
         "november oscar papa quebec romeo sierra tango uniform victor whiskey xray").split()
BATCH = 50_000
FRAMES_PER_REQUEST = 8  # accepted, started, text x4, usage, completed


def sentence(rng: random.Random, n: int = 8) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def batched(conn: apsw.Connection, sql: str, rows, size: int = BATCH) -> int:
    buf, n = [], 0
    for r in rows:
        buf.append(r)
        if len(buf) >= size:
            with conn:
                conn.executemany(sql, buf)
            n += len(buf)
            buf.clear()
    if buf:
        with conn:
            conn.executemany(sql, buf)
        n += len(buf)
    return n


def generate(out: Path, sessions: int, frames: int, running: int, recent: int, pending: int,
             queued: int, msgs_per_session: int, seed: int) -> dict:
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    db = out / "sidecar.db"
    for p in (db, Path(str(db) + "-wal"), Path(str(db) + "-shm"), out / ".clean_shutdown"):
        if p.exists():
            p.unlink()
    conn = apsw.Connection(str(db))
    conn.execute("PRAGMA journal_mode=OFF")
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("PRAGMA cache_size=-262144")
    migrate(conn)  # the full-text index is filled once at the end (no trigger fills it)

    now = time.time()
    month = 30 * 86400
    keys, sids, plats, upd = [], [], [], []
    for i in range(sessions):
        plat = PLATFORMS[i % len(PLATFORMS)]
        keys.append(f"agent:main:{plat}:dm:gen{i}")
        sids.append(f"20260101_000000_{i:08x}")
        plats.append(plat)
        upd.append(now - rng.uniform(300, month))
    # the crash state, on disjoint slices of sessions
    idx = list(range(sessions))
    rng.shuffle(idx)
    run_set = idx[:running]
    recent_set = idx[running:running + recent]
    pend_fresh = idx[running + recent:running + recent + pending // 2]
    pend_stale = idx[running + recent + pending // 2:running + recent + pending]
    queue_set = idx[running + recent + pending:running + recent + pending + queued]
    for i in run_set + recent_set:
        upd[i] = now - rng.uniform(1, 110)
    for i in pend_fresh:
        upd[i] = now - rng.uniform(130, 3000)
    for i in pend_stale:
        upd[i] = now - rng.uniform(4000, 86400)
    for i in queue_set:
        upd[i] = now - rng.uniform(1, 100)
    runs = set(run_set)
    pend = {i: "shutdown_timeout" for i in pend_fresh} | {i: "restart_interrupted" for i in pend_stale}
    origin = orjson.dumps({"platform": "telegram", "chat_id": "x"})
    queue_set_s = set(queue_set)

    def routing_rows():
        for i in range(sessions):
            yield (keys[i], sids[i], "main", plats[i], "dm", upd[i] - 86400, upd[i], origin,
                   1 if i in pend else 0, pend.get(i, ""), upd[i] if i in pend else None,
                   1 if i in runs or i in queue_set_s else 0)
    t0 = time.monotonic()
    counts = {"routing": batched(conn, "INSERT INTO routing (session_key, session_id, profile, platform,"
                                 " chat_type, created_at, updated_at, origin, resume_pending, resume_reason,"
                                 " last_resume_marked_at, running) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                                 routing_rows())}
    counts["incarnations"] = batched(conn, "INSERT INTO incarnations (session_id, session_key, created_at,"
                                     " turn_count, next_seq) VALUES (?,?,?,?,?)",
                                     ((sids[i], keys[i], upd[i] - 86400, msgs_per_session // 2,
                                       msgs_per_session + 1) for i in range(sessions)))

    # Completed history: requests spread over sessions, time-ordered, ~8 frames each.
    n_req = max(1, frames // FRAMES_PER_REQUEST)
    req_times = sorted(now - rng.uniform(200, month) for _ in range(n_req))
    req_sess = [rng.randrange(sessions) for _ in range(n_req)]

    def prompt_rows():
        for r in range(n_req):
            i, t = req_sess[r], req_times[r]
            yield (f"h{r}", keys[i], sids[i], plats[i], "completed", 2, sentence(rng, 6), None, t,
                   t + 0.01, t + 0.5, None, FRAMES_PER_REQUEST, r * FRAMES_PER_REQUEST + 1)
    # first_frame: the frames below go in request by request into an empty table
    counts["prompts"] = batched(conn, "INSERT INTO prompts (request_id, session_key, session_id, platform,"
                                " status, delivery, text, payload, created_at, started_at, finished_at,"
                                " reason, last_seq, first_frame) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                                prompt_rows())
    kinds = ("accepted", "started", "text_delta", "text_delta", "text_delta", "text_delta", "usage",
             "completed")
    body = orjson.dumps({"text": "word "})

    def frame_rows():
        for r in range(n_req):
            i, t = req_sess[r], req_times[r]
            for s, k in enumerate(kinds, 1):
                yield (f"h{r}", s, keys[i], sids[i], plats[i], t + s * 0.01, k, body)
    counts["frames"] = batched(conn, "INSERT INTO frames (request_id, seq, session_key, session_id,"
                               " platform, at, kind, body) VALUES (?,?,?,?,?,?,?,?)", frame_rows())

    def message_rows():
        for i in range(sessions):
            for s in range(1, msgs_per_session + 1):
                yield (sids[i], s, "user" if s % 2 else "assistant", sentence(rng), None,
                       upd[i] - (msgs_per_session - s), None)
    counts["messages"] = batched(conn, "INSERT INTO messages (session_id, seq, role, content, extra,"
                                 " created_at, request_id) VALUES (?,?,?,?,?,?,?)", message_rows())

    # What the crash interrupted: running turns (every 3rd with a dangling tool call)
    # and queued prompts, with their frames after all the history.
    with conn:
        for n, i in enumerate(run_set):
            rid, t = f"live{n}", upd[i]
            conn.execute("INSERT INTO prompts (request_id, session_key, session_id, platform, status,"
                         " delivery, text, payload, created_at, started_at) VALUES (?,?,?,?,'running',2,?,?,?,?)",
                         (rid, keys[i], sids[i], plats[i], "do something", orjson.dumps({"profile": "main"}), t, t))
            seq = msgs_per_session + 1
            conn.execute("INSERT INTO messages (session_id, seq, role, content, created_at, request_id)"
                         " VALUES (?,?,'user','do something',?,?)", (sids[i], seq, t, rid))
            if n % 3 == 0:
                calls = orjson.dumps([{"id": f"call{n}", "type": "function",
                                       "function": {"name": "test.wait", "arguments": "{}"}}]).decode()
                conn.execute("INSERT INTO messages (session_id, seq, role, content, extra, created_at,"
                             " request_id) VALUES (?,?,'assistant','',?,?,?)",
                             (sids[i], seq + 1, orjson.dumps({"tool_calls_json": calls}), t, rid))
            conn.execute("UPDATE incarnations SET next_seq = ? WHERE session_id = ?",
                         (seq + (2 if n % 3 == 0 else 1), sids[i]))
            for s, k in enumerate(("accepted", "started", "text_delta"), 1):
                conn.execute("INSERT INTO frames (request_id, seq, session_key, session_id, platform, at,"
                             " kind, body) VALUES (?,?,?,?,?,?,?,?)", (rid, s, keys[i], sids[i], plats[i], t, k, body))
            conn.execute("UPDATE prompts SET first_frame = ?, first_seq = ? WHERE request_id = ?",
                         (conn.last_insert_rowid() - 2, seq, rid))
            if n % 2 == 0:
                conn.execute("INSERT INTO restart_counts (session_key, count, updated_at) VALUES (?,?,?)",
                             (keys[i], 1 + n % 3, t))
        q = 0
        for i in queue_set:
            for pos in range(1, 3):
                rid, t = f"queued{q}", upd[i] + pos
                q += 1
                slot = "pending" if pos == 1 and q % 4 == 0 else "fifo"
                conn.execute("INSERT INTO prompts (request_id, session_key, session_id, platform, status,"
                             " delivery, text, payload, created_at) VALUES (?,?,?,?,'queued',3,?,?,?)",
                             (rid, keys[i], sids[i], plats[i], f"queued {pos}", orjson.dumps({"profile": "main"}), t))
                conn.execute("INSERT INTO prompt_queue (request_id, session_key, slot, position, enqueued_at)"
                             " VALUES (?,?,?,?,?)", (rid, keys[i], slot, pos, t))
                conn.execute("INSERT INTO frames (request_id, seq, session_key, session_id, platform, at, kind,"
                             " body) VALUES (?,1,?,?,?,?,'accepted',?)", (rid, keys[i], sids[i], plats[i], t,
                                                                       orjson.dumps({"queue_position": pos})))
                conn.execute("UPDATE prompts SET first_frame = ? WHERE request_id = ?",
                             (conn.last_insert_rowid(), rid))
    counts["queued"] = q
    with conn:  # the derived index, once, from the canonical rows
        conn.execute("INSERT INTO messages_fts (messages_fts) VALUES ('rebuild')")
        SqliteMessages(conn).set_index_mark(conn.execute("SELECT coalesce(max(id), 0) FROM messages").fetchone()[0])
        frame_keys.index_pending(conn)  # as the writer's passes would have left it
    with conn:  # lets the benchmark shift activity times to "just now" on each copy
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('gen_store_at', ?)", (str(now),))
    conn.execute("PRAGMA journal_mode=WAL")
    conn.close()
    counts.update(running=len(run_set), recent=len(recent_set), resume_pending=len(pend),
                  seconds=round(time.monotonic() - t0, 1),
                  mb=round(os.path.getsize(db) / 1e6, 1))
    return counts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", type=Path)
    p.add_argument("--sessions", type=int, default=100_000)
    p.add_argument("--frames", type=int, default=1_000_000)
    p.add_argument("--running", type=int, default=200, help="lanes in flight at the crash")
    p.add_argument("--recent", type=int, default=300, help="idle lanes active in the last 2 minutes")
    p.add_argument("--pending", type=int, default=200, help="lanes already resume_pending (half fresh)")
    p.add_argument("--queued", type=int, default=100, help="lanes with 2 queued prompts each")
    p.add_argument("--messages-per-session", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--force", action="store_true", help="replace DIR's store if there is one")
    a = p.parse_args(argv)
    if (a.dir / "sidecar.db").exists() and not a.force:
        print(f"{a.dir}/sidecar.db exists (use --force)", file=sys.stderr)
        return 1
    if a.force and a.dir.exists():
        shutil.rmtree(a.dir)
    counts = generate(a.dir, a.sessions, a.frames, a.running, a.recent, a.pending, a.queued,
                      a.messages_per_session, a.seed)
    print(" ".join(f"{k}={v:,}" if isinstance(v, int) else f"{k}={v}" for k, v in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

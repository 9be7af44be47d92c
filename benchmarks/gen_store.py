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
from dataclasses import dataclass
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


@dataclass
class Layout:
    """Every session's key, id, platform and last activity, and the disjoint
    slices of sessions that carry the crash state."""
    keys: list[str]
    sids: list[str]
    plats: list[str]
    upd: list[float]
    running: list[int]
    recent: list[int]
    queued: list[int]
    pend: dict[int, str]  # session index -> resume reason


def _layout(rng: random.Random, sessions: int, running: int, recent: int, pending: int, queued: int,
            now: float) -> Layout:
    month = 30 * 86400
    L = Layout([], [], [], [], [], [], [], {})
    for i in range(sessions):
        plat = PLATFORMS[i % len(PLATFORMS)]
        L.keys.append(f"agent:main:{plat}:dm:gen{i}")
        L.sids.append(f"20260101_000000_{i:08x}")
        L.plats.append(plat)
        L.upd.append(now - rng.uniform(300, month))
    idx = list(range(sessions))
    rng.shuffle(idx)
    L.running = idx[:running]
    L.recent = idx[running:running + recent]
    pend_fresh = idx[running + recent:running + recent + pending // 2]
    pend_stale = idx[running + recent + pending // 2:running + recent + pending]
    L.queued = idx[running + recent + pending:running + recent + pending + queued]
    for i in L.running + L.recent:
        L.upd[i] = now - rng.uniform(1, 110)
    for i in pend_fresh:
        L.upd[i] = now - rng.uniform(130, 3000)
    for i in pend_stale:
        L.upd[i] = now - rng.uniform(4000, 86400)
    for i in L.queued:
        L.upd[i] = now - rng.uniform(1, 100)
    L.pend = {i: "shutdown_timeout" for i in pend_fresh} | {i: "restart_interrupted" for i in pend_stale}
    return L


def _sessions(conn: apsw.Connection, L: Layout, msgs_per_session: int) -> dict:
    runs, queued = set(L.running), set(L.queued)
    origin = orjson.dumps({"platform": "telegram", "chat_id": "x"})
    rows = ((L.keys[i], L.sids[i], "main", L.plats[i], "dm", L.upd[i] - 86400, L.upd[i], origin,
             1 if i in L.pend else 0, L.pend.get(i, ""), L.upd[i] if i in L.pend else None,
             1 if i in runs or i in queued else 0) for i in range(len(L.keys)))
    counts = {"routing": batched(conn, "INSERT INTO routing (session_key, session_id, profile, platform,"
                                 " chat_type, created_at, updated_at, origin, resume_pending, resume_reason,"
                                 " last_resume_marked_at, running) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", rows)}
    counts["incarnations"] = batched(conn, "INSERT INTO incarnations (session_id, session_key, created_at,"
                                     " turn_count, next_seq) VALUES (?,?,?,?,?)",
                                     ((L.sids[i], L.keys[i], L.upd[i] - 86400, msgs_per_session // 2,
                                       msgs_per_session + 1) for i in range(len(L.keys))))
    return counts


def _history(conn: apsw.Connection, rng: random.Random, L: Layout, frames: int, msgs_per_session: int,
             now: float) -> dict:
    """Completed requests spread over sessions, time-ordered, ~8 frames each,
    and every session's transcript."""
    n_req = max(1, frames // FRAMES_PER_REQUEST)
    req_times = sorted(now - rng.uniform(200, 30 * 86400) for _ in range(n_req))
    req_sess = [rng.randrange(len(L.keys)) for _ in range(n_req)]
    # first_frame: the frames below go in request by request into an empty table
    prompts = ((f"h{r}", L.keys[i], L.sids[i], L.plats[i], "completed", 2, sentence(rng, 6), None, t,
                t + 0.01, t + 0.5, None, FRAMES_PER_REQUEST, r * FRAMES_PER_REQUEST + 1)
               for r, (i, t) in enumerate(zip(req_sess, req_times)))
    counts = {"prompts": batched(conn, "INSERT INTO prompts (request_id, session_key, session_id, platform,"
                                 " status, delivery, text, payload, created_at, started_at, finished_at,"
                                 " reason, last_seq, first_frame) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                                 prompts)}
    kinds = ("accepted", "started", "text_delta", "text_delta", "text_delta", "text_delta", "usage",
             "completed")
    body = orjson.dumps({"text": "word "})
    frame_rows = ((f"h{r}", s, L.keys[i], L.sids[i], L.plats[i], t + s * 0.01, k, body)
                  for r, (i, t) in enumerate(zip(req_sess, req_times)) for s, k in enumerate(kinds, 1))
    counts["frames"] = batched(conn, "INSERT INTO frames (request_id, seq, session_key, session_id,"
                               " platform, at, kind, body) VALUES (?,?,?,?,?,?,?,?)", frame_rows)
    messages = ((L.sids[i], s, "user" if s % 2 else "assistant", sentence(rng), None,
                 L.upd[i] - (msgs_per_session - s), None)
                for i in range(len(L.keys)) for s in range(1, msgs_per_session + 1))
    counts["messages"] = batched(conn, "INSERT INTO messages (session_id, seq, role, content, extra,"
                                 " created_at, request_id) VALUES (?,?,?,?,?,?,?)", messages)
    return counts


def _running_turns(conn: apsw.Connection, L: Layout, msgs_per_session: int) -> None:
    """What the crash interrupted: running turns, every 3rd with a dangling
    tool call, their frames after all the history."""
    body = orjson.dumps({"text": "word "})
    for n, i in enumerate(L.running):
        rid, t = f"live{n}", L.upd[i]
        conn.execute("INSERT INTO prompts (request_id, session_key, session_id, platform, status,"
                     " delivery, text, payload, created_at, started_at) VALUES (?,?,?,?,'running',2,?,?,?,?)",
                     (rid, L.keys[i], L.sids[i], L.plats[i], "do something", orjson.dumps({"profile": "main"}), t, t))
        seq = msgs_per_session + 1
        conn.execute("INSERT INTO messages (session_id, seq, role, content, created_at, request_id)"
                     " VALUES (?,?,'user','do something',?,?)", (L.sids[i], seq, t, rid))
        if n % 3 == 0:
            calls = orjson.dumps([{"id": f"call{n}", "type": "function",
                                   "function": {"name": "test.wait", "arguments": "{}"}}]).decode()
            conn.execute("INSERT INTO messages (session_id, seq, role, content, extra, created_at,"
                         " request_id) VALUES (?,?,'assistant','',?,?,?)",
                         (L.sids[i], seq + 1, orjson.dumps({"tool_calls_json": calls}), t, rid))
        conn.execute("UPDATE incarnations SET next_seq = ? WHERE session_id = ?",
                     (seq + (2 if n % 3 == 0 else 1), L.sids[i]))
        for s, k in enumerate(("accepted", "started", "text_delta"), 1):
            conn.execute("INSERT INTO frames (request_id, seq, session_key, session_id, platform, at,"
                         " kind, body) VALUES (?,?,?,?,?,?,?,?)",
                         (rid, s, L.keys[i], L.sids[i], L.plats[i], t, k, body))
        conn.execute("UPDATE prompts SET first_frame = ?, first_seq = ? WHERE request_id = ?",
                     (conn.last_insert_rowid() - 2, seq, rid))
        if n % 2 == 0:
            conn.execute("INSERT INTO restart_counts (session_key, count, updated_at) VALUES (?,?,?)",
                         (L.keys[i], 1 + n % 3, t))


def _queued_prompts(conn: apsw.Connection, L: Layout) -> int:
    """Two queued prompts per session of the slice (FIFO, some in the follow-up slot)."""
    q = 0
    for i in L.queued:
        for pos in range(1, 3):
            rid, t = f"queued{q}", L.upd[i] + pos
            q += 1
            slot = "pending" if pos == 1 and q % 4 == 0 else "fifo"
            conn.execute("INSERT INTO prompts (request_id, session_key, session_id, platform, status,"
                         " delivery, text, payload, created_at) VALUES (?,?,?,?,'queued',3,?,?,?)",
                         (rid, L.keys[i], L.sids[i], L.plats[i], f"queued {pos}", orjson.dumps({"profile": "main"}), t))
            conn.execute("INSERT INTO prompt_queue (request_id, session_key, slot, position, enqueued_at)"
                         " VALUES (?,?,?,?,?)", (rid, L.keys[i], slot, pos, t))
            conn.execute("INSERT INTO frames (request_id, seq, session_key, session_id, platform, at, kind,"
                         " body) VALUES (?,1,?,?,?,?,'accepted',?)", (rid, L.keys[i], L.sids[i], L.plats[i], t,
                                                                   orjson.dumps({"queue_position": pos})))
            conn.execute("UPDATE prompts SET first_frame = ? WHERE request_id = ?",
                         (conn.last_insert_rowid(), rid))
    return q


def _open(out: Path) -> tuple[Path, apsw.Connection]:
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
    return db, conn


def generate(out: Path, sessions: int, frames: int, running: int, recent: int, pending: int,
             queued: int, msgs_per_session: int, seed: int) -> dict:
    rng = random.Random(seed)
    db, conn = _open(out)
    now = time.time()
    L = _layout(rng, sessions, running, recent, pending, queued, now)
    t0 = time.monotonic()
    counts = _sessions(conn, L, msgs_per_session)
    counts.update(_history(conn, rng, L, frames, msgs_per_session, now))
    with conn:
        _running_turns(conn, L, msgs_per_session)
        counts["queued"] = _queued_prompts(conn, L)
    with conn:  # the derived index, once, from the canonical rows
        conn.execute("INSERT INTO messages_fts (messages_fts) VALUES ('rebuild')")
        SqliteMessages(conn).set_index_mark(conn.execute("SELECT coalesce(max(id), 0) FROM messages").fetchone()[0])
        frame_keys.index_pending(conn)  # as the writer's passes would have left it
    with conn:  # lets the benchmark shift activity times to "just now" on each copy
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('gen_store_at', ?)", (str(now),))
    conn.execute("PRAGMA journal_mode=WAL")
    conn.close()
    counts.update(running=len(L.running), recent=len(L.recent), resume_pending=len(L.pend),
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

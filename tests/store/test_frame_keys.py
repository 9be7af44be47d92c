"""The SQLite backend finds a session key's frames through frame_keys, an index
filled in batches, plus a scan of the rows after its mark. What must hold at
every moment, whichever side of the mark a frame is on: a key's frames and a
request's frames read back complete and in cursor order, pages included, and
every delete (a session, a request, retention) removes the frames and their
keys alike. Each read is checked against a plain scan of the frames table."""

from __future__ import annotations

import random

import apsw
import pytest

from agent_sidecar.store.records import LedgerEntry
from agent_sidecar.store.sqlite import frame_keys, reads, schema
from agent_sidecar.store.sqlite.connection import open_writer
from agent_sidecar.store.sqlite.uow import SqliteUnitOfWork

pytestmark = pytest.mark.sqlite_only("the SQLite backend's own frame index")

KEYS = ("agent:main:a", "agent:main:b", "agent:main:c")


@pytest.fixture
def uow(tmp_path):
    path = str(tmp_path / "sidecar.db")
    conn = apsw.Connection(path)
    conn.execute("PRAGMA journal_mode=WAL")
    schema.migrate(conn)
    conn.close()
    writer = open_writer(path, one_thread=True)
    u = SqliteUnitOfWork(writer)
    u.frames.key_batch = 5  # a pass every few inserts, so reads span the mark
    yield u
    writer.close()


def write_turns(uow, rng: random.Random, turns: int, prefix: str = "r") -> list[str]:
    """``turns`` requests over KEYS, their frames interleaved in inserts of 1-4
    rows, as the frame bus writes them; returns the request ids."""
    open_turns: dict[str, list] = {}
    rids = []
    for n in range(turns):
        key = KEYS[n % len(KEYS)]
        rid = f"{prefix}{n}"
        uow.ledger.insert(LedgerEntry(rid, key, "sid-" + key, "telegram", "running", 1, "hi"))
        first = uow.frames.insert([(rid, 1, key, "sid-" + key, "telegram", 0.0, "accepted", None)])
        uow.ledger.set_first_frame(rid, first, None)
        open_turns[rid] = [key, 2]
        rids.append(rid)
        while len(open_turns) > 2 or (n == turns - 1 and open_turns):
            batch = []
            for _ in range(rng.randint(1, 4)):
                rid2 = rng.choice(sorted(open_turns))
                key2, seq = open_turns[rid2]
                batch.append((rid2, seq, key2, "sid-" + key2, "telegram", 0.0, "text_delta", b'{"text":"x"}'))
                open_turns[rid2][1] += 1
                if seq >= 6:
                    del open_turns[rid2]
                    break
            uow.frames.insert(batch)
    return rids


def scan(conn, where: str, args: tuple) -> list[tuple]:
    return conn.execute(f"SELECT id, request_id, seq FROM frames WHERE {where} ORDER BY id", args).fetchall()


def ids(records) -> list[tuple]:
    return [(f.cursor, f.request_id, f.seq) for f in records]


def check_reads(conn, rids: list[str]) -> None:
    top = conn.execute("SELECT max(id) FROM frames").fetchone()[0] or 0
    for key in KEYS:
        for after in range(0, top + 1, 3):
            want = scan(conn, "session_key = ? AND id > ?", (key, after))
            assert ids(reads.frames_after(conn, after, key, "", 1000)) == want
            assert ids(reads.frames_after(conn, after, key, "", 2)) == want[:2]
    for rid in rids:
        for after_seq, after_cursor, limit in ((0, 0, 0), (2, 0, 0), (0, top // 2, 0), (1, 0, 3)):
            want = scan(conn, "request_id = ? AND seq > ? AND id > ?", (rid, after_seq, after_cursor))
            got = ids(reads.request_frames(conn, rid, after_seq, after_cursor, limit))
            assert got == (want[:limit] if limit else want)


def test_reads_are_exact_on_both_sides_of_the_mark(uow):
    rids = write_turns(uow, random.Random(7), 9)
    conn = uow.conn
    upto = frame_keys.mark(conn)
    top = conn.execute("SELECT max(id) FROM frames").fetchone()[0]
    assert 0 < upto < top  # some frames indexed, some in the tail
    indexed = conn.execute("SELECT count(*) FROM frames WHERE id <= ?", (upto,)).fetchone()[0]
    assert conn.execute("SELECT count(*) FROM frame_keys").fetchone()[0] == indexed
    check_reads(conn, rids)
    assert uow.frames.last_seq("r4") == max(s for _, _, s in scan(conn, "request_id = 'r4'", ()))


def test_every_delete_takes_the_keys_with_the_frames(uow):
    rids = write_turns(uow, random.Random(11), 12)
    conn = uow.conn
    uow.frames.delete_key(KEYS[1])
    uow.ledger.forget("r3")
    assert scan(conn, "session_key = ?", (KEYS[1],)) == [] and scan(conn, "request_id = 'r3'", ()) == []
    check_reads(conn, rids)  # the deleted ones' reads come back empty
    conn.execute("UPDATE frames SET at = id")  # retention by time: the first ten frames are old
    assert uow.frames.delete_before(11.0, 4) > 0
    while uow.frames.delete_before(11.0, 4):
        pass
    assert conn.execute("SELECT min(id) FROM frames").fetchone()[0] >= 11
    orphans = conn.execute("SELECT count(*) FROM frame_keys k WHERE NOT EXISTS"
                           " (SELECT 1 FROM frames f WHERE f.id = k.id)").fetchone()[0]
    assert orphans == 0
    rids += write_turns(uow, random.Random(13), 3, "s")  # after the deletes: indexed and read as before
    check_reads(conn, rids)


def test_a_restarted_writer_counts_the_tail_it_finds(uow):
    write_turns(uow, random.Random(5), 4)
    conn = uow.conn
    if not frame_keys.unkeyed(conn):  # the last insert ran a pass: leave a tail
        uow.frames.insert([("r0", 98, KEYS[0], "sid", "telegram", 0.0, "text_delta", None)])
    waiting = frame_keys.unkeyed(conn)
    assert 0 < waiting < uow.frames.key_batch
    fresh = SqliteUnitOfWork(conn).frames  # a new writer process over the same file
    fresh.key_batch = waiting + 1
    fresh.insert([("r0", 99, KEYS[0], "sid", "telegram", 0.0, "text_delta", None)])
    assert frame_keys.unkeyed(conn) == 0  # the tail it found counted toward its first pass

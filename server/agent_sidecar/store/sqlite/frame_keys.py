"""The frames of one session key, found through an index filled in batches.

Why not an index on ``frames (session_key, id)``: the sessions' streams
interleave, so nearly every frame of a commit belongs to another key than the
one before it, and an index kept on insert gets a different b-tree page
dirtied for almost every frame. Each such page goes into the WAL whole (and
again into the database at the checkpoint): the writer then wrote about one
page per streamed delta. ``frame_keys`` holds the same pairs, but they go in
``KEY_BATCH`` frames at a time, sorted by key, so a page takes many of one
key's rows at once.

What a reader sees is exact at every moment: the frames up to the mark
(``meta`` row ``frames_keyed``, the highest frame id indexed so far) come
through the index, those after it from a scan of the table's last rows, which
``KEY_BATCH`` bounds. The mark only grows (frame ids are AUTOINCREMENT, never
handed out again), so a reader may take it in one statement and read in the
next: a batch indexed in between only makes the scan of the tail cover rows
the index has too, and those come once, from the scan.

Every delete of frames deletes their ``frame_keys`` rows in the same job.
"""

from __future__ import annotations

import apsw

from ..statements import one
from . import rows

MARK = "frames_keyed"
KEY_BATCH = 2048  # frames between two indexing passes, so about the most rows a tail scan reads

_COLUMNS = ", ".join(f"f.{c}" for c in rows.FRAME_COLUMNS)  # what rows.frame reads
# A key's frames in (after, mark], then past max(after, mark); ``where`` adds a
# condition on f: (key, after, mark, *where's, limit) and (after, key, *where's, limit).
INDEXED_PAGE = ("SELECT {columns} FROM frame_keys k JOIN frames f ON f.id = k.id"
                " WHERE k.session_key = ? AND k.id > ? AND k.id <= ? {where} ORDER BY k.id LIMIT ?")
TAIL_PAGE = "SELECT {columns} FROM frames f WHERE f.id > ? AND f.session_key = ? {where} ORDER BY f.id LIMIT ?"


def mark(conn: apsw.Connection) -> int:
    """The highest frame id indexed so far: every frame at or below it has
    its key in ``frame_keys``."""
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (MARK,)).fetchone()
    return int(row[0]) if row else 0


def unkeyed(conn: apsw.Connection) -> int:
    """About how many frames wait for their keys (ids past the mark; deletes may leave gaps)."""
    top = one(conn.execute("SELECT coalesce(max(id), 0) FROM frames").fetchone())[0]
    return max(0, top - mark(conn))


def index_pending(conn: apsw.Connection) -> int:
    """Every frame past the mark into ``frame_keys``, sorted by key, and the
    mark moved to the last of them (in the caller's transaction). Returns how
    many were indexed."""
    last = mark(conn)
    top = one(conn.execute("SELECT max(id) FROM frames").fetchone())[0]
    if top is None or top <= last:
        return 0
    conn.execute("INSERT OR IGNORE INTO frame_keys (id, session_key) SELECT id, session_key FROM frames"
                 " WHERE id > ? AND id <= ? ORDER BY session_key, id", (last, top))
    n = conn.changes()
    conn.execute("INSERT INTO meta (key, value) VALUES (?, ?)"
                 " ON CONFLICT (key) DO UPDATE SET value = excluded.value", (MARK, top))
    return n


def of_key(conn: apsw.Connection, key: str, after_id: int, *, columns: str = _COLUMNS,
           where: str = "", params: tuple = (), limit: int = -1) -> list[tuple]:
    """Rows of ``key``'s frames with id > ``after_id`` in id order (at most
    ``limit``; -1: all), each also matching ``where`` (a condition on ``f``,
    with ``params``): through the index up to the mark, then the tail."""
    upto = mark(conn)
    found: list[tuple] = []
    if after_id < upto:
        found = conn.execute(INDEXED_PAGE.format(columns=columns, where=where),
                             (key, after_id, upto, *params, limit)).fetchall()
        if 0 <= limit <= len(found):
            return found
    left = -1 if limit < 0 else limit - len(found)
    found += conn.execute(TAIL_PAGE.format(columns=columns, where=where),
                          (max(after_id, upto), key, *params, left)).fetchall()
    return found


OF_REQUEST = "AND f.request_id = ? AND f.seq > ?"


def of_request(conn: apsw.Connection, request_id: str, *, columns: str = _COLUMNS,
               after_seq: int = 0, after_id: int = 0, limit: int = -1) -> list[tuple]:
    """One request's frames with seq > ``after_seq`` and id > ``after_id``,
    in id order, found through its ledger row (its key, and its first frame's
    id as the lower bound); none without one."""
    row = conn.execute("SELECT session_key, coalesce(first_frame, 0) FROM prompts WHERE request_id = ?",
                       (request_id,)).fetchone()
    if row is None:
        return []
    key, first = row
    return of_key(conn, key, max(after_id, first - 1), columns=columns, where=OF_REQUEST,
                  params=(request_id, after_seq), limit=limit)


def delete_ids(conn: apsw.Connection, ids: list[int]) -> None:
    """These frames, and their keys."""
    conn.executemany("DELETE FROM frames WHERE id = ?", [(i,) for i in ids])
    conn.executemany("DELETE FROM frame_keys WHERE id = ?", [(i,) for i in ids])


def delete_key(conn: apsw.Connection, key: str) -> None:
    """Every frame of ``key``, and their keys."""
    upto = mark(conn)
    conn.execute("DELETE FROM frames WHERE id IN (SELECT id FROM frame_keys WHERE session_key = ?)", (key,))
    conn.execute("DELETE FROM frames WHERE id > ? AND session_key = ?", (upto, key))
    conn.execute("DELETE FROM frame_keys WHERE session_key = ?", (key,))


def delete_through(conn: apsw.Connection, last_id: int) -> None:
    """Every frame with id <= ``last_id``, and their keys (both a rowid range)."""
    conn.execute("DELETE FROM frames WHERE id <= ?", (last_id,))
    conn.execute("DELETE FROM frame_keys WHERE id <= ?", (last_id,))

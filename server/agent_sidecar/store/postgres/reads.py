"""The PostgreSQL backend's read queries, one coroutine per ``Store`` read,
each on a pooled asyncio connection in one statement (one snapshot). Every one
goes through an index, as on SQLite; search is ``to_tsquery`` of the parsed query (search_query.py) over
the GIN-indexed tsvector column, snippets by ``ts_headline``."""

from __future__ import annotations

from typing import Any

from .. import search_query
from ..records import FrameRecord, LeaseHolder, LedgerEntry, Message, SearchHit, SessionEntry
from ..statements import ENTRY_SELECT, entries_page
from . import codec, rows


async def _all(conn, sql: str, params: Any = ()) -> list[tuple]:
    cur = await conn.execute(sql, params)
    return await cur.fetchall()


async def _one(conn, sql: str, params: Any = ()) -> tuple | None:
    cur = await conn.execute(sql, params)
    return await cur.fetchone()


async def entry(conn, key: str) -> SessionEntry | None:
    row = await _one(conn, ENTRY_SELECT + " WHERE r.session_key = %s", (key,))
    return rows.entry(row) if row else None


async def session_key_of(conn, session_id: str) -> str | None:
    row = await _one(conn, "SELECT session_key FROM incarnations WHERE session_id = %s", (session_id,))
    return row[0] if row else None


async def list_entries(conn, platform: str, active_since: float | None,
                       after: tuple[float, str] | None, limit: int) -> list[SessionEntry]:
    sql, params = entries_page("%s", platform, active_since, after, limit)
    return [rows.entry(r) for r in await _all(conn, sql, params)]


async def transcript(conn, session_id: str, include_rewound: bool, after_seq: int,
                     limit: int | None) -> list[Message]:
    sql = rows.MESSAGE_SELECT + " WHERE session_id = %s AND seq > %s"
    if not include_rewound:
        sql += " AND active"
    sql += " ORDER BY seq"
    params: list[Any] = [session_id, after_seq]
    if limit is not None:
        sql += " LIMIT %s"
        params.append(limit)
    return [rows.message(r) for r in await _all(conn, sql, params)]


# A snippet as SQLite's snippet() makes it: about 12 words from the best match
# on, the matches in [brackets], "…" where the message goes on before or after.
# ts_headline chooses the words, reading the text as the index does
# (schema.py ``search_text``: the same characters at the same places,
# punctuation as spaces); its marks are two Unicode noncharacters that text
# never holds (they are spaces there too). The snippet is the message's own
# characters at that place, bracketed as SQLite brackets them (``_snippet``).
START, STOP = "\ufdd0", "\ufdd1"
_HEADLINE = f"MaxWords=12, MinWords=11, StartSel={START}, StopSel={STOP}"
_SEARCH = (
    "SELECT session_key, session_id, seq, role, plain,"
    " CASE WHEN pos > 0 THEN convert_to(substr(content, pos, length(plain)), 'UTF8') END,"
    " starts_with(st, plain), right(st, length(plain)) = plain, created_at"
    " FROM (SELECT i.session_key, m.session_id, m.seq, m.role, m.content, m.created_at, m.id,"
    " ts_rank(m.content_tsv, q) AS rank, q"
    " FROM messages m JOIN incarnations i ON i.session_id = m.session_id,"
    " to_tsquery('simple', %(q)s) q WHERE m.content_tsv @@ q AND m.active{key}"
    " ORDER BY rank DESC, m.id LIMIT %(limit)s) top,"
    " LATERAL (SELECT search_text(top.content) AS st) t,"
    " LATERAL (SELECT ts_headline('simple', t.st, top.q, %(opts)s) AS hl) h,"
    " LATERAL (SELECT replace(replace(h.hl, %(start)s, ''), %(stop)s, '') AS plain) p,"
    " LATERAL (SELECT strpos(t.st, p.plain) AS pos) o"
    " ORDER BY rank DESC, id")


def _marks(plain: str, terms: list[tuple[str, ...]]) -> list[tuple[int, int]]:
    """The spans of ``plain`` (the index's reading of the snippet's text) a
    snippet brackets: each instance of each term's words, in order (a phrase
    as one span, what stands between its words included); overlapping
    spans as one."""
    words = [(m.start(), m.end(), m.group().lower()) for m in search_query.WORD.finditer(plain)]
    spans = sorted((words[i][0], words[i + len(t) - 1][1]) for t in terms if t
                   for i in range(len(words) - len(t) + 1)
                   if all(words[i + j][2] == part for j, part in enumerate(t)))
    merged: list[tuple[int, int]] = []
    for s, e in spans:
        if merged and s < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(e, merged[-1][1]))
        else:
            merged.append((s, e))
    return merged


def _snippet(plain: str, region: bytes | None, at_start: bool, at_end: bool,
             terms: list[tuple[str, ...]]) -> str:
    """The hit's snippet: the message's own characters where the headline
    ``plain`` read them (``region``: the stored text there, raw, so its escapes
    are undone here, after the brackets went in: a bracket stands next to a
    word, never inside an escape), the marks in brackets, "…" where the
    message goes on."""
    own = region.decode() if region is not None else plain  # None: not found again (not expected)
    parts, at = [], 0
    for s, e in _marks(plain, terms):
        parts += [own[at:s], "[", own[s:e], "]"]
        at = e
    parts.append(own[at:])
    text = codec.unescape("".join(parts)) if region is not None else "".join(parts)
    return ("" if at_start else "…") + text + ("" if at_end else "…")


async def search(conn, query: str, session_key: str, limit: int) -> list[SearchHit]:
    """The query parsed once (search_query.py: quotes, or, -word, the parse
    SQLite's search is written from too) and written as ``to_tsquery`` input:
    both backends search for the same words in the same structure, and refuse
    alike one that only excludes words. NUL, punctuation and other control
    characters separate words, in the text as in the query."""
    groups = search_query.parse(query)
    if not groups:
        return []
    params = {"q": search_query.to_tsquery(groups), "limit": limit, "start": START, "stop": STOP, "opts": _HEADLINE}
    key = ""
    if session_key:
        key, params["key"] = " AND i.session_key = %(key)s", session_key
    terms = search_query.marked(groups)
    return [SearchHit(key_, sid, seq, role, _snippet(plain, region, first, last, terms), at)
            for key_, sid, seq, role, plain, region, first, last, at
            in await _all(conn, _SEARCH.format(key=key), params)]


async def ledger(conn, request_id: str) -> LedgerEntry | None:
    row = await _one(conn, rows.LEDGER_SELECT + " WHERE request_id = %s", (request_id,))
    return rows.ledger(row) if row else None


async def recent_requests(conn, since: float, limit: int) -> list[tuple[str, float, str]]:
    return [tuple(r) for r in await _all(
        conn, "SELECT request_id, created_at, session_key FROM prompts WHERE created_at >= %s"
        " ORDER BY created_at DESC LIMIT %s", (since, limit))]


# A request's frames from its first one, or past a cursor (whichever is later),
# along frames_by_key: a page costs its own rows, not those before it.
_REQUEST_PAGE = (f"SELECT {rows.FRAME_COLS} FROM frames"
                 " WHERE session_key = (SELECT session_key FROM prompts WHERE request_id = %(rid)s)"
                 " AND id > GREATEST(%(cursor)s, (SELECT coalesce(first_frame, 0) - 1 FROM prompts"
                 " WHERE request_id = %(rid)s))"
                 " AND request_id = %(rid)s AND seq > %(after)s ORDER BY id LIMIT %(limit)s")


async def request_frames(conn, request_id: str, after_seq: int, after_cursor: int = 0,
                         limit: int = 0) -> list[FrameRecord]:
    return [rows.frame(r) for r in await _all(
        conn, _REQUEST_PAGE, {"rid": request_id, "after": after_seq, "cursor": after_cursor,
                              "limit": limit or None})]


async def frames_after(conn, cursor: int, session_key: str, platform: str,
                       limit: int) -> list[FrameRecord]:
    if session_key:
        where, name = "session_key = %s", session_key
    elif platform:
        where, name = "platform = %s", platform
    else:  # every frame: the cluster's tail (frames.py)
        return [rows.frame(r) for r in await _all(
            conn, f"SELECT {rows.FRAME_COLS} FROM frames WHERE id > %s ORDER BY id LIMIT %s",
            (cursor, limit))]
    return [rows.frame(r) for r in await _all(
        conn, f"SELECT {rows.FRAME_COLS} FROM frames WHERE {where} AND id > %s ORDER BY id LIMIT %s",
        (name, cursor, limit))]


async def last_frame_cursor(conn) -> int:
    row = await _one(conn, "SELECT coalesce(max(id), 0) FROM frames")
    return row[0] if row else 0


def load_for_model(conn, session_id: str) -> list[dict[str, Any]]:
    """Synchronous, for a worker's own connection (reader.py)."""
    return [rows.model_message(role, content, extra) for role, content, extra in conn.execute(
        "SELECT role, content, extra FROM messages WHERE session_id = %s AND active ORDER BY seq",
        (session_id,))]


async def lease_holder(conn, key: str) -> LeaseHolder | None:
    row = await _one(conn, "SELECT node_id, address, epoch, extract(epoch FROM expires_at - now())::float8"
                           " FROM leases WHERE session_key = %s AND expires_at > now()", (key,))
    return LeaseHolder(key, row[0], row[1], row[2], row[3]) if row else None


async def known_requests(conn, request_ids: list[str]) -> set[str]:
    """Of these request ids, those the ledger holds."""
    return {r[0] for r in await _all(conn, "SELECT request_id FROM prompts WHERE request_id = ANY(%s)",
                                     (request_ids,))}


async def reset_requests(conn, request_ids: list[str]) -> set[str]:
    """Of these request ids, those whose incarnation a ResetSession ended."""
    return {r[0] for r in await _all(conn, "SELECT p.request_id FROM prompts p JOIN incarnations i"
                                           " ON i.session_id = p.session_id WHERE p.request_id = ANY(%s)"
                                           " AND i.end_reason = 'reset'", (request_ids,))}


async def stopped_requests(conn, request_ids: list[str], stuck_after: int) -> set[str]:
    """Of these request ids, those whose incarnation a SuspendSession (/stop)
    suspended: their lane points at it, suspended, and not by the stuck-loop
    guard, whose suspension leaves the lane's restart count at ``stuck_after``."""
    return {r[0] for r in await _all(conn, "SELECT p.request_id FROM prompts p JOIN routing r"
                                           " ON r.session_key = p.session_key AND r.session_id = p.session_id"
                                           " WHERE p.request_id = ANY(%s) AND r.suspended AND NOT EXISTS"
                                           " (SELECT 1 FROM restart_counts c WHERE c.session_key = p.session_key"
                                           " AND c.count >= %s)", (request_ids, stuck_after))}


async def revoked_leases(conn, keys: list[str]) -> set[str]:
    """Of these lanes, those whose lease a delete revoked (and nobody took since)."""
    return {r[0] for r in await _all(conn, "SELECT session_key FROM leases WHERE session_key = ANY(%s)"
                                           " AND node_id = ''", (keys,))}


async def database_size(conn) -> int:
    row = await _one(conn, "SELECT pg_database_size(current_database())")
    return int(row[0]) if row else 0

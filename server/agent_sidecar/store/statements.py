"""SQL the two backends (store/sqlite/, store/postgres/) write alike: the
statements whose text differs between them only in the parameter mark (``?``
or ``%s``) are built here once, with the backend's mark, so that the backends
cannot drift apart where callers rely on them answering alike: a ListSessions
page ends, and the next one begins, at the same row on either.

Each backend converts values its own way (``column_value``: JSON and booleans
as its driver wants them); what is built here is text and the order of its
parameters.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from .records import ROUTING_FIELDS, TOKEN_TOTAL_CAP, UsageDelta

# An entry: the routing columns plus the incarnation's turn count. The count
# is a scalar subquery, not a LEFT JOIN: the same plan on paper (two primary
# key searches), but the SQLite that apsw bundles ran the join several times
# slower, and this is every GetSession's read and every job's that reads a lane.
ENTRY_SELECT = (
    "SELECT " + ", ".join("r." + c for c in ROUTING_FIELDS)
    + ", COALESCE((SELECT i.turn_count FROM incarnations i WHERE i.session_id = r.session_id), 0)"
    " FROM routing r"
)


def one(row: Any) -> Any:
    """The row of a query that always yields one (an aggregate, or the RETURNING of the
    row just written): no row there is a broken query, not an empty result."""
    if row is None:
        raise LookupError("a single-row query returned no row")
    return row


def entries_page(mark: str, platform: str, active_since: float | None,
                 after: tuple[float, str] | None, limit: int) -> tuple[str, list[str | float]]:
    """ListSessions' page: entries newest first (``updated_at``, then the
    key), those of ``platform`` only when it is given, active since
    ``active_since``, after the bookmark ``after`` (the last entry's
    ``(updated_at, session_key)``). Returns the statement and its parameters."""
    where: list[str] = []
    params: list[str | float] = []
    if platform:
        where.append(f"r.platform = {mark}")
        params.append(platform)
    if active_since is not None:
        where.append(f"r.updated_at >= {mark}")
        params.append(active_since)
    if after is not None:
        where.append(f"(r.updated_at < {mark} OR (r.updated_at = {mark} AND r.session_key > {mark}))")
        params += [after[0], after[0], after[1]]
    sql = ENTRY_SELECT + (" WHERE " + " AND ".join(where) if where else "")
    params.append(limit)
    return sql + f" ORDER BY r.updated_at DESC, r.session_key LIMIT {mark}", params


_COUNTERS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "total_tokens")


def usage_update(mark: str, least: str, d: UsageDelta, updated_at: float | None,
                 key: str, session_id: str | None) -> tuple[str, list[Any]]:
    """UpdateUsage's and a usage frame's statement (RoutingRepo.add_usage):
    each token counter adds its delta and stops at ``TOKEN_TOTAL_CAP``
    (``least``: the backend's two-argument minimum), far below where int64
    would overflow; with ``session_id``, only while the lane is on it."""
    total = d.input_tokens + d.output_tokens + d.cache_read_tokens + d.cache_write_tokens
    params: list[Any] = []
    for delta in (d.input_tokens, d.output_tokens, d.cache_read_tokens, d.cache_write_tokens, total):
        params += [delta, TOKEN_TOTAL_CAP]
    params += [d.cost_usd, d.last_prompt_tokens, d.last_prompt_tokens, d.cost_status, d.cost_status,
               updated_at, key]
    if session_id is not None:
        params.append(session_id)
    return _usage_sql(mark, least, session_id is not None), params


@functools.cache
def _usage_sql(mark: str, least: str, by_session: bool) -> str:
    """usage_update's text: one per backend and form, built once (a usage
    frame of every turn runs it)."""
    sets = [f"{c} = {least}({c} + {mark}, {mark})" for c in _COUNTERS]
    sets += [f"estimated_cost_usd = estimated_cost_usd + {mark}",
             f"last_prompt_tokens = CASE WHEN {mark} > 0 THEN {mark} ELSE last_prompt_tokens END",
             f"cost_status = CASE WHEN {mark} != '' THEN {mark} ELSE cost_status END",
             f"updated_at = coalesce({mark}, updated_at)"]
    sql = "UPDATE routing SET " + ", ".join(sets) + f" WHERE session_key = {mark}"
    return sql + f" AND session_id = {mark}" if by_session else sql


class RoutingPatches:
    """The UPDATE of one routing row for a ``RoutingPatch``: its ``plain``
    columns set, its ``guarded`` ones (``if_current``) only while the row
    still names the session the caller read. One statement text per shape
    of patch (which columns, plain or guarded), built once and kept."""

    def __init__(self, mark: str, column_value: Callable[[str, Any], Any]):
        self.mark, self.column_value = mark, column_value
        self._texts: dict[tuple, str] = {}

    def statement(self, key: str, plain: Mapping[str, Any], guarded: Mapping[str, Any],
                  session_id: str | None) -> tuple[str, list[Any]]:
        shape = (tuple(plain), tuple(guarded))
        sql = self._texts.get(shape)
        if sql is None:
            m = self.mark
            sets = [f"{c} = {m}" for c in plain]
            sets += [f"{c} = CASE WHEN session_id = {m} THEN {m} ELSE {c} END" for c in guarded]
            sql = self._texts[shape] = f"UPDATE routing SET {', '.join(sets)} WHERE session_key = {m}"
        value = self.column_value
        params: list[Any] = [value(c, v) for c, v in plain.items()]
        for c, v in guarded.items():
            params += [session_id, value(c, v)]
        params.append(key)
        return sql, params

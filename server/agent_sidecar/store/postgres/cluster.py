"""PostgreSQL repositories of the cluster: lane leases and node rows
(unit_of_work.LeaseRepo, NodeRepo). Every time is the database's ``now()``, never
a node's clock.

A lease row is never deleted, only expired: its ``epoch`` grows by one with
every change of holder and never goes back, so a stalled node that still
believes in an old epoch can never pass the fence again — not even after it
takes the same lane back, which gives it a new epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import psycopg

from ..records import LeaseGrant, LeaseHolder
from .rows import one


class PostgresLeases:
    """Every operation that locks lease rows takes the frames lock first
    (``order``): one lock order for every writer of the cluster."""

    def __init__(self, conn: psycopg.Connection, order: Callable[[], None]):
        self.conn, self.order = conn, order

    def take(self, key: str, node_id: str, address: str, ttl_s: float) -> LeaseGrant | LeaseHolder:
        """The lane's lease for ``node_id``: new, run out, let go, or already
        this node's (then its epoch moves on too: a restarted node takes its
        lanes back as a new holder). Held by another node and alive: who
        holds it. Concurrent takes of one lane serialise on its row: one wins."""
        self.order()
        # The row as it stands, locked, read by a statement of its own: a
        # CTE locking it in the upsert below reads nothing in RETURNING (the
        # row is the upsert's own by then), so every take would say nobody
        # held the lane before.
        old = self.conn.execute("SELECT node_id, released FROM leases WHERE session_key = %s FOR UPDATE",
                                (key,)).fetchone()
        row = self.conn.execute(
            "INSERT INTO leases AS l (session_key, node_id, epoch, expires_at, address)"
            " VALUES (%(key)s, %(node)s, 1, now() + make_interval(secs => %(ttl)s), %(addr)s)"
            " ON CONFLICT (session_key) DO UPDATE SET node_id = excluded.node_id, epoch = l.epoch + 1,"
            " expires_at = excluded.expires_at, address = excluded.address, released = false"
            " WHERE l.expires_at < now() OR l.node_id = excluded.node_id"
            " RETURNING l.epoch",
            {"key": key, "node": node_id, "ttl": ttl_s, "addr": address}).fetchone()
        if row is not None:
            previous, clean = old if old is not None else ("", True)
            return LeaseGrant(key, row[0], previous, clean)
        node, addr, epoch, left = one(self.conn.execute(
            "SELECT node_id, address, epoch, extract(epoch FROM expires_at - now())::float8"
            " FROM leases WHERE session_key = %s", (key,)).fetchone())
        return LeaseHolder(key, node, addr, epoch, max(0.0, left))

    def fenced(self, node_id: str, epochs: dict[str, int]) -> set[str]:
        """Of these lanes, those whose lease no longer names ``node_id`` at
        that epoch. The rows are locked FOR SHARE until the transaction ends:
        no takeover can commit between this check and this job's commit."""
        self.order()
        rows = self.conn.execute(
            "SELECT session_key, node_id, epoch FROM leases WHERE session_key = ANY(%s) FOR SHARE",
            (list(epochs),)).fetchall()
        held = {k: (n, e) for k, n, e in rows}
        return {k for k, e in epochs.items() if held.get(k) != (node_id, e)}

    def renew(self, node_id: str, keys: Iterable[str], ttl_s: float) -> dict[str, int]:
        """Extend this node's leases on ``keys``; returns those still its own
        (lane -> epoch). A lane missing from the answer was taken over, or
        revoked (a let-go lease is never brought back to life by a renewal)."""
        self.order()
        return dict(self.conn.execute(
            "UPDATE leases SET expires_at = now() + make_interval(secs => %s)"
            " WHERE node_id = %s AND session_key = ANY(%s) AND NOT released RETURNING session_key, epoch",
            (ttl_s, node_id, list(keys))).fetchall())

    def release(self, key: str, node_id: str, epoch: int) -> None:
        """Let another node take the lane at once (the row and its epoch stay);
        the next holder knows it was let go, not lost."""
        self.order()
        self.conn.execute("UPDATE leases SET expires_at = now(), released = true WHERE session_key = %s"
                          " AND node_id = %s AND epoch = %s", (key, node_id, epoch))

    def expire(self, key: str, node_id: str, epoch: int) -> None:
        """Let the lease run out now *without* letting the lane go: to the
        other nodes it is a lane whose node went away with its work cut off
        (``orphaned``), and its next holder restores it as after a crash. A
        clean stop leaves so the lanes its drain marked ``resume_pending``."""
        self.order()
        self.conn.execute("UPDATE leases SET expires_at = now() WHERE session_key = %s"
                          " AND node_id = %s AND epoch = %s", (key, node_id, epoch))

    def revoke(self, keys: Sequence[str] | None = None) -> None:
        """The lanes were deleted (None: every lane, ClearAllSessions): each
        lease moves to a new epoch, names no node and is let go, so every
        write still on its way under an older epoch, from any node, is
        refused by the fence instead of bringing rows of a deleted session
        back. The rows stay (an epoch never repeats for a lane)."""
        self.order()
        sql = "UPDATE leases SET epoch = epoch + 1, node_id = '', expires_at = now(), released = true"
        if keys is None:
            self.conn.execute(sql)
        elif keys:
            self.conn.execute(sql + " WHERE session_key = ANY(%s)", (list(keys),))

    def revoked(self, keys: Iterable[str]) -> set[str]:
        """Of these lanes, those whose lease was revoked (and nobody took since)."""
        return {r[0] for r in self.conn.execute(
            "SELECT session_key FROM leases WHERE session_key = ANY(%s) AND node_id = ''", (list(keys),))}

    def of_node(self, node_id: str) -> list[str]:
        """Lanes ``node_id`` held and did not let go: what its last run had
        when it ended (a crash leaves them held until they run out)."""
        return [r[0] for r in self.conn.execute(
            "SELECT session_key FROM leases WHERE node_id = %s AND NOT released", (node_id,))]

    def orphaned(self, limit: int = 100) -> list[str]:
        """Lanes whose node went away under them: their lease ran out
        (expired, not necessarily let go) with acknowledged work left in the
        ledger (queued or running), or ran out *without* being let go while
        the lane is marked ``resume_pending`` (a crash, or a clean stop whose
        drain cut a turn off: ``expire``). A lane taken with nothing to do is
        let go at once (cluster/jobs.py), so each holder that went away makes
        its lanes orphans once. A lane with no lease row at all is one whose
        work a sidecar left while it ran *alone* on the database (no
        ``[cluster] advertise``: it takes no leases): once the database is a
        cluster's, that work (its queued prompts, a turn its crash cut off)
        is taken over as a dead holder's, not left waiting for the lane's
        next prompt (its row then exists: an orphan once too)."""
        # Both driven from a small partial index (open ledger rows; lanes
        # marked resume_pending), each lease looked up by its key: however
        # long the history of leases, never a scan of them (a join could be
        # planned as one).
        return [r[0] for r in self.conn.execute(
            "SELECT o.session_key FROM (SELECT DISTINCT session_key FROM prompts"
            " WHERE status IN ('queued', 'running')) o"
            " WHERE coalesce((SELECT l.expires_at < now() FROM leases l"
            " WHERE l.session_key = o.session_key), true)"
            " UNION SELECT r.session_key FROM routing r WHERE r.resume_pending AND NOT r.suspended"
            " AND coalesce((SELECT l.expires_at < now() AND NOT l.released FROM leases l"
            " WHERE l.session_key = r.session_key), true)"
            " LIMIT %s", (limit,))]


class PostgresNodes:
    def __init__(self, conn: psycopg.Connection):
        self.conn = conn

    def arrive(self, node_id: str, address: str) -> bool:
        """This node starts: returns whether its last run stopped cleanly (the
        per-node clean-shutdown marker), and clears the marker."""
        row = self.conn.execute(
            "WITH old AS (SELECT clean_stop FROM nodes WHERE node_id = %(n)s)"
            " INSERT INTO nodes AS n (node_id, address) VALUES (%(n)s, %(a)s)"
            " ON CONFLICT (node_id) DO UPDATE SET address = excluded.address, started_at = now(),"
            " heartbeat_at = now(), clean_stop = false"
            " RETURNING (SELECT clean_stop FROM old)", {"n": node_id, "a": address}).fetchone()
        return bool(row and row[0])

    def heartbeat(self, node_id: str) -> None:
        """The node is alive (every lease renewal round, held lanes or not)."""
        self.conn.execute("UPDATE nodes SET heartbeat_at = now() WHERE node_id = %s", (node_id,))

    def presence(self, node_id: str) -> tuple[bool, float, float, str] | None:
        """The node's row: whether its last run stopped cleanly, its last
        heartbeat (seconds since the epoch), how long ago that was on the
        database's clock, and its address; None for a node never seen."""
        row = self.conn.execute(
            "SELECT clean_stop, extract(epoch FROM heartbeat_at)::float8,"
            " extract(epoch FROM now() - heartbeat_at)::float8, address FROM nodes WHERE node_id = %s",
            (node_id,)).fetchone()
        return None if row is None else (bool(row[0]), row[1], row[2], row[3])

    def leave(self, node_id: str) -> None:
        """A graceful stop: the marker."""
        self.conn.execute("UPDATE nodes SET clean_stop = true, heartbeat_at = now() WHERE node_id = %s",
                          (node_id,))

"""The PostgreSQL store's control channel (UnitOfWork.announce, read back by
PostgresStore.follow_cluster): an announce reaches the listeners when its
transaction commits, never when it rolls back, and one of more keys than a
NOTIFY payload holds arrives whole, split over several notifications. Store
level: a real PostgreSQL database, the backend's own unit of work."""

from __future__ import annotations

import asyncio

import psycopg

from agent_sidecar.store.postgres.store import PostgresStore
from agent_sidecar.store.postgres.uow import PostgresUnitOfWork
from agent_sidecar.store.records import ClusterOp


def test_an_announce_arrives_once_committed_and_whole(cluster_dsn):
    store = PostgresStore(cluster_dsn, node_id="listener")  # migrates the new database
    keys = [f"agent:main:telegram:dm:{'x' * 120}{i}" for i in range(400)]  # ~50 KB of keys

    async def main() -> list[ClusterOp]:
        notes = store.follow_cluster(idle_s=30)
        try:
            assert await anext(notes) == 0  # listening
            with psycopg.connect(cluster_dsn) as conn:
                PostgresUnitOfWork(conn, "origin").announce("delete", ["rolled back"])
                conn.rollback()
                uow = PostgresUnitOfWork(conn, "origin")
                uow.announce("prune", keys)
                uow.announce("clear_all", ())
                conn.commit()
            got: list[ClusterOp] = []
            while not got or got[-1].op != "clear_all":
                note = await asyncio.wait_for(anext(notes), 10)
                if isinstance(note, ClusterOp):
                    got.append(note)
            return got
        finally:
            await notes.aclose()

    got = asyncio.run(main())
    assert [op.op for op in got][-1] == "clear_all" and got[-1].keys == ()
    prunes = got[:-1]
    assert len(prunes) > 1 and {op.op for op in prunes} == {"prune"}
    assert [k for op in prunes for k in op.keys] == keys
    assert {op.origin for op in got} == {"origin"}

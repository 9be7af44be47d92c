"""The PostgreSQL writer backend (store/postgres/writer.py) under the
process's commit loop (store/writer/process.commit), on a real server, when
the database refuses its writes: every answer is a store fault
(StoreUnavailable: UNAVAILABLE, STORE_UNAVAILABLE for the callers), and the
writer commits again once the database takes writes, without a new
connection. The sidecar's own behaviour in the same outages is
tests/cluster/test_db_outage.py's."""

from __future__ import annotations

import pytest

from agent_sidecar.store.faults import StoreUnavailable, probe
from agent_sidecar.store.postgres.writer import PostgresWriter
from agent_sidecar.store.writer import process

pytestmark = pytest.mark.postgres_only("the PostgreSQL writer backend's own connection")


def _group(db: PostgresWriter, uow, jobs: int) -> list[tuple[bool, object]]:
    """One group commit of ``jobs`` probe jobs: (ok, result or error) per job."""
    return [(ok, value) for _, ok, value in process.commit(db, uow, [([i], probe, [()]) for i in range(jobs)])]


@pytest.mark.parametrize("uses", range(8))
def test_a_read_only_database_fails_every_job_as_a_store_fault(pg_server, uses):
    """A standby after a failover (``default_transaction_read_only``): the
    jobs fail read-only, a store fault. The statements a failing job's
    pipeline segment skipped used to stay "prepared" in psycopg's cache, so
    depending on how often they had run before (``uses``) the next group
    failed ``prepared statement "_pg3_N" does not exist``: not a store fault,
    an INTERNAL error for its callers, with health still SERVING."""
    db = PostgresWriter(pg_server.database("writer_read_only"), "n")
    try:
        uow = db.unit_of_work()
        for _ in range(uses):
            assert _group(db, uow, 1) == [(True, None)]
        db.conn.execute("SET default_transaction_read_only = on")
        for _ in range(3):
            answers = _group(db, uow, 2)
            assert all(not ok and isinstance(v, StoreUnavailable) and "read-only" in v.message
                       for ok, v in answers), answers
        db.conn.execute("SET default_transaction_read_only = off")
        for _ in range(3):
            assert _group(db, uow, 2) == [(True, None), (True, None)]
    finally:
        db.close()

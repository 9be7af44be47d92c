"""A rolling upgrade of a cluster and ``agent-sidecar doctor``: the nodes
share one PostgreSQL database, so a doctor of a newer release, run while
nodes of an older one are up (the new release installed, their restart still
to come), must not migrate the database under them. Real nodes on one real
PostgreSQL database; doctor as the operator runs it."""

from __future__ import annotations

import psycopg
from helpers.cli import cli
from helpers.cluster import Cluster
from helpers.config import echo

from agent_sidecar.store.postgres.schema import MIGRATIONS

LAST = max(v for v, _, _ in MIGRATIONS)


def doctor(node) -> tuple[int, str]:
    r = cli("doctor", "--data-dir", str(node.data_dir), env=node.store_env())
    return r.returncode, r.stdout + r.stderr


def migrations(dsn: str) -> set[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {v for (v,) in conn.execute("SELECT version FROM schema_migrations")}


def test_doctor_never_migrates_a_database_older_nodes_run_on(tmp_path, cluster_dsn):
    """The nodes run a release that lacks this one's last migration: doctor
    used to apply it under them. It now refuses, naming the migration and
    changing nothing; once the nodes are down (or restarted as this release)
    it migrates and checks the database as before."""
    cl = Cluster(tmp_path, cluster_dsn, n=2, config=echo("main"))
    with cl:
        with psycopg.connect(cluster_dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM schema_migrations WHERE version = %s", (LAST,))
        status, out = doctor(cl[0])
        assert status == 1 and "older release" in out and f"migration(s) {LAST}" in out, out
        assert LAST not in migrations(cluster_dsn)
    status, out = doctor(cl[0])
    assert status == 0 and "integrity: ok" in out, out
    assert LAST in migrations(cluster_dsn)


def test_doctor_checks_a_database_current_nodes_run_on(tmp_path, cluster_dsn):
    """Nodes of this release (nothing to migrate): doctor checks beside them."""
    with Cluster(tmp_path, cluster_dsn, n=2, config=echo("main")) as cl:
        status, out = doctor(cl[1])
        assert status == 0 and "integrity: ok" in out and "full-text index: ok" in out, out

"""Cluster tests: several sidecars on one real PostgreSQL database.

``new_database()`` (the ``cluster_databases`` fixture) makes a fresh, empty
database on the tests' PostgreSQL server: the ``pg_server`` fixture of
tests/conftest.py (helpers/pg.py), or else the server whose admin DSN
``TEST_PG_DSN`` gives. ``cluster_dsn`` is one per test. When no PostgreSQL can
be had, every cluster test is skipped, saying why."""

from __future__ import annotations

import os
import secrets

import pytest

# Until the shared PostgreSQL fixture is merged: an admin DSN of a server to use. Not an
# AGENT_SIDECAR_* name: the sidecar refuses variables of its prefix that name no config key.
DSN_ENV = "TEST_PG_DSN"


def _server(request):
    """The session's PostgreSQL server (None: the one ``TEST_PG_DSN`` names),
    or a skip saying why there is none."""
    try:
        from helpers import pg  # noqa: F401  (the shared PostgreSQL fixture's helper)
    except ImportError:
        pg = None
    if pg is not None:
        try:
            return request.getfixturevalue("pg_server")
        except Exception as e:  # initdb or the server failed: no PostgreSQL on this machine
            pytest.skip(f"cluster tests need PostgreSQL, and none could be started: {e}")
    if not os.environ.get(DSN_ENV):
        pytest.skip(f"cluster tests need PostgreSQL: set {DSN_ENV} to an admin DSN")
    return None


@pytest.fixture(scope="session")
def cluster_databases(request):
    """``new()`` -> the DSN of a new, empty database (dropped at the end)."""
    server = _server(request)
    made: list[str] = []

    def new() -> str:
        name = "cl" + secrets.token_hex(6)
        if server is not None:
            return server.database(name)
        import psycopg
        from psycopg.conninfo import make_conninfo
        admin = os.environ[DSN_ENV]
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        made.append(name)
        return make_conninfo(admin, dbname=name)

    yield new
    if made:
        import psycopg
        with psycopg.connect(os.environ[DSN_ENV], autocommit=True) as conn:
            for name in made:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def cluster_dsn(cluster_databases):
    """A new, empty database for this test's cluster."""
    return cluster_databases()

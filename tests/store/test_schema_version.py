"""A store migrated by a newer release (an upgrade rolled back to the old
binary) is refused at start, on either backend, instead of being served by code
that does not know its tables (store/interface.py ``StoreOpenError``); the
release that knows every migration it records opens it as before."""

from __future__ import annotations

import time

import pytest
from helpers.cli import cli
from helpers.config import echo
from helpers.store import raw_sql
from sidecar_proc import Sidecar

NEWER = 9999


def test_a_store_a_newer_release_migrated_is_refused_not_served(tmp_path):
    sc = Sidecar(tmp_path / "data", config=echo("main")).start()
    assert sc.stop() == 0
    with raw_sql(sc) as db:
        db.execute("INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                   (NEWER, "a newer release's migration", time.time()))
    try:
        with pytest.raises(RuntimeError, match="exited with 1") as refused:
            sc.start()
    finally:
        if sc.proc is not None and sc.proc.poll() is None:  # served it after all: the defect
            sc.stop()
    assert f"migration(s) {NEWER} from a newer agent-sidecar" in str(refused.value), str(refused.value)

    r = cli("doctor", "--data-dir", str(sc.data_dir), env=sc.store_env())
    assert r.returncode == 1 and "from a newer agent-sidecar" in r.stderr, (r.stdout, r.stderr)

    with raw_sql(sc) as db:
        db.execute("DELETE FROM schema_migrations WHERE version = ?", (NEWER,))
    sc.start()
    assert sc.stop() == 0

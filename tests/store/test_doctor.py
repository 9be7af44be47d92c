"""`agent-sidecar doctor` (issue 5): integrity and FTS5 checks, `--rebuild-fts`
from the canonical rows, WAL checkpoint and summary, on a stopped sidecar's data
dir and next to a running one. The FTS index is corrupted with stdlib sqlite3."""

from __future__ import annotations

import sqlite3
import subprocess
from contextlib import closing

import grpc
import pytest
from helpers.cli import cli
from helpers.config import echo
from helpers.ids import source
from helpers.recovery import health
from helpers.sessions import rpc_error
from helpers.store import query, raw_sql, writes_held
from helpers.streams import PromptRun
from sidecar_proc import Sidecar

from agent_sidecar.store.sqlite.schema import MIGRATIONS
from agent_sidecar.v1 import session_service_pb2 as spb

pytestmark = pytest.mark.sqlite_only("the SQLite file's own checks and its FTS5 index, corrupted with sqlite3")

TEXTS = ["the quick brown fox", "jumps over the lazy dog", "zebra crossing ahead",
         "unicode naïve café", "the fox again"]


def doctor(data_dir, *args: str, timeout: float = 60, env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess:
    """``agent-sidecar doctor`` on a data dir; ``env``: a Sidecar's store_env() (its backend)."""
    return cli("doctor", "--data-dir", str(data_dir), *args, env=env, timeout=timeout)


def all_messages(sc) -> list[tuple]:
    return query(sc, "SELECT * FROM messages ORDER BY id")


def search(sc, q: str, key: str = "") -> list:
    return list(sc.sessions().SearchMessages(spb.SearchMessagesRequest(query=q, session_key=key, limit=50),
                                             timeout=10).hits)


@pytest.fixture
def stopped(tmp_path):
    """A data dir with a few completed turns, its sidecar stopped cleanly."""
    sc = Sidecar(tmp_path / "data", config=echo("main")).start()
    src = source()
    for t in TEXTS:
        p = PromptRun(sc.prompts(), text=t, src=src)
        p.done.wait(10)
        assert p.kinds()[-1] == "completed", p.kinds()
    assert sc.stop() == 0
    return sc


def test_doctor_on_a_healthy_store(stopped):
    before = all_messages(stopped)
    r = doctor(stopped.data_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "integrity: ok" in out and "full-text index: ok" in out, out
    assert "WAL checkpoint" in out and "summary:" in out, out
    line = [ln for ln in out.splitlines() if ln.strip().startswith("messages")]
    assert line and line[0].split()[-1].replace(",", "") == str(len(before)), out
    assert len(before) == 2 * len(TEXTS)
    assert all_messages(stopped) == before


def test_doctor_without_a_store(tmp_path):
    r = doctor(tmp_path / "nothing")
    assert r.returncode == 1 and "no store" in r.stderr, (r.stdout, r.stderr)


def test_doctor_with_a_config_it_cannot_use_exits_2_as_every_command(tmp_path):
    (tmp_path / "bad.toml").write_text("[sidecar]\nworkers = -1\n")
    r = doctor(tmp_path / "data", "--config", str(tmp_path / "bad.toml"))
    assert r.returncode == 2 and "config error: sidecar.workers" in r.stderr, (r.stdout, r.stderr)




def _damage_messages_table(data_dir) -> None:
    """Overwrite the first page of the messages table (the schema stays
    readable): what a bad disk sector does."""
    db = data_dir / "sidecar.db"
    with closing(sqlite3.connect(str(db))) as conn:
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'messages'").fetchone()[0]
        page = conn.execute("PRAGMA page_size").fetchone()[0]
    with open(db, "r+b") as f:
        f.seek((root - 1) * page)
        f.write(b"\xff" * page)


def test_doctor_on_a_damaged_store_says_so_and_how_to_recover(stopped):
    """Before, doctor printed `integrity check …` and then apsw's CorruptError traceback: the
    one command meant for a damaged store failed on one."""
    _damage_messages_table(stopped.data_dir)
    r = doctor(stopped.data_dir)
    assert r.returncode == 1 and "Traceback" not in r.stderr + r.stdout, r.stderr
    assert "integrity:" in r.stdout and "integrity: ok" not in r.stdout, r.stdout
    out = r.stdout + r.stderr
    assert "damaged" in out and ".recover" in out, out


def test_a_sidecar_on_a_damaged_store_refuses_what_it_cannot_read_as_store_unavailable(stopped):
    """A read of the damaged pages is UNAVAILABLE / STORE_UNAVAILABLE (before: INTERNAL, and a
    traceback in the log); what it can still read is answered."""
    _damage_messages_table(stopped.data_dir)
    with Sidecar(stopped.data_dir, config=echo("main")) as sc:
        stub = sc.sessions()
        sessions = stub.ListSessions(spb.ListSessionsRequest(), timeout=10).sessions
        assert sessions
        with rpc_error(grpc.StatusCode.UNAVAILABLE, "STORE_UNAVAILABLE"):
            stub.GetTranscript(spb.GetTranscriptRequest(session_id=sessions[0].session_id), timeout=10)


@pytest.mark.parametrize("corruption", ["phantom_row",
                                        "lost_segments"])
def test_doctor_detects_and_rebuilds_corrupt_fts(stopped, corruption):
    sc = stopped
    before = all_messages(sc)
    with closing(sqlite3.connect(str(sc.data_dir / "sidecar.db"))) as conn, conn:
        if corruption == "phantom_row":  # an index entry with no message behind it
            conn.execute("INSERT INTO messages_fts(rowid, content) VALUES (999999, 'bogus phantom')")
        else:  # the index loses its segments: messages no longer findable
            conn.execute("DELETE FROM messages_fts_data WHERE id > 10")
    r = doctor(sc.data_dir)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "full-text index: INCONSISTENT" in r.stdout, r.stdout
    assert "--rebuild-fts" in r.stdout
    assert all_messages(sc) == before, "a check must not touch a message row"

    r = doctor(sc.data_dir, "--rebuild-fts")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"rebuilt full-text index from {len(before)} messages: ok" in r.stdout, r.stdout
    assert all_messages(sc) == before, "the rebuild must not change any message row"
    r = doctor(sc.data_dir)
    assert r.returncode == 0 and "full-text index: ok" in r.stdout, r.stdout

    sc.start()
    try:
        hits = search(sc, "fox")
        assert sorted(h.seq for h in hits) == [1, 2, 9, 10], [(h.seq, h.snippet) for h in hits]
        assert search(sc, "bogus") == [] and search(sc, "phantom") == []
        assert len(search(sc, "zebra")) == 2  # the prompt and its echo
        # the rebuilt index's triggers still follow new rows
        p = PromptRun(sc.prompts(), text="quetzal after rebuild", src=source())
        p.done.wait(10)
        assert len(search(sc, "quetzal")) == 2
    finally:
        sc.stop()
    assert all_messages(sc)[:len(before)] == before


def test_doctor_next_to_a_running_sidecar(tmp_path):
    sc = Sidecar(tmp_path / "data", config=echo("slow", 30)).start()
    try:
        src = source()
        p = PromptRun(sc.prompts(), text="before the doctor", src=src)
        p.done.wait(10)
        busy = PromptRun(sc.prompts(), text=" ".join(f"w{i}" for i in range(40)), src=source(),
                         profile="slow")
        busy.wait_for("started")
        r = doctor(sc.data_dir)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "integrity: ok" in r.stdout and "full-text index: ok" in r.stdout, r.stdout
        assert health(sc.target) == "SERVING"
        busy.done.wait(15)
        assert busy.kinds()[-1] == "completed", (busy.kinds(), busy.error)
        p = PromptRun(sc.prompts(), text="after the doctor", src=src)
        p.done.wait(10)
        assert p.kinds()[-1] == "completed"
        assert len(search(sc, "doctor")) == 4
    finally:
        assert sc.stop() == 0


def test_doctor_next_to_a_running_sidecar_never_takes_its_write_lock(stopped):
    """The full-text check holds the write lock for as long as it takes (16 s at
    2 million messages), which stalled a running sidecar's writer past its busy
    timeout into STORE_UNAVAILABLE. Next to a running sidecar it runs on a
    snapshot: with the store's write lock held by another connection for the
    whole run (as a long commit would), doctor still checks everything, where
    it used to wait for the lock and give up (StoreLocked)."""
    with Sidecar(stopped.data_dir, config=echo("main")).start() as sc:
        with writes_held(sc):
            r = doctor(sc.data_dir)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "integrity: ok" in r.stdout and "full-text index: ok" in r.stdout, r.stdout
        assert [p.name for p in sc.data_dir.iterdir() if p.name.startswith(".doctor-")] == []
        assert len(search(sc, "fox")) == 4


def test_doctor_never_migrates_the_store_of_a_running_older_release(stopped):
    """This release installed over a running older one (its store lacks this
    release's last migration): doctor used to migrate the store under it. It now
    refuses, changing nothing; the sidecar's own restart migrates it."""
    last = max(v for v, _, _ in MIGRATIONS)
    with Sidecar(stopped.data_dir, config=echo("main")).start() as sc:
        with raw_sql(sc) as db:
            db.execute("DELETE FROM schema_migrations WHERE version = ?", (last,))
        r = doctor(sc.data_dir)
        assert r.returncode == 1 and "older release" in r.stderr, (r.stdout, r.stderr)
        assert query(sc, "SELECT version FROM schema_migrations WHERE version = ?", (last,)) == []
        assert sc.stop() == 0
        sc.start()
        assert query(sc, "SELECT version FROM schema_migrations WHERE version = ?", (last,)) == [(last,)]
        assert doctor(sc.data_dir).returncode == 0


def test_doctor_with_the_sidecars_config_checks_the_sidecars_store(stopped, tmp_path):
    """The config names the data dir (``[sidecar] data_dir``, as ``serve --config``
    reads it): ``doctor --config`` checks that store, not ./data in the working
    directory; ``--data-dir`` still wins."""
    conf = tmp_path / "sidecar.toml"
    conf.write_text(f'[sidecar]\ndata_dir = "{stopped.data_dir}"\n')
    r = cli("doctor", "--config", str(conf))
    assert r.returncode == 0, r.stdout + r.stderr
    line = [ln for ln in r.stdout.splitlines() if ln.strip().startswith("messages")]
    assert line and line[0].split()[-1] == str(2 * len(TEXTS)), r.stdout
    r = doctor(tmp_path / "elsewhere", "--config", str(conf))
    assert r.returncode == 1 and "no store" in r.stderr, (r.stdout, r.stderr)

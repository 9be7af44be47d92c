"""`agent-sidecar backup FILE` (docs/operations.md "Backups"): an online copy of
the SQLite store, taken while turns stream, that a sidecar restores from: every
turn acknowledged before the backup is in it (the WAL's commits too, which a
`cp sidecar.db` misses), and a turn that was streaming is closed by the restore
like after a crash."""

from __future__ import annotations

import os
import shutil
import stat

import pytest
from helpers.cli import cli
from helpers.config import echo, table
from helpers.ids import source, words
from helpers.sessions import get_session, transcript
from helpers.streams import PromptRun, body_of, collect, kind_of, start
from sidecar_proc import Sidecar

from agent_sidecar.v1 import prompt_service_pb2 as ppb

pytestmark = pytest.mark.sqlite_only("a copy of the SQLite file")


def test_a_backup_taken_while_turns_stream_restores_every_acknowledged_turn(tmp_path):
    config = table("sidecar", drain_timeout=0) + echo("main") + echo("slow", 200)
    backup = tmp_path / "backups" / "sidecar-1.db"
    backup.parent.mkdir()
    with Sidecar(tmp_path / "data", config=config).start() as sc:
        done = []
        for i in range(5):
            p = PromptRun(sc.prompts(), text=f"finished turn {i}", src=source())
            p.done.wait(10)
            assert p.kinds()[-1] == "completed", p.kinds()
            done.append(p)
        streaming = start(sc.prompts(), text=words(200), src=source(), profile="slow")
        streaming.wait_for("text_delta")
        r = cli("backup", "--data-dir", str(sc.data_dir), str(backup))
        assert r.returncode == 0, r.stdout + r.stderr
        assert "6 session(s), 11 message(s)" in r.stdout, r.stdout  # the streaming turn: its prompt
    assert stat.S_IMODE(os.stat(backup).st_mode) == 0o600  # every conversation is in it
    assert not os.path.exists(str(backup) + ".partial")

    restored = tmp_path / "restored"
    restored.mkdir()
    shutil.copyfile(backup, restored / "sidecar.db")
    with Sidecar(restored, config=config).start() as sc:
        for i, p in enumerate(done):
            text = f"finished turn {i}"
            s = get_session(sc.sessions(), p.key)
            assert [m.content for m in transcript(sc.sessions(), s.session_id)] == [text, text], p.key
        replay = collect(sc.prompts().WatchActivity(ppb.WatchActivityRequest(request_id=streaming.request_id),
                                                    timeout=30))
        last = replay.frames[-1]
        assert kind_of(last) == "failed" and body_of(last)["reason"] == "restart_interrupted", replay.kinds()


def test_backup_refuses_an_existing_file_and_a_missing_store(tmp_path):
    (tmp_path / "taken.db").write_bytes(b"mine")
    with Sidecar(tmp_path / "data", config=echo("main")).start() as sc:
        r = cli("backup", "--data-dir", str(sc.data_dir), str(tmp_path / "taken.db"))
        assert r.returncode == 1 and "exists" in r.stderr, (r.stdout, r.stderr)
    assert (tmp_path / "taken.db").read_bytes() == b"mine"
    r = cli("backup", "--data-dir", str(tmp_path / "nothing"), str(tmp_path / "b.db"))
    assert r.returncode == 1 and "no store" in r.stderr, (r.stdout, r.stderr)
    assert not (tmp_path / "b.db").exists()


def test_a_file_name_that_names_no_file_is_one_line_and_exit_1(tmp_path):
    """A name ending in a slash (a directory meant as the place) was refused
    in words about another file (`… exists`, `cannot write …/.partial`). It
    is now one line saying what is wrong, before anything is written. (An
    empty name is the command line's refusal, exit 2: tests/cli.)"""
    with Sidecar(tmp_path / "data", config=echo("main")).start() as sc:
        for dest in (str(tmp_path) + "/", str(tmp_path / "missing") + "/"):
            r = cli("backup", "--data-dir", str(sc.data_dir), dest)
            assert r.returncode == 1 and r.stdout == "" and "Traceback" not in r.stderr, (dest, r.stderr)
            assert r.stderr == f"agent-sidecar backup: {dest!r} names no file: give the copy's file name\n"
    assert not list(tmp_path.glob("*.partial")) and not list(tmp_path.glob(".partial"))

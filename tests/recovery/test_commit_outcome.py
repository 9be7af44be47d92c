"""A group commit whose connection to PostgreSQL is cut while its COMMIT is
in flight: the sidecar cannot know from the lost connection whether it
committed. Whichever happened, what was written must be there exactly once:
a flush taken for failed and sent again, though it committed, stored its
frames twice (one seq twice in a request's replay) and its transcript rows
twice.

The cut is made by a proxy between the sidecar and the server
(helpers/pgproxy.py) on the writer's connection: after the COMMIT reached
the server (it committed; the answer is lost), or before (it did not; the
server sees the client gone at once, or, as behind a network cut, not: the
transaction stays open on it until the sidecar has it ended).
Asserted through gRPC: the request's stored frames (WatchActivity), its
transcript (GetTranscript).
"""

from __future__ import annotations

import itertools

import grpc
import pytest
from helpers.config import echo
from helpers.ids import source, words
from helpers.pgproxy import PgProxy
from helpers.sessions import transcript
from helpers.streams import PromptRun, assert_well_formed, kind_of, run, run_retrying, watch
from sidecar_proc import Sidecar

from agent_sidecar.store.postgres.connection import WRITER_APPLICATION

pytestmark = pytest.mark.postgres_only("a connection to PostgreSQL cut during its COMMIT")

CONFIG = echo("main", 40)  # 40 words: a turn of ~1.6 s, flushing as it goes
CUTS = 3
AWAY_S = 2.0  # the database out of reach after a cut
_databases = itertools.count(1)


@pytest.fixture
def proxied(pg_server, tmp_path):
    proxy = PgProxy(pg_server.database(f"commit_cut_{next(_databases)}"))
    sc = Sidecar(tmp_path / "s", config=CONFIG, dsn=proxy.dsn, workers=1).start()
    try:
        yield sc, proxy
    finally:
        sc.stop()
        proxy.close()


def _stored_once(sc, out: PromptRun) -> str:
    """The request's stored frames are one gapless run of seqs with one
    terminal frame, and its transcript holds the prompt and its answer once
    each; returns how it ended."""
    stored = watch(sc.prompts(), timeout=60, request_id=out.request_id)
    end = kind_of(stored.frames[-1]) if stored.frames else ""
    assert end in ("completed", "failed"), (stored.kinds(), stored.code, stored.details)
    assert_well_formed(stored, end)
    rows = [(m.role, m.content) for m in transcript(sc.sessions(), out.session_id)]
    assert len(rows) == len(set(rows)), rows
    return end


@pytest.mark.parametrize("terminated", [False, True], ids=["connection_dropped", "session_terminated"])
def test_a_commit_that_went_through_is_answered_as_committed(proxied, terminated):
    sc, proxy = proxied
    text = words(40, "through")
    out = PromptRun(sc.prompts(), text=text, src=source(), timeout=60)
    out.wait_for("text_delta")
    for _ in range(CUTS):
        assert proxy.cut_commit(WRITER_APPLICATION, deliver=True, terminated=terminated).wait(30)
    assert out.result(60).code == grpc.StatusCode.OK, out.details
    assert out.end == "completed", out.kinds()
    assert _stored_once(sc, out) == "completed"
    assert [m.content for m in transcript(sc.sessions(), out.session_id)] == [text, text]
    assert run(sc.prompts(), text=words(3, "after"), key=out.key).end == "completed"


@pytest.mark.parametrize("arrived", [True, False], ids=["committed", "not_committed"])
def test_a_commit_whose_outcome_cannot_be_asked_for_a_while_counts_once_in_order(proxied, arrived):
    """The outcome cannot be asked for a while: the writes behind it are
    refused meanwhile (STORE_UNAVAILABLE), answered before it; then the
    commit is answered as what it was, and what did not commit is sent again
    in the order it was first sent (a flush behind one that did not commit
    was stored ahead of it: seqs [1, 2, 3, 5, 4, 6, 7])."""
    _cut_during_a_turn(*proxied, "away", deliver=arrived, refuse_s=AWAY_S)


@pytest.mark.parametrize("server_notices", [True, False], ids=["server_notices", "network_cut"])
def test_a_commit_that_never_arrived_is_sent_again_once(proxied, server_notices):
    _cut_during_a_turn(*proxied, "lost", deliver=False, server_notices=server_notices)


def _cut_during_a_turn(sc, proxy: PgProxy, tag: str, **cut) -> None:
    """One cut while a turn streams: whichever way the turn ended, what it
    stored is there once, and the lane runs the next prompt."""
    out = PromptRun(sc.prompts(), text=words(40, tag), src=source(), timeout=60)
    out.wait_for("text_delta")
    assert proxy.cut_commit(WRITER_APPLICATION, **cut).wait(30)
    out.result(60)
    assert _stored_once(sc, out) in ("completed", "failed")
    after = run_retrying(sc.prompts(), text=words(3, "after"), key=out.key)  # the store may still recover
    assert after.end == "completed", (after.kinds(), after.code, after.details)

"""Durability: a message whose AppendMessages call returned survives `kill -9` of
the sidecar (docs/api.md, AppendMessages: "durable when it returns").

After a crash the sidecar marks recently active lanes ``resume_pending``
(``restart_interrupted``) and runs a synthesized continue turn for them (seed 001 §7,
DECISIONS.md "Recovery"), which appends its own rows *after* what was there. So the checks
are: the acknowledged rows are exactly the transcript's prefix, seqs are gapless, and any
row beyond them is the writer's one unacknowledged in-flight row or the recovery turn's.
"""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
from helpers.ids import source as src
from helpers.sessions import assert_serving, create, msg, seed, transcript, turns
from sidecar_proc import Sidecar

from agent_sidecar.v1 import session_service_pb2 as pb
from agent_sidecar.v1 import session_service_pb2_grpc as pb_grpc

RESUME_PREFIX = "[The previous turn was interrupted"


def assert_acked_prefix(stub, sid: str, acked: list[str], in_flight: str | None = None) -> list:
    full = transcript(stub, sid, include_rewound=True)
    assert [m.seq for m in full] == list(range(1, len(full) + 1)), sid
    got = [m.content for m in full]
    assert got[:len(acked)] == acked, sid
    rest = full[len(acked):]
    if rest and in_flight is not None and rest[0].content == in_flight:
        rest = rest[1:]  # committed, but the answer never reached the client
    if rest:  # only the recovery turn may add rows
        assert rest[0].role == "user" and rest[0].content.startswith(RESUME_PREFIX), \
            (sid, [(m.role, m.content[:60]) for m in rest])
    return full


def test_acknowledged_appends_survive_kill9(tmp_path):
    sc = Sidecar(tmp_path / "data").start()
    try:
        stub = sc.sessions()
        sources = [src("telegram") for _ in range(5)]
        sessions = [create(stub, s)[0] for s in sources]
        for i, s in enumerate(sessions):
            for j in range(10):
                r = stub.AppendMessages(pb.AppendMessagesRequest(
                    session_id=s.session_id, messages=[msg("user", f"k{i}-{j}-a"),
                                                       msg("assistant", f"k{i}-{j}-b")]),
                    timeout=10)
                assert r.last_seq == 2 * j + 2
        rw = stub.RewindSession(pb.RewindSessionRequest(session_id=sessions[0].session_id, n=1),
                                timeout=10)
        assert rw.turns_undone == 1
        sus = stub.SuspendSession(pb.SuspendSessionRequest(session_key=sessions[1].session_key),
                                  timeout=10).session
        assert sus.suspended
        sc.kill9()
        assert sc.proc.returncode == -9
        sc.start()
        stub = sc.sessions()
        for i, s in enumerate(sessions):
            assert_acked_prefix(stub, s.session_id,
                                [f"k{i}-{j}-{x}" for j in range(10) for x in "ab"])
        full0 = transcript(stub, sessions[0].session_id, include_rewound=True)
        assert [m.active for m in full0[:20]] == [True] * 18 + [False] * 2  # the rewind held
        # The suspended lane is neither marked nor resumed: exactly its own rows.
        assert len(transcript(stub, sessions[1].session_id, include_rewound=True)) == 20
        # Lanes, flags and the search index came back too.
        again, created = create(stub, sources[2])
        assert not created and again.session_id == sessions[2].session_id
        assert stub.GetSession(pb.GetSessionRequest(session_key=sessions[1].session_key),
                               timeout=10).session.suspended
        hits = stub.SearchMessages(pb.SearchMessagesRequest(query="k3-7-b"), timeout=10).hits
        assert [(h.session_id, h.seq) for h in hits] == [(sessions[3].session_id, 16)]
        # Appends continue after the last durable seq.
        r = stub.AppendMessages(pb.AppendMessagesRequest(session_id=sessions[4].session_id,
                                                         messages=[msg("user", "after")]), timeout=10)
        assert r.first_seq == r.last_seq and r.first_seq >= 21
        after = transcript(stub, sessions[4].session_id)
        assert [m.content for m in after if m.seq == r.first_seq] == ["after"]
        assert_serving(sc)
    finally:
        sc.stop()


def test_kill9_during_concurrent_appends(tmp_path):
    """Writers append as fast as they can; SIGKILL lands mid-stream. After restart each
    transcript holds every acknowledged message, in order, gapless — at most the
    in-flight (unacknowledged) one beyond."""
    sc = Sidecar(tmp_path / "data").start()
    n_sessions = 20
    try:
        stub = sc.sessions()
        sids = [create(stub)[0].session_id for _ in range(n_sessions)]
        acked: dict[str, list[str]] = {sid: [] for sid in sids}
        started = threading.Event()

        async def writers():
            ch = grpc.aio.insecure_channel(sc.target)
            st = pb_grpc.SessionServiceStub(ch)

            async def one(sid):
                j = 0
                while True:
                    text = f"{sid}-{j}"
                    try:
                        await st.AppendMessages(pb.AppendMessagesRequest(
                            session_id=sid, messages=[msg("user", text)]), timeout=10)
                    except grpc.RpcError:
                        return
                    acked[sid].append(text)
                    if j == 5:
                        started.set()
                    j += 1

            try:
                await asyncio.gather(*[one(sid) for sid in sids])
            finally:
                await ch.close()

        t = threading.Thread(target=lambda: asyncio.run(writers()))
        t.start()
        assert started.wait(20)
        time.sleep(0.3)
        sc.kill9()
        t.join(30)
        assert not t.is_alive()
        snapshot = {sid: list(v) for sid, v in acked.items()}
        assert sum(len(v) for v in snapshot.values()) > n_sessions * 5
        sc.start()
        stub = sc.sessions()
        for sid in sids:
            want = snapshot[sid]
            assert_acked_prefix(stub, sid, want, in_flight=f"{sid}-{len(want)}")
        assert_serving(sc)
    finally:
        sc.stop()


def test_seeded_and_rewritten_state_survives_kill9(tmp_path):
    sc = Sidecar(tmp_path / "data").start()
    try:
        stub = sc.sessions()
        s = seed(stub, src(), turns("one", "two", "three", "four"))
        stub.RewriteTranscript(pb.RewriteTranscriptRequest(
            session_id=s.session_id, messages=[msg("system", "summary")]), timeout=10)
        new = stub.ResetSession(pb.ResetSessionRequest(session_key=s.session_key), timeout=10).session
        sc.kill9()
        sc.start()
        stub = sc.sessions()
        cur = stub.GetSession(pb.GetSessionRequest(session_key=s.session_key), timeout=10).session
        assert cur.session_id == new.session_id
        full = transcript(stub, s.session_id, include_rewound=True)
        assert [(m.content, m.active) for m in full] == [
            ("one", False), ("two", False), ("three", False), ("four", False), ("summary", True)]
    finally:
        sc.stop()

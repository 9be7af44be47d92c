"""Concurrency against the real sidecar, driven with grpc.aio (plain pytest, asyncio.run):
idempotent GetOrCreateSession under a stampede, and many sessions appending at once."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import grpc
from helpers.ids import source as src
from helpers.ids import uniq
from helpers.sessions import msg, transcript

from agent_sidecar.v1 import session_service_pb2 as pb
from agent_sidecar.v1 import session_service_pb2_grpc as pb_grpc


def _aio(sc):
    ch = grpc.aio.insecure_channel(sc.target)
    return ch, pb_grpc.SessionServiceStub(ch)


def test_200_concurrent_get_or_create_one_id(shared_sidecar):
    source = src("telegram", chat_type="group", user_id="u1")

    async def main():
        ch, stub = _aio(shared_sidecar)
        async with ch:
            req = pb.GetOrCreateSessionRequest(source=source)
            return await asyncio.gather(*[stub.GetOrCreateSession(req, timeout=30)
                                          for _ in range(200)])

    results = asyncio.run(main())
    assert len(results) == 200
    assert len({r.session.session_id for r in results}) == 1
    assert len({r.session.session_key for r in results}) == 1
    assert sum(r.created for r in results) == 1


def test_concurrent_get_or_create_many_keys_threads(shared_sidecar):
    """Threads (sync stubs) on 20 keys × 10 callers: one id per key, 20 distinct ids."""
    stub = shared_sidecar.sessions()
    sources = [src("slack", chat_type="channel") for _ in range(20)]
    with ThreadPoolExecutor(max_workers=32) as pool:
        futures = [(i, pool.submit(stub.GetOrCreateSession,
                                   pb.GetOrCreateSessionRequest(source=sources[i]), timeout=30))
                   for _ in range(10) for i in range(20)]
        by_key: dict[int, set[str]] = {}
        created = 0
        for i, f in futures:
            r = f.result()
            by_key.setdefault(i, set()).add(r.session.session_id)
            created += r.created
    assert all(len(ids) == 1 for ids in by_key.values())
    assert len({next(iter(ids)) for ids in by_key.values()}) == 20
    assert created == 20


def test_100_sessions_append_concurrently(shared_sidecar):
    n_sessions, n_appends = 100, 20
    tag = uniq("conc")

    async def main():
        ch, stub = _aio(shared_sidecar)
        async with ch:
            sessions = await asyncio.gather(*[
                stub.GetOrCreateSession(pb.GetOrCreateSessionRequest(
                    source=src("telegram", chat_id=f"{tag}-{i}")), timeout=30)
                for i in range(n_sessions)])
            sids = [r.session.session_id for r in sessions]

            async def writer(i: int, sid: str):
                acks = []
                for j in range(n_appends):  # one session's appends in order
                    r = await stub.AppendMessages(pb.AppendMessagesRequest(
                        session_id=sid, messages=[msg("user" if j % 2 == 0 else "assistant",
                                                      f"s{i}-m{j}")]), timeout=60)
                    acks.append((r.first_seq, r.last_seq))
                return acks

            acks = await asyncio.gather(*[writer(i, sid) for i, sid in enumerate(sids)])
            return sids, acks

    sids, acks = asyncio.run(main())
    assert len(set(sids)) == n_sessions
    stub = shared_sidecar.sessions()
    for i, sid in enumerate(sids):
        assert acks[i] == [(j + 1, j + 1) for j in range(n_appends)]
        got = transcript(stub, sid)
        assert [m.content for m in got] == [f"s{i}-m{j}" for j in range(n_appends)]
        assert [m.seq for m in got] == list(range(1, n_appends + 1))


def test_concurrent_appends_to_one_session_get_disjoint_seqs(shared_sidecar):
    """50 callers append 3 messages each to one incarnation at once: every call gets its
    own contiguous seq range, the ranges tile 1..150, and each call's rows are adjacent."""
    sid = shared_sidecar.sessions().GetOrCreateSession(
        pb.GetOrCreateSessionRequest(source=src()), timeout=10).session.session_id

    async def main():
        ch, stub = _aio(shared_sidecar)
        async with ch:
            return await asyncio.gather(*[stub.AppendMessages(pb.AppendMessagesRequest(
                session_id=sid, messages=[msg("user", f"c{k}-{x}") for x in range(3)]), timeout=60)
                for k in range(50)])

    results = asyncio.run(main())
    ranges = sorted((r.first_seq, r.last_seq) for r in results)
    assert all(b - a == 2 for a, b in ranges)
    assert [a for a, _ in ranges] == list(range(1, 151, 3))
    got = transcript(shared_sidecar.sessions(), sid)
    assert [m.seq for m in got] == list(range(1, 151))
    for k, r in enumerate(results):
        assert [m.content for m in got[r.first_seq - 1:r.last_seq]] == [f"c{k}-{x}" for x in range(3)]

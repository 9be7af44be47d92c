"""The store's writer process (store/writer/process.py): a named child without
grpc, that never outlives the sidecar, whose death stops the sidecar instead of
leaving it unable to persist; and jobs that must be module-level functions.
Also how the sidecar's processes and threads are scheduled around its event
loop (children at a lower priority, gRPC's threads SCHED_BATCH)."""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import threading

import pytest
from helpers.ids import source
from helpers.logs import log_lines
from helpers.procs import alive, children, cmdline, comm, grpc_loaded, mapped, niceness, sched_policy
from helpers.store import frames_refused, opened_store
from helpers.waiting import wait_until
from sidecar_proc import Sidecar

from agent_sidecar.children import CHILD_NICE
from agent_sidecar.errors import SidecarError
from agent_sidecar.sessions import lifecycle as life
from agent_sidecar.sessions.source import SessionSource
from agent_sidecar.store import StoreClosed
from agent_sidecar.store.writer.answers import JobError
from agent_sidecar.v1 import session_service_pb2 as spb


def child_pids(sc) -> dict[str, int]:
    """The writer and every worker, once each has started and named itself."""
    want = {"sidecar-writer", *(f"sidecar-work-{i}" for i in range(sc.workers))}
    found = wait_until(lambda: (lambda ch: ch if want <= ch.keys() else None)(children(sc)),
                       what=f"the sidecar's children {sorted(want)}")
    return {("writer" if n == "sidecar-writer" else n.replace("sidecar-work-", "worker")): found[n]
            for n in sorted(want)}


def test_writer_is_a_named_child_without_grpc(tmp_path):
    with Sidecar(tmp_path / "data", workers=1).start() as sc:
        pids = child_pids(sc)
        assert not grpc_loaded(pids["writer"])
        assert comm(pids["writer"]) == "sidecar-writer"
        assert comm(pids["worker0"]) == "sidecar-work-0"


@pytest.mark.sqlite_only("only the SQLite writer opens its connection without the mutex")
def test_the_sqlite_writer_process_runs_one_thread(tmp_path):
    """Its connection leaves SQLite's per-connection mutex out
    (store/sqlite/connection.py, ``one_thread``), which is safe only while
    nothing else in the process runs: checked once it has run the startup
    restore and a client's writes."""
    with Sidecar(tmp_path / "data", workers=1).start() as sc:
        pid = child_pids(sc)["writer"]
        for _ in range(3):
            sc.sessions().GetOrCreateSession(spb.GetOrCreateSessionRequest(source=source()), timeout=10)
        assert os.listdir(f"/proc/{pid}/task") == [str(pid)]


def test_the_tree_is_the_writer_and_the_workers_importing_what_they_use(tmp_path):
    """No multiprocessing resource tracker (nothing needs one: children are
    spawned without multiprocessing, children.py); no child loads
    multiprocessing; the writer, which runs no event loop, loads neither
    asyncio nor ssl (issue 18 item 6: idle memory)."""
    with Sidecar(tmp_path / "data", workers=2).start() as sc:
        pids = child_pids(sc)
        kids = children(sc)
        assert sorted(kids) == ["sidecar-work-0", "sidecar-work-1", "sidecar-writer"], \
            {name: cmdline(pid) for name, pid in kids.items()}
        assert not any("resource_tracker" in cmdline(pid) for pid in kids.values())
        for name, pid in pids.items():
            assert not mapped(pid, "/_multiprocessing."), name
        if sc.backend == "sqlite":  # psycopg itself imports asyncio and ssl
            for fragment in ("/_asyncio.", "/_ssl.", "/libssl."):
                assert not mapped(pids["writer"], fragment), fragment


def test_children_yield_the_cpu_to_the_event_loop(tmp_path):
    with Sidecar(tmp_path / "data", workers=2).start() as sc:
        parent = niceness(sc.proc.pid)
        for name, pid in child_pids(sc).items():
            assert niceness(pid) == min(parent + CHILD_NICE, 19), name


def test_grpc_threads_do_not_preempt_the_event_loop(tmp_path):
    """gRPC's threads run SCHED_BATCH; the event loop (the main thread) and the
    children keep the default policy (api/server.py, calm_grpc_threads)."""
    with Sidecar(tmp_path / "data", workers=1).start() as sc:
        pid = sc.proc.pid
        threads = {int(t): comm(pid, int(t)) for t in os.listdir(f"/proc/{pid}/task")}
        grpc_threads = [t for t, name in threads.items() if name in ("event_engine", "lifeguard")]
        assert grpc_threads, threads
        assert all(sched_policy(pid, t) == os.SCHED_BATCH for t in grpc_threads), threads
        assert sched_policy(pid) == os.SCHED_OTHER
        for name, child in child_pids(sc).items():
            assert sched_policy(child) == os.SCHED_OTHER, name
        # the sidecar's own report of the threads it calmed (an operator reads it in the log)
        assert log_lines(sc, "serving")[-1]["batch_threads"] >= len(grpc_threads)


def test_children_die_with_a_killed_sidecar(tmp_path):
    sc = Sidecar(tmp_path / "data", workers=2).start()
    pids = child_pids(sc)
    assert all(alive(p) for p in pids.values())
    sc.kill9()
    wait_until(lambda: not any(alive(p) for p in pids.values()), timeout=10,
               what=f"children {pids} gone after kill -9 of the sidecar")


def test_sidecar_stops_when_its_writer_dies(tmp_path):
    data = tmp_path / "data"
    sc = Sidecar(data, workers=1).start()
    try:
        made = sc.sessions().GetOrCreateSession(spb.GetOrCreateSessionRequest(source=source()),
                                                timeout=10).session
        os.kill(child_pids(sc)["writer"], signal.SIGKILL)
        sc.proc.wait(30)
        assert sc.proc.returncode == 1, sc.log()
        # the log line is the behaviour here: it tells the operator why the sidecar stopped
        died = [x for x in log_lines(sc) if x.get("msg") == "the store writer process died"]
        assert [(x.get("exitcode"), x.get("signal")) for x in died] == [(-9, "SIGKILL")], died
        assert not (data / ".clean_shutdown").exists()
    finally:
        sc.stop()
    with Sidecar(data, workers=1).start() as again:  # nothing acknowledged was lost
        got = again.sessions().GetSession(spb.GetSessionRequest(session_key=made.session_key),
                                          timeout=10).session
        assert got.session_id == made.session_id


def test_jobs_are_module_level_functions_with_plain_arguments(tmp_path):
    """A closure cannot cross to the writer process: refused at the call site.
    A domain error raised there arrives whole (reason and field)."""

    async def go():
        async with opened_store(tmp_path / "s.db", writes=True, log_format="text") as store:
            with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
                store.write(lambda uow: None)
            entry, created = await store.write(life.get_or_create, "agent:main:t:dm:1",
                                               SessionSource(platform="t", chat_id="1"), "main")
            assert created and entry.session_key == "agent:main:t:dm:1"
            with pytest.raises(SidecarError) as err:
                await store.write(life.reset, "agent:main:t:dm:nope", "")
            assert err.value.reason == "SESSION_NOT_FOUND"
            before = store.writer.commits
            await asyncio.gather(*(store.write(life.mark_resume_pending, entry.session_key, f"r{i}")
                                   for i in range(200)))
            assert store.writer.commits - before == 1, "writes of one loop iteration share a commit"
        with pytest.raises(StoreClosed):
            store.write(life.suspend, "agent:main:t:dm:1")

    asyncio.run(go())


@pytest.mark.sqlite_only("a store opened without its writer process (the PostgreSQL store's reads need it started)")
def test_a_write_to_a_store_whose_writer_has_not_started_is_refused(tmp_path):
    """A write before the writer's start finished (a sidecar whose start
    failed elsewhere, a worker's, stops while its writer still starts) is
    refused StoreClosed. It was queued for a channel that did not exist yet,
    dropped, and its caller waited for ever: stop()'s last write hung the
    sidecar after "cannot start", SIGTERM and all."""

    async def go():
        async with opened_store(tmp_path / "s.db") as store:  # the writer process not started
            with pytest.raises(StoreClosed, match="the store writer is not running"):
                store.write(life.suspend, "agent:main:t:dm:1")

    asyncio.run(go())


# -- one commit group: a job failing on the database fails alone ---------------------------------

def _new_incarnation(uow, sid: str) -> str:
    uow.incarnations.insert(sid, f"agent:main:t:dm:{sid}", 1.0)
    return sid


def _write_then_conflict(uow, sid: str, taken: str) -> None:
    """A write of its own, then one the database refuses (``taken`` exists)."""
    uow.incarnations.insert(sid, f"agent:main:t:dm:{sid}", 1.0)
    uow.incarnations.insert(taken, "agent:main:t:dm:taken", 1.0)


def _exists(uow, sids: list[str]) -> list[bool]:
    return [uow.incarnations.get(s) is not None for s in sids]


def test_a_job_the_database_refuses_rolls_back_alone_in_its_commit_group(tmp_path):
    """Jobs of one loop iteration share a transaction; the one whose write the
    database refuses (a unique key) fails with its own error, its other write
    undone, and the jobs before and after it commit, reads included (on
    PostgreSQL the group is pipelined: the error must surface in its job)."""

    async def go():
        async with opened_store(tmp_path / "s.db", writes=True, log_format="text") as store:
            await store.write(_new_incarnation, "taken")
            before = store.writer.commits
            futs = [store.write(_new_incarnation, "before"),
                    store.write(_write_then_conflict, "undone", "taken"),
                    store.write(_exists, ["before", "taken"]),
                    store.write(_new_incarnation, "after")]
            done = await asyncio.gather(*futs, return_exceptions=True)
            assert store.writer.commits - before == 1, "the four jobs shared one commit"
            assert done[0] == "before" and done[2] == [True, True] and done[3] == "after", done
            assert isinstance(done[1], Exception) and "StoreUnavailable" not in type(done[1]).__name__, done
            assert await store.write(_exists, ["before", "undone", "after"]) == [True, False, True]

    asyncio.run(go())


def test_a_frame_flush_with_a_refused_write_replays_it_alone_and_keeps_its_frames(tmp_path):
    """run_flush runs its writes bare in a savepoint; one the database refuses
    undoes them all, then each runs again in a savepoint of its own: that one
    fails alone, the others and the flush's frames commit."""
    from agent_sidecar.store.records import Append, Message
    from agent_sidecar.turns.flush import FN, MSG, run_flush

    async def go():
        async with opened_store(tmp_path / "s.db", writes=True, log_format="text") as store:
            await store.write(_new_incarnation, "taken")
            await store.write(_new_incarnation, "chat")
            frames = [("r1", 1, "agent:main:t:dm:chat", "chat", "t", 1.0, "accepted", None)]
            writes = [(FN, (_new_incarnation, ("first",))), (FN, (_write_then_conflict, ("undone", "taken"))),
                      (MSG, Append("chat", (Message("user", "hi"),), "r1")), (FN, (_new_incarnation, ("last",)))]
            results, cursor = await store.write(run_flush, (1, 0), frames, writes)
            assert results[0] == "first" and results[3] == "last", results
            assert isinstance(results[1], Exception), results
            assert results[2][:2] == (1, 1), results  # the message's seqs
            assert cursor > 0
            assert await store.write(_exists, ["first", "undone", "last"]) == [True, False, True]
            frames_now = await store.frames_after(0, platform="t")
            assert [(f.request_id, f.kind) for f in frames_now] == [("r1", "accepted")]
            assert [m.content for m in await store.transcript("chat")] == ["hi"]

    asyncio.run(go())


def test_a_frame_flush_whose_row_of_one_session_the_store_refuses_commits_the_others(tmp_path):
    """A flush carries many sessions' items; the store refuses a frame of one
    (a trigger): the flush runs again session by session, that session's
    items (its write too) are refused alone, the others commit, and the
    flushes sent behind it are refused until the bus sends again from it (a
    refused session's later items must not land after its gap)."""
    from agent_sidecar.store.records import Append, Message
    from agent_sidecar.turns.flush import FN, MSG, FlushOutOfOrder, LanesRefused, run_flush

    good, bad = "agent:main:t:dm:good", "agent:main:t:dm:bad"
    rows = [("rg", 1, good, "good", "t", 1.0, "text_delta", b'{"text":"fine"}'),
            ("rb", 1, bad, "bad", "t", 1.0, "text_delta", b'{"text":"poisoned"}'),
            ("rg", 2, good, "good", "t", 1.0, "text_delta", b'{"text":"also fine"}')]
    writes = [(MSG, Append("good", (Message("user", "hi"),), "rg")), (FN, (_new_incarnation, ("bad-write",)))]

    async def go():
        async with opened_store(tmp_path / "s.db", writes=True, log_format="text") as store:
            await store.write(_new_incarnation, "good")
            with frames_refused(tmp_path / "s.db", "%poisoned%"):
                results, split = await store.write(run_flush, (1, 0), rows, writes, None, [good, bad])
                assert isinstance(split, LanesRefused) and split.lanes == {bad}, split
                assert results[0][:2] == (1, 1) and isinstance(results[1], Exception), results
                with pytest.raises(FlushOutOfOrder):
                    await store.write(run_flush, (2, 1), rows[:1], [], None, [])
            committed = await store.frames_after(0, platform="t")
            assert [(f.request_id, f.seq) for f in committed] == [("rg", 1), ("rg", 2)]
            assert sorted(split.cursors) == [f.cursor for f in committed]
            assert [m.content for m in await store.transcript("good")] == ["hi"]
            assert await store.write(_exists, ["bad-write"]) == [False]
            again = [("rg", 3, good, "good", "t", 1.0, "text_delta", b'{"text":"on"}')]
            _, cursor = await store.write(run_flush, (1, 0), again, [], None, [])
            assert cursor > max(split.cursors)

    asyncio.run(go())


class _Unpicklable(Exception):
    """An error that will not pickle: it holds a lock."""

    def __init__(self, message: str):
        super().__init__(message)
        self.lock = threading.Lock()


class _Unrebuildable(Exception):
    """An error that pickles but will not unpickle: its class takes two arguments."""

    def __init__(self, what: str, why: str):
        super().__init__(f"{what}: {why}")


def _raise(uow, kind: str) -> None:
    uow.incarnations.insert(kind, f"agent:main:t:dm:{kind}", 1.0)
    raise _Unpicklable("cannot pickle me") if kind == "unpicklable" else _Unrebuildable("cannot", "rebuild me")


@pytest.mark.parametrize("kind", ["unpicklable", "unrebuildable"])
def test_a_committed_flush_whose_write_failed_with_an_error_that_cannot_travel_is_answered_committed(
        tmp_path, kind):
    """A write of a flush fails with an error that cannot be sent to the
    parent as it is: the flush committed (its frames, its other writes), and
    it is answered so, the error named by its type and text. It was answered
    as failed (an error that would not pickle), so the bus took its committed
    frames for lost; or, for an error that pickles but does not unpickle, not
    answered at all (the parent could not read the answer): every job of the
    group waited for ever."""
    from agent_sidecar.turns.flush import FN, run_flush

    key = "agent:main:t:dm:chat"
    rows = [("r1", 1, key, "chat", "t", 1.0, "text_delta", b'{"text":"hi"}')]
    writes = [(FN, (_new_incarnation, ("first",))), (FN, (_raise, (kind,)))]

    async def go():
        async with opened_store(tmp_path / "s.db", writes=True, log_format="text") as store:
            flushed = store.write(run_flush, (1, 0), rows, writes, None, [key, key])
            other = store.write(_new_incarnation, "other")
            results, cursor = await asyncio.wait_for(flushed, 30)
            assert await asyncio.wait_for(other, 30) == "other"
            assert results[0] == "first" and isinstance(results[1], JobError), results
            assert str(results[1]).startswith(f"_{kind.capitalize()}: "), results[1]  # its type and text
            assert [(f.request_id, f.cursor) for f in await store.frames_after(0, platform="t")] == [("r1", cursor)]
            assert await store.write(_exists, ["first", kind, "other"]) == [True, False, True]

    asyncio.run(go())

"""When the store cannot write (issue 14, items 1, 2 and 12): a real full
filesystem, a real dead writer, real file modes.

The full disk is a small tmpfs this test mounts under its tmp dir, holding the
sidecar's data dir (the sidecar's log stays outside it), then fills with a
file and frees by deleting it. While the store cannot write, the sidecar is
NOT_SERVING, refuses writes and new prompts with UNAVAILABLE / ErrorInfo
STORE_UNAVAILABLE / RetryInfo, and ends its running turns; once space is free
every acknowledged turn has ended exactly once, with gapless seqs, and its lane
takes prompts again.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers.config import slow_echo
from helpers.disk import SmallDisk
from helpers.ids import source, words
from helpers.logs import log_lines
from helpers.sessions import create, msg, transcript
from helpers.store import writes_held
from helpers.streams import PromptRun, run_retrying, watch
from helpers.waiting import wait_until
from sidecar_proc import Sidecar, error_info, retry_delay
from test_store_writer import child_pids

from agent_sidecar.store import StoreUnavailable, open_store
from agent_sidecar.turns import flush as jobs
from agent_sidecar.v1 import session_service_pb2 as spb

TERMINAL = ("completed", "failed", "superseded")

SQLITE_DISK = pytest.mark.sqlite_only("a full filesystem under the SQLite file (PostgreSQL's disk is the server's)")


# Large enough that once free() runs, every write the tests asked for fits: the
# 42 large prompts of the acknowledged-while-filling test take ~34 MB when all
# complete (prompts queued behind a busy lane run only after the disk is freed),
# so a smaller disk could fill again for real and refuse the retries that follow.
DISK_MB = 64


@pytest.fixture
def disk(tmp_path):
    d = SmallDisk(tmp_path / "disk", DISK_MB)
    yield d
    d.unmount()


def on_disk(disk: SmallDisk, tmp_path, **kw) -> Sidecar:
    sc = Sidecar(disk.path / "data", **kw)
    sc.log_path = tmp_path / "sidecar.log"  # the log must not need the full disk
    return sc


# -- what the client sees ------------------------------------------------------------------

def health(sc, service: str = "") -> int:
    try:
        return health_pb2_grpc.HealthStub(sc.channel()).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5).status
    except grpc.RpcError:
        return -1


def every_health(sc) -> set[int]:
    """The statuses of the server and of each service by name (one status: a set of one)."""
    from agent_sidecar.api.server import SERVICE_NAMES
    return {health(sc, name) for name in ("", *SERVICE_NAMES)}


def assert_store_unavailable(err: grpc.RpcError) -> None:
    assert err.code() == grpc.StatusCode.UNAVAILABLE, (err.code(), err.details())
    assert error_info(err)[0] == "STORE_UNAVAILABLE", err.details()
    assert (retry_delay(err) or 0) > 0, err.details()


def big_append(sessions, session_id: str, n_bytes: int = 200_000):
    return sessions.AppendMessages(spb.AppendMessagesRequest(
        session_id=session_id, messages=[msg("user", os.urandom(n_bytes // 2).hex())]), timeout=10)


def append_until_refused(sessions, session_id: str) -> grpc.RpcError:
    """Large appends until one is refused: on a full disk the WAL must grow."""
    for _ in range(400):
        try:
            big_append(sessions, session_id)
        except grpc.RpcError as e:
            return e
    raise AssertionError("the store kept accepting writes on a full disk")


def assert_ended_once(sc, run: PromptRun) -> str:
    """The stream and the persisted frames (WatchActivity replay) agree: seqs
    1..N gapless, exactly one terminal frame, last; completed or failed
    STORE_UNAVAILABLE. Returns the terminal kind."""
    kinds = run.kinds()
    assert sum(k in TERMINAL for k in kinds) == 1 and kinds[-1] in TERMINAL, (run.request_id, kinds)
    seqs = [f.seq for f in run.frames]
    assert seqs == list(range(1, len(seqs) + 1)), (run.request_id, seqs)
    replay = watch(sc.prompts(), request_id=run.request_id)
    assert [f.seq for f in replay.frames] == seqs, run.request_id
    assert replay.kinds() == kinds, run.request_id
    end = kinds[-1]
    if end == "failed":
        assert run.last.failed.reason == "STORE_UNAVAILABLE", run.last.failed
        assert_store_unavailable(run.error)
    else:
        assert end == "completed", kinds
    return end


# -- item 1 and 2: a disk that fills and frees ----------------------------------------------

@SQLITE_DISK
def test_turns_end_once_and_the_store_recovers_when_the_disk_fills(disk, tmp_path):
    sc = on_disk(disk, tmp_path, config=slow_echo("main", latency_ms=30), workers=2).start()
    try:
        sessions, prompts = sc.sessions(), sc.prompts()
        chats = [source() for _ in range(6)]
        runs = [PromptRun(prompts, text=words(400), src=s, timeout=120) for s in chats]
        for r in runs:
            r.wait_for("started")
        spare = create(sessions)[0]
        disk.fill()
        err = append_until_refused(sessions, spare.session_id)
        assert_store_unavailable(err)
        # In the product's words: SQLite's ("database or disk is full") stay in the log.
        assert err.details() == "the store is unavailable: its disk is full; retry later", err.details()
        wait_until(lambda: every_health(sc) == {health_pb2.HealthCheckResponse.NOT_SERVING},
                   what="NOT_SERVING while the store cannot write, for every service name")
        # The health command: not ready (exit 1), but alive for a liveness probe (--live).
        health = [sys.executable, "-m", "agent_sidecar", "health", "--target", sc.target]
        for flags, status in (([], 1), (["--live"], 0)):
            r = subprocess.run(health + flags, capture_output=True, text=True, timeout=30)
            assert r.returncode == status and "NOT_SERVING" in r.stdout, (flags, r.stdout, r.stderr)
        # While it cannot write: writes and new prompts are refused, retryably.
        with pytest.raises(grpc.RpcError) as refused:
            big_append(sessions, spare.session_id, 100)
        assert_store_unavailable(refused.value)
        late = PromptRun(prompts, text="late", src=source(), timeout=30).result()
        assert late.frames == [] and late.error is not None, late.kinds()
        assert_store_unavailable(late.error)
        # Reads still answer.
        assert sessions.GetSession(spb.GetSessionRequest(session_key=spare.session_key),
                                   timeout=10).session.session_id == spare.session_id
        sessions.SearchMessages(spb.SearchMessagesRequest(query="w1"), timeout=10)
        disk.free()
        wait_until(lambda: every_health(sc) == {health_pb2.HealthCheckResponse.SERVING}, timeout=30,
                   what="SERVING once the store can write again, for every service name")
        ends = []
        for r in runs:
            r.result(timeout=60)
            ends.append(assert_ended_once(sc, r))
        assert "failed" in ends, ends  # the store's fault ended the turns streaming then
        # Every lane takes prompts again, and writes are accepted.
        again = [PromptRun(prompts, text="again", src=s, timeout=60) for s in chats]
        for r in again:
            r.result(timeout=60)
            assert r.end == "completed" and r.final_text == "again", (r.kinds(), r.error)
        assert big_append(sessions, spare.session_id, 100).last_seq > 0
    finally:
        disk.free()
        sc.stop()


def _status_lines(notify: socket.socket, wanted: str) -> list[str]:
    """sd_notify datagrams until one holds the line ``wanted``; that one's lines."""
    while True:
        lines = notify.recv(4096).decode().split("\n")
        if wanted in lines:
            return lines


@SQLITE_DISK
def test_systemd_hears_when_the_store_cannot_write_and_when_it_can_again(disk, tmp_path):
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify.sock"))
    notify.settimeout(30)
    sc = on_disk(disk, tmp_path, env={"NOTIFY_SOCKET": str(tmp_path / "notify.sock")}).start()
    try:
        assert "STATUS=serving" in _status_lines(notify, "READY=1")
        spare = create(sc.sessions())[0]
        disk.fill()
        assert_store_unavailable(append_until_refused(sc.sessions(), spare.session_id))
        _status_lines(notify, "STATUS=serving reads only: the store cannot write")
        disk.free()
        _status_lines(notify, "STATUS=serving")
        wait_until(lambda: health(sc) == health_pb2.HealthCheckResponse.SERVING, what="SERVING again")
    finally:
        disk.free()
        sc.stop()
        notify.close()


@SQLITE_DISK
def test_prompts_acknowledged_while_the_disk_fills_each_end_once(disk, tmp_path):
    """The issue's scenario: prompts keep coming while their own frames fill
    the disk; each acknowledged one ends exactly once, the others were refused
    with STORE_UNAVAILABLE, never INTERNAL."""
    sc = on_disk(disk, tmp_path, config=slow_echo("main", latency_ms=2), workers=2).start()
    try:
        prompts = sc.prompts()
        chats = [source() for _ in range(14)]
        disk.fill(leave=6 << 20)  # room for the first few turns
        runs = []
        for i in range(42):
            runs.append(PromptRun(prompts, text=f"p{i} {os.urandom(60_000).hex()} {words(40)}",
                                  src=chats[i % len(chats)], timeout=120))
            time.sleep(0.02)
        wait_until(lambda: all(r.frames or r.done.is_set() for r in runs), timeout=60,
                   what="every prompt acknowledged or refused")
        disk.free()
        wait_until(lambda: health(sc) == health_pb2.HealthCheckResponse.SERVING, timeout=30,
                   what="SERVING again")
        ended = {"completed": 0, "failed": 0, "refused": 0}
        for r in runs:
            r.result(timeout=90)
            if not r.frames:  # never acknowledged
                assert_store_unavailable(r.error)
                ended["refused"] += 1
            else:
                ended[assert_ended_once(sc, r)] += 1
        assert ended["refused"] + ended["failed"] > 0, ended  # the disk did fill
        for s in chats:  # every lane free again (a STORE_UNAVAILABLE says when to retry: a client does)
            r = run_retrying(prompts, text="after", src=s)
            assert r.kinds()[-1:] == ["completed"], (r.kinds(), r.code, r.reason, r.details, ended)
    finally:
        disk.free()
        sc.stop()


@SQLITE_DISK
def test_sigterm_with_a_full_disk_stops_without_a_traceback(disk, tmp_path):
    """A turn's end cannot commit: SIGTERM stops at once (no drain wait for
    a store that cannot write), without a traceback, with no marker and exit
    status 1; the next start closes that turn, one terminal frame, no gap."""
    sc = on_disk(disk, tmp_path, config=slow_echo("main", latency_ms=50)).start()
    try:
        sessions, prompts = sc.sessions(), sc.prompts()
        run = PromptRun(prompts, text=words(400), src=source(), timeout=60)
        run.wait_for("started")
        spare = create(sessions)[0]
        disk.fill()
        assert_store_unavailable(append_until_refused(sessions, spare.session_id))
        sc.proc.send_signal(signal.SIGTERM)
        assert sc.proc.wait(30) == 1, sc.log()
        run.result(timeout=10)  # its end could not commit: the stream says why
        assert run.code == grpc.StatusCode.UNAVAILABLE and run.reason == "STORE_UNAVAILABLE", run.error
        text = sc.log_path.read_text()
        assert "Traceback" not in text, text[-4000:]
        # the operator's one line on why there is no marker: the log line is the behaviour
        assert log_lines(sc, "stopped without a clean-shutdown marker"), text[-3000:]
        assert not (disk.path / "data" / ".clean_shutdown").exists()
    finally:
        disk.free()
        sc.stop()
    with on_disk(disk, tmp_path).start() as again:  # acknowledged: there, and ended once
        got = again.sessions().GetSession(spb.GetSessionRequest(session_key=spare.session_key),
                                          timeout=10).session
        assert got.session_id == spare.session_id
        replay = watch(again.prompts(), request_id=run.request_id)
        assert [f.seq for f in replay.frames] == list(range(1, len(replay.frames) + 1)), replay.kinds()
        assert replay.kinds()[-1] == "failed" and sum(k in TERMINAL for k in replay.kinds()) == 1


@SQLITE_DISK
def test_a_flush_behind_one_that_did_not_commit_waits_for_it(disk):
    """Store level (jobs.run_flush on a real writer, a real full disk): the
    frame bus keeps flushes in flight, so one sent behind a flush that failed
    must not commit before that one is sent again: it is refused
    (FlushOutOfOrder) even once space is free; in order, both commit and the
    request's seqs are gapless."""

    def rows(first: int, n: int, size: int) -> list[tuple]:
        body = b'{"text":"' + os.urandom(size // 2).hex().encode() + b'"}'
        return [("r1", seq, "agent:main:telegram:dm:1", "s1", "telegram", time.time(), "text_delta",
                 body) for seq in range(first, first + n)]

    async def flush(store, order, frame_rows):
        try:
            return True, await store.write(jobs.run_flush, order, frame_rows, [], retry=True)
        except Exception as e:
            return False, e

    async def go():
        store = open_store(path=str(disk.path / "s.db"), log_format="text")
        await store.start()
        try:
            assert (await flush(store, (1, 0), rows(1, 2, 100)))[0]
            disk.fill()
            big = rows(3, 50, 100_000)
            ok, err = await flush(store, (2, 1), big)
            assert not ok and isinstance(err, StoreUnavailable), err
            assert store.fault is not None
            disk.free()
            ok, err = await flush(store, (3, 2), rows(53, 2, 100))
            assert not ok and isinstance(err, jobs.FlushOutOfOrder), err
            assert (await flush(store, (2, 1), big))[0]
            assert (await flush(store, (3, 2), rows(53, 2, 100)))[0]
            assert [f.seq for f in await store.frames_after(0, session_key="agent:main:telegram:dm:1")
                    if f.request_id == "r1"] == list(range(1, 55))
            await wait_for(lambda: store.fault is None)
        finally:
            await store.close()

    asyncio.run(go())


async def wait_for(pred, timeout: float = 10) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.02)


# -- a store another process keeps locked ----------------------------------------------------

@pytest.mark.sqlite_only("the SQLite file's write lock held by another process")
def test_a_store_locked_past_the_busy_timeout_is_busy_in_the_products_words(tmp_path):
    """Another process holds the SQLite write lock past the busy timeout (10 s):
    the prompt is refused UNAVAILABLE / STORE_UNAVAILABLE with a retry delay,
    saying the store is busy and why. It used to say "the store failed
    (database is locked)", the driver's text, which DECISIONS.md keeps from
    users; that text is in the log (the writer's line), for the operator."""
    with Sidecar(tmp_path / "data", workers=1).start() as sc:
        with writes_held(sc):
            refused = PromptRun(sc.prompts(), text="x", src=source(), timeout=60).result(timeout=60)
        assert refused.code == grpc.StatusCode.UNAVAILABLE and refused.reason == "STORE_UNAVAILABLE", refused.details
        assert retry_delay(refused.error), refused.details
        assert "the store is busy: another process has held the SQLite write lock" in refused.details, refused.details
        assert "database is locked" not in refused.details, refused.details
        assert any("database is locked" in line.get("error", "")  # the operator's line is the behaviour
                   for line in log_lines(sc, "store commit failed")), sc.log()
        assert run_retrying(sc.prompts(), src=source(), text="again").final_text == "again"


@pytest.mark.sqlite_only("the SQLite file past the process's file size limit")
def test_a_final_checkpoint_the_disk_refuses_says_so_not_that_another_connection_held_it(tmp_path):
    """The store's files cannot grow (here: the process's file size limit,
    RLIMIT_FSIZE, as a quota would stop them): writes are refused, and the
    stop's final WAL checkpoint fails. Its log line says it failed and why
    (the operator's line is the behaviour); it said "another connection held
    the database", sending the operator after a process that was not there."""
    limit = 300_000  # past a new store's file; below it plus the new pages its WAL holds once refused
    with Sidecar(tmp_path / "data", workers=1, wrapper=["prlimit", f"--fsize={limit}", "--"]).start() as sc:
        session = create(sc.sessions())[0]
        with pytest.raises(grpc.RpcError) as refused:
            for _ in range(10):
                big_append(sc.sessions(), session.session_id, 100_000)
        assert_store_unavailable(refused.value)
    assert log_lines(sc, "final WAL checkpoint failed"), sc.log()
    assert not log_lines(sc, "final WAL checkpoint incomplete: another connection held the database"), sc.log()


# -- a writer that dies -----------------------------------------------------------------------

def test_calls_in_flight_when_the_writer_dies_answer_unavailable(tmp_path):
    """Turns streaming when the writer dies end UNAVAILABLE / STORE_UNAVAILABLE
    at once (not cut off by the shutdown); calls racing the death get OK or
    UNAVAILABLE (with ErrorInfo while the server still answers), never
    INTERNAL. A call that reaches the server as it closes may be cancelled
    by gRPC itself (CANCELLED, no ErrorInfo): a client cannot tell such a call
    from one in flight at the kill (on a loaded machine its thread may send it
    well after it last looked), so a racing call may end either way."""
    sc = Sidecar(tmp_path / "data", config=slow_echo("main", latency_ms=50), workers=1).start()
    try:
        sessions, prompts = sc.sessions(), sc.prompts()
        runs = [PromptRun(prompts, text=words(400), src=source(), timeout=60) for _ in range(3)]
        for r in runs:
            r.wait_for("started")
        spare = create(sessions)[0]
        stop, killed = threading.Event(), threading.Event()
        calls: list[tuple] = []  # (kind, begun before the kill, code, ErrorInfo reason)

        def hammer(kind: str) -> None:
            while not stop.is_set():
                before = not killed.is_set()
                try:
                    if kind == "append":
                        big_append(sessions, spare.session_id, 100)
                        code, reason = grpc.StatusCode.OK, None
                    else:
                        r = PromptRun(prompts, text="x", src=source(), timeout=20).result(timeout=30)
                        code, reason = r.code, r.reason
                except grpc.RpcError as e:
                    code, reason = e.code(), error_info(e)[0]
                calls.append((kind, before, code, reason))
                if code == grpc.StatusCode.UNAVAILABLE and reason is None:
                    return  # the server is gone: nothing more to learn

        threads = [threading.Thread(target=hammer, args=(k,), daemon=True)
                   for k in ("append", "append", "prompt")]
        for t in threads:
            t.start()
        wait_until(lambda: len(calls) >= 10, what="calls going on")
        killed.set()
        os.kill(child_pids(sc)["writer"], signal.SIGKILL)
        assert sc.proc.wait(30) == 1, sc.log()
        stop.set()
        for t in threads:
            t.join(30)
        for r in runs:  # the turns in flight: UNAVAILABLE with ErrorInfo, at once
            r.result(timeout=30)
            assert r.code == grpc.StatusCode.UNAVAILABLE, (r.code, r.error and r.error.details())
            assert r.reason == "STORE_UNAVAILABLE", r.error.details()
        ok = (grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
        bad = [c for c in calls if c[2] not in ok or c[3] not in (None, "STORE_UNAVAILABLE", "UNAVAILABLE")
               or (c[2] == grpc.StatusCode.CANCELLED and c[3] is not None)]
        assert not bad, bad
    finally:
        sc.stop()


def test_a_stop_with_a_stalled_writer_ends_without_the_marker_and_the_next_start_recovers(tmp_path):
    """The store's writer stops answering (stopped, as a hung disk or
    database leaves it) and the sidecar is asked to stop, then again: the
    stop gives up on what the writer does not answer after a while (the
    second signal shortens the wait for its close) and ends, exit 1, without
    the clean-shutdown marker; the next start recovers and the turn
    acknowledged before is there. The stop used to wait for the writer for
    ever, second signal or not, until the supervisor's SIGKILL."""
    sc = Sidecar(tmp_path / "data", workers=1).start()
    writer = child_pids(sc)["writer"]
    try:
        done = PromptRun(sc.prompts(), text="kept", src=source()).result(timeout=30)
        assert done.end == "completed", done.kinds()
        os.kill(writer, signal.SIGSTOP)
        sc.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: log_lines(sc, "stopping"), what="the stop under way")
        sc.proc.send_signal(signal.SIGTERM)
        assert sc.proc.wait(120) == 1, sc.log()
    finally:
        os.kill(writer, signal.SIGCONT)  # (killed with its parent, or already gone)
        sc.stop()
    assert not (sc.data_dir / ".clean_shutdown").exists()
    with sc.restart():
        assert [m.content for m in transcript(sc.sessions(), done.session_id)] == ["kept", "kept"], sc.log()


# -- item 12: private files ---------------------------------------------------------------------

def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.sqlite_only("the modes of the SQLite files")
def test_store_files_are_private(tmp_path):
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    os.chmod(data, 0o755)
    with Sidecar(data).start() as sc:
        create(sc.sessions())
        for name in ("sidecar.db", "sidecar.db-wal", "sidecar.db-shm"):
            assert mode(data / name) == 0o600, (name, oct(mode(data / name)))
        warned = log_lines(sc, "the data dir is readable by other users")  # the warning is the behaviour
        assert warned and warned[-1]["mode"] == "0755", warned
    # A store made 0644 by an older version is made private at start.
    os.chmod(data / "sidecar.db", 0o644)
    with Sidecar(data).start():
        assert mode(data / "sidecar.db") == 0o600
    # A data dir the sidecar creates is 0700 (the last --data-dir wins).
    fresh = tmp_path / "fresh" / "store"
    with Sidecar(tmp_path / "run", extra_args=["--data-dir", str(fresh)]).start():
        assert mode(fresh) == 0o700 and mode(fresh.parent) == 0o700
        assert mode(fresh / "sidecar.db") == 0o600

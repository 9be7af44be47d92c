"""ToolHost against a real sidecar (started with the server suite's helper,
tests/sidecar_proc.py): a registration the sidecar refuses raises its typed
error and leaves nothing running behind it."""

import asyncio
import contextlib
import logging
import re
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

import agent_sidecar_client as asc

pytest.importorskip("agent_sidecar")
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from helpers.certs import make_certs  # noqa: E402
from sidecar_proc import TOKEN, Sidecar, free_port  # noqa: E402


def test_a_refused_registration_leaves_no_task_behind(tmp_path):
    """A namespace the sidecar refuses: InvalidArgument naming it, and every
    task the host started ends (gRPC's request reader waited on the host's
    outbox for good: "Task was destroyed but it is pending!" at exit, one
    more task per refused attempt)."""
    sc = Sidecar(tmp_path / "data", workers=1).start()
    try:
        async def run():
            async with await asc.connect(sc.target) as client:
                host = asc.ToolHost("bad ns")
                host.tool(lambda: 1, name="bad ns.x")
                with pytest.raises(asc.InvalidArgument) as info:
                    async with host.running(client, timeout=10):
                        pass
                me = asyncio.current_task()
                deadline = time.monotonic() + 10
                while (left := [t for t in asyncio.all_tasks() if t is not me]) and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                return info.value, left

        err, left = asyncio.run(run())
    finally:
        sc.stop()
    assert err.field_violations[0][0] == "register.namespace", err.field_violations
    assert left == [], left


_CALL = '{{ tool_calls = [ {{ name = "errs.{}", arguments = {{}} }} ] }}'
TOOL_ERRORS = f'''
[profiles.errs]
model = "scripted"
tools = ["errs.*"]
model_options = {{ steps = [ {_CALL.format("own_timeout")}, {_CALL.format("own_cancel")}, {{ text = "done" }} ] }}
'''


def test_a_tools_own_timeout_and_cancel_are_its_failures(tmp_path):
    """A tool raising TimeoutError of its own was reported as the host's
    timeout ("timed out after N ms"); one raising CancelledError escaped
    invoke(), so no result was sent and the turn waited out the sidecar's tool
    timeout. Both are now the tool's failure, sent at once."""
    sc = Sidecar(tmp_path / "data", config=TOOL_ERRORS, workers=1).start()
    try:
        async def run():
            async with await asc.connect(sc.target) as client:
                host = asc.ToolHost("errs")

                @host.tool
                async def own_timeout() -> None:
                    raise TimeoutError("the database took too long")

                @host.tool
                async def own_cancel() -> None:
                    raise asyncio.CancelledError("a future it waited on was cancelled")

                async with host.running(client):
                    return await client.prompt("go", source={"platform": "t", "chat_id": "errs"},
                                               profile="errs").collect()

        frames = asyncio.run(asyncio.wait_for(run(), 20))
    finally:
        sc.stop()
    results = [f.tool_result for f in frames if asc.frame_kind(f) == "tool_result"]
    assert [r.ok for r in results] == [False, False], results
    assert "TimeoutError: the database took too long" in results[0].result_json, results[0]
    assert "timed out after" not in results[0].result_json
    assert "CancelledError: a future it waited on was cancelled" in results[1].result_json, results[1]
    assert asc.frame_kind(frames[-1]) == "completed"


BIG = f'''
[sidecar.limits]
max_text_bytes = 1000

[profiles.big]
model = "scripted"
tools = ["big.*"]
model_options = {{ steps = [ {_CALL.replace("errs.", "big.").format("answer")}, {{ text = "done" }} ] }}
'''


def test_a_result_the_sidecar_refuses_does_not_end_the_host(tmp_path):
    """A result past the sidecar's limits (a result_json over max_text_bytes) is
    refused with INVALID_ARGUMENT, and the sidecar ends that ServeTools stream.
    The host registered fine: it re-registers and answers the next call, instead
    of serve() raising and every later call finding "no tool host serves"."""
    sc = Sidecar(tmp_path / "data", config=BIG, workers=1).start()
    try:
        async def run():
            async with await asc.connect(sc.target) as client:
                host = asc.ToolHost("big")
                sizes = [5000, 10]

                @host.tool
                async def answer() -> str:
                    return "x" * sizes.pop(0)

                turns = []
                async with host.running(client):
                    for i in range(2):
                        await host.wait_registered(10)
                        turns.append(await client.prompt("go", source={"platform": "t", "chat_id": f"big{i}"},
                                                          profile="big").collect())
                return turns

        turns = asyncio.run(asyncio.wait_for(run(), 30))
    finally:
        sc.stop()
    results = [[f.tool_result for f in t if asc.frame_kind(f) == "tool_result"][0] for t in turns]
    assert not results[0].ok  # the refused one: the call failed, as the host was cut
    assert (results[1].ok, results[1].result_json) == (True, '"xxxxxxxxxx"'), results[1]


HUNG = f'''
[profiles.hung]
model = "scripted"
tools = ["hung.*"]
tool_timeout_s = 3
model_options = {{ steps = [ {_CALL.replace("errs.", "hung.").format("stuck")},
                             {_CALL.replace("errs.", "hung.").format("quick")}, {{ text = "done" }} ] }}
'''


def test_a_hung_sync_tool_neither_starves_the_others_nor_holds_up_exit(tmp_path):
    """A sync tool ran in the event loop's default executor: one that never
    returns (past its timeout) kept a worker for good, so once the pool's
    workers were all held every other sync tool timed out without running, and
    asyncio.run() waited for it at exit (shutting the executor down), so the
    adapter could not stop. Each sync call now runs in a daemon thread of its
    own. (The loop's pool here has one worker, as a small machine's could have
    all of its workers held.)"""
    sc = Sidecar(tmp_path / "data", config=HUNG, workers=1).start()
    release = threading.Event()
    outcome: list = []

    async def run():
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(1))
        async with await asc.connect(sc.target) as client:
            host = asc.ToolHost("hung")

            @host.tool
            def stuck() -> str:
                release.wait()  # ignores its timeout, as a blocked call would
                return "late"

            @host.tool
            def quick() -> str:
                return "quick"

            async with host.running(client):
                return await client.prompt("go", source={"platform": "t", "chat_id": "hung"},
                                           profile="hung").collect()

    runner = threading.Thread(target=lambda: outcome.append(asyncio.run(run())), daemon=True)
    try:
        runner.start()
        runner.join(30)  # a guard: asyncio.run() returned, or it hangs on the stuck tool
        finished = not runner.is_alive()
    finally:
        release.set()
        runner.join(10)
        sc.stop()
    assert finished, "asyncio.run() did not return: it waited for the hung tool's thread"
    results = [f.tool_result for f in outcome[0] if asc.frame_kind(f) == "tool_result"]
    assert [r.ok for r in results] == [False, True], results  # the stuck one timed out; quick ran
    assert results[1].result_json == '"quick"'


def test_a_host_that_cannot_reach_its_sidecar_reports_each_retry(tmp_path, caplog):
    """A host whose sidecar is not there (not started yet, or a wrong socket
    path) keeps trying, as an adapter started first must, and says so: each
    failed attempt goes to on_retry, and without one the first is logged, as
    the Go and Node hosts do. Before, it retried in silence for good."""
    async def run(on_retry=None):
        async with await asc.connect(f"unix:{tmp_path}/nobody.sock", wait_ready=False) as client:
            host = asc.ToolHost("t")
            host.tool(lambda: 1, name="t.x")
            task = asyncio.create_task(host.serve(client, on_retry=on_retry))
            if on_retry is None:
                while not _ours(caplog.records):
                    await asyncio.sleep(0.05)
            else:
                await reported.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    retries: list = []
    reported = asyncio.Event()

    def on_retry(attempt, error):
        retries.append((attempt, error))
        reported.set()

    asyncio.run(asyncio.wait_for(run(on_retry), 20))
    attempt, error = retries[0]
    assert attempt == 1
    assert type(error) is asc.SidecarError and error.code == grpc.StatusCode.UNAVAILABLE, error
    assert "nobody.sock" in str(error)

    caplog.set_level(logging.WARNING, logger="agent_sidecar_client")
    asyncio.run(asyncio.wait_for(run(), 20))
    assert "ToolHost 't': ServeTools failed (attempt 1), retrying" in _ours(caplog.records)[0].getMessage()


def _ours(records: list) -> list:
    """The client's own log records (asyncio's may come too: gRPC's poller of
    a loop an earlier test closed complains in the next one)."""
    return [r for r in records if r.name.startswith("agent_sidecar_client")]


def test_a_tls_failure_ends_serve_at_once(tmp_path):
    """A CA that did not sign the sidecar's certificate: no wait mends it, so
    serve raises the handshake failure (as the Go and Node hosts do) instead of
    retrying in silence for good."""
    certs = make_certs(tmp_path / "certs")
    port = free_port()
    config = '[[auth.tokens]]\ntoken = "tok"\nplatforms = ["*"]\n' + certs.listener(f"127.0.0.1:{port}")
    sc = Sidecar(tmp_path / "data", config=config, workers=1).start()
    try:
        async def run():
            async with await asc.connect(f"127.0.0.1:{port}", "tok", ca_file=certs.other_ca,
                                         wait_ready=False) as client:
                host = asc.ToolHost("t")
                host.tool(lambda: 1, name="t.x")
                with pytest.raises(asc.SidecarError) as info:
                    await host.serve(client, on_retry=lambda attempt, error: pytest.fail(f"retried: {error}"))
                return info.value

        error = asyncio.run(asyncio.wait_for(run(), 20))
    finally:
        sc.stop()
    assert error.code == grpc.StatusCode.UNAVAILABLE and error.reason == "", error
    assert "CERTIFICATE_VERIFY_FAILED" in str(error), error


def test_running_says_why_the_tools_are_not_registered(tmp_path):
    """A host whose sidecar is out of reach: running() gives up after its
    timeout naming the last attempt's failure (the missing socket), and the
    attempts still go to on_retry. Before, only "not registered within 1s"."""
    retries: list = []

    async def run() -> asc.SidecarError:
        async with await asc.connect(f"unix:{tmp_path}/nobody.sock", wait_ready=False) as client:
            host = asc.ToolHost("t")
            host.tool(lambda: 1, name="t.x")
            with pytest.raises(asc.SidecarError) as info:
                async with host.running(client, timeout=1, on_retry=lambda *a: retries.append(a)):
                    pass
            return info.value

    error = asyncio.run(asyncio.wait_for(run(), 20))
    assert error.code == grpc.StatusCode.DEADLINE_EXCEEDED, error
    assert "not registered within 1s; last attempt:" in str(error) and "nobody.sock" in str(error), error
    assert isinstance(error.__cause__, asc.SidecarError) and retries, (error.__cause__, retries)


def test_serve_failing_inside_running_ends_the_block_with_its_error(tmp_path):
    """serve ends for good while the block runs (the sidecar comes back with
    another token, so the host's registration after the reconnect is refused):
    the block is cancelled and running() raises serve's error. Before, the block
    went on as if the tools were served, and the error was dropped at its end."""
    sc = Sidecar(tmp_path / "data", tcp=True, workers=1).start()

    async def run() -> BaseException:
        async with await asc.connect(sc.tcp_target, TOKEN) as client:
            host = asc.ToolHost("t")
            host.tool(lambda: 1, name="t.x")
            with pytest.raises(BaseException) as info:
                async with host.running(client):
                    await asyncio.to_thread(sc.stop)
                    sc.config_text = '[[auth.tokens]]\ntoken = "another"\nadmin = true\n'
                    await asyncio.to_thread(sc.start)
                    await asyncio.Event().wait()  # the adapter's own work, for good
            return info.value

    try:
        error = asyncio.run(asyncio.wait_for(run(), 30))
    finally:
        sc.stop()
    assert isinstance(error, asc.Unauthenticated), repr(error)


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_a_connection_closed_at_setup_is_retried_not_raised(tmp_path, tls):
    """A peer that accepts and closes every connection (a proxy whose sidecar
    is down, as Docker's port forwarding does) is an outage: the host keeps
    trying. Over TLS, gRPC words it "Handshake read failed (Socket closed)"
    (or "(... Connection reset by peer)"), which the host took for a TLS
    failure no wait mends, and raised at once: a host behind such a proxy
    stopped for good at the first outage."""
    closer = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def close_each() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                conn, _ = closer.accept()
                conn.close()

    threading.Thread(target=close_each, daemon=True).start()
    retries: list = []

    async def run() -> None:
        target = f"127.0.0.1:{closer.getsockname()[1]}"
        ca = {"ca_file": make_certs(tmp_path / "certs").ca} if tls else {}
        async with await asc.connect(target, wait_ready=False, **ca) as client:
            host = asc.ToolHost("t")
            host.tool(lambda: 1, name="t.x")
            task = asyncio.create_task(host.serve(client, on_retry=lambda *a: retries.append(a)))
            while not retries and not task.done():  # on_retry: serve chose to retry, not raise
                await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    try:
        asyncio.run(asyncio.wait_for(run(), 30))
    finally:
        stop.set()
        closer.close()
    assert [a for a, _ in retries] == [1], retries
    assert re.search("Socket closed|Connection reset", str(retries[0][1])), retries[0][1]  # (a race of the close)

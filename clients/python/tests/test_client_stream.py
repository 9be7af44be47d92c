"""FrameStream over fake calls: resume after a drop, no gap, no duplicate, typed errors."""

import asyncio

import grpc
import pytest
from _client_fakes import FakeCall, FakeChannel, FakeRpcError, frame, status_trailers
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

import agent_sidecar_client as asc
from agent_sidecar_client._args import Deadline
from agent_sidecar_client._stream import FrameStream


def make_stream(calls, resume_log=None, **kw):
    """A FrameStream whose first open returns calls[0] and each resume the next."""
    calls = list(calls)
    flt = asc.SeqFilter()

    def open_first():
        return calls.pop(0)

    def open_resume():
        if resume_log is not None:
            resume_log.append(flt.last_seq)
        return calls.pop(0)

    return FrameStream(FakeChannel(), open_first, open_resume, flt, request_id="r1", **kw)


async def seqs(stream):
    return [f.seq async for f in stream]


def test_resume_after_unavailable_has_no_gap_or_duplicate():
    log = []
    first = FakeCall([frame(1, "accepted"), frame(2, "started"), frame(3)],
                     FakeRpcError(grpc.StatusCode.UNAVAILABLE, "connection reset"))
    # The resumed stream overlaps (2, 3 again) and carries a keepalive.
    second = FakeCall([frame(2, "started"), frame(3), frame(3, "keepalive"), frame(4), frame(5, "completed")])
    stream = make_stream([first, second], log)
    assert asyncio.run(seqs(stream)) == [1, 2, 3, 4, 5]
    assert stream.resumes == 1 and log == [3]


def test_gap_triggers_resume_from_last_good_seq():
    log = []
    first = FakeCall([frame(1), frame(2), frame(4)], hang=True)
    second = FakeCall([frame(3), frame(4), frame(5, "completed")])
    stream = make_stream([first, second], log)
    assert asyncio.run(seqs(stream)) == [1, 2, 3, 4, 5]
    assert log == [2] and first.cancelled


def test_clean_end_without_terminal_is_final():
    """The sidecar ends a request's stream OK only once the turn is over: a
    Prompt stream that ends so before its terminal frame lost the rest of the
    turn (TurnFramesGone), it is not resumed (it was, for the whole window)."""
    stream = make_stream([FakeCall([frame(1)]), FakeCall([frame(2, "completed")])], resume_timeout=0.5)
    with pytest.raises(asc.TurnFramesGone) as info:
        asyncio.run(seqs(stream))
    assert stream.resumes == 0 and "gone" in info.value.message


def test_drop_cuts_the_live_call_and_resumes():
    first = FakeCall([frame(1), frame(2), frame(3)], hang=True)
    second = FakeCall([frame(4), frame(5, "completed")])
    stream = make_stream([first, second])

    async def run():
        got = []
        async for f in stream:
            got.append(f.seq)
            if f.seq == 3:
                stream.drop()
        return got

    assert asyncio.run(run()) == [1, 2, 3, 4, 5]
    assert first.cancelled and stream.resumes == 1


def test_failed_frame_is_yielded_then_typed_error_raised():
    trailers = status_trailers(grpc.StatusCode.PERMISSION_DENIED, "TOOL_SCOPE_VIOLATION", "other.x")
    call = FakeCall([frame(1, "accepted"), frame(2, "failed", reason="TOOL_SCOPE_VIOLATION", message="other.x")],
                    FakeRpcError(grpc.StatusCode.PERMISSION_DENIED, "other.x", trailers))
    stream = make_stream([call])

    async def run():
        got = []
        with pytest.raises(asc.ToolScopeViolation) as info:
            async for f in stream:
                got.append(asc.frame_kind(f))
        return got, info.value

    kinds, err = asyncio.run(run())
    assert kinds == ["accepted", "failed"]
    assert err.reason == "TOOL_SCOPE_VIOLATION" and err.code == grpc.StatusCode.PERMISSION_DENIED


def test_failed_frame_without_status_still_raises():
    stream = make_stream([FakeCall([frame(1, "failed", reason="CANCELLED")])])
    with pytest.raises(asc.Cancelled):
        asyncio.run(seqs(stream))


def test_error_with_error_info_is_not_resumed():
    busy = FakeRpcError(grpc.StatusCode.ABORTED, "busy", status_trailers(grpc.StatusCode.ABORTED, "AGENT_BUSY"))
    stream = make_stream([FakeCall([], busy)])
    with pytest.raises(asc.AgentBusy):
        asyncio.run(seqs(stream))
    assert stream.resumes == 0


def test_resume_gives_up_after_resume_timeout():
    down = [FakeCall([], FakeRpcError(grpc.StatusCode.UNAVAILABLE, "down")) for _ in range(100)]
    stream = make_stream(down, resume_timeout=0.3)
    with pytest.raises(asc.SidecarError) as info:
        asyncio.run(seqs(stream))
    assert info.value.code == grpc.StatusCode.UNAVAILABLE and "not resumed" in info.value.message


def test_unavailable_with_foreign_error_info_is_resumed():
    st = _foreign_unavailable()
    first = FakeCall([frame(1, "accepted"), frame(2, "started")],
                     FakeRpcError(grpc.StatusCode.UNAVAILABLE, "upstream connect error", st))
    second = FakeCall([frame(3, "completed")])
    stream = make_stream([first, second])
    assert asyncio.run(seqs(stream)) == [1, 2, 3]
    assert stream.resumes == 1


def _foreign_unavailable() -> tuple:
    """A proxy's trailer: UNAVAILABLE with an ErrorInfo of a foreign domain."""
    packed = any_pb2.Any()
    packed.Pack(error_details_pb2.ErrorInfo(reason="CANCELLED", domain="envoy.example.com"))
    status = status_pb2.Status(code=grpc.StatusCode.UNAVAILABLE.value[0], message="upstream", details=[packed])
    return (("grpc-status-details-bin", status.SerializeToString()),)


class _NeverReady:
    """A channel whose sidecar never comes back."""

    async def channel_ready(self) -> None:
        await asyncio.Event().wait()


def test_turn_deadline_bounds_the_resume_wait():
    flt = asc.SeqFilter()
    calls = [FakeCall([frame(1, "accepted")], FakeRpcError(grpc.StatusCode.UNAVAILABLE, "gone"))]
    stream = FrameStream(_NeverReady(), lambda: calls.pop(0), lambda: calls.pop(0), flt,
                         request_id="r1", resume_timeout=30.0, deadline=Deadline(0.3))

    async def run():
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(asc.DeadlineExceeded) as info:
            await asyncio.wait_for(seqs(stream), 5.0)
        return info.value, asyncio.get_running_loop().time() - t0

    err, elapsed = asyncio.run(run())
    assert (err.code, err.reason) == (grpc.StatusCode.DEADLINE_EXCEEDED, "")
    assert "deadline" in err.message and elapsed < 2.0


@pytest.mark.parametrize("timeout", [0, -1.0, float("nan"), float("inf")])
def test_a_turn_timeout_that_is_no_deadline_is_refused_before_any_call(timeout):
    """NaN became a 1 ms deadline for every call of the turn (``max(0.001,
    nan)``), so the turn failed as AGENT_TIMEOUT instead of naming the typo."""
    async def main():
        client = asc.SidecarClient("unix:/nonexistent/sidecar.sock")
        try:
            with pytest.raises(ValueError, match="timeout"):
                client.prompt("hi", session_key="k", timeout=timeout)
        finally:
            await client.close()
    asyncio.run(main())


@pytest.mark.parametrize("token", ["se\ncret", "sécret", "se\tcret"])
def test_a_token_grpc_metadata_cannot_carry_is_refused_without_echoing_it(token):
    """Before, it was accepted here and every call failed INTERNAL "Invalid metadata"."""
    with pytest.raises(ValueError, match="token") as e:
        asc.SidecarClient("unix:/nonexistent/sidecar.sock", token)
    assert "cret" not in str(e.value)


@pytest.mark.parametrize("timeout", [-1.0, float("nan"), float("inf")])
def test_a_wait_that_is_no_wait_is_refused(timeout):
    """Before, NaN was "no sidecar reachable ... within nans" (UNAVAILABLE) at once."""
    async def main():
        client = asc.SidecarClient("unix:/nonexistent/sidecar.sock")
        try:
            with pytest.raises(ValueError, match="timeout"):
                await client.wait_ready(timeout)
        finally:
            await client.close()
    asyncio.run(main())


def test_a_tool_name_registered_twice_is_refused():
    """Before, the second function silently replaced the first."""
    host = asc.ToolHost("t")
    host.tool(lambda x: x, name="t.a")
    with pytest.raises(ValueError, match="registered already"):
        host.tool(lambda x: 2 * x, name="t.a")

"""The shipped gRPC service config and the default deadline, over a real
in-process grpc.aio server that fails on purpose: the idempotent reads are
retried on UNAVAILABLE, writes are not, and every unary call carries a
deadline unless the client is told otherwise."""

import asyncio
import json
from pathlib import Path

import grpc
import pytest

import agent_sidecar_client as asc
from agent_sidecar_client import client as client_mod
from agent_sidecar_client._proto import common_pb2 as common
from agent_sidecar_client._proto import session_service_pb2 as pb
from agent_sidecar_client._proto import session_service_pb2_grpc as pb_grpc

REPO_CONFIG = Path(__file__).resolve().parents[2] / "service_config.json"
READS = {"GetSession", "ListSessions", "GetTranscript", "SearchMessages", "GetSessionContext", "GetQueue"}


class FlakySessions(pb_grpc.SessionServiceServicer):
    """Fails the first ``failures`` calls of each method with UNAVAILABLE."""

    def __init__(self, failures: int):
        self.failures = failures
        self.calls: dict[str, int] = {}
        self.deadlines: list[float | None] = []

    async def _maybe_fail(self, name, context):
        self.calls[name] = self.calls.get(name, 0) + 1
        self.deadlines.append(context.time_remaining())
        if self.calls[name] <= self.failures:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "try again")

    async def GetSession(self, request, context):
        await self._maybe_fail("GetSession", context)
        return pb.GetSessionResponse(session=common.Session(session_key=request.session_key))

    async def ResetSession(self, request, context):
        await self._maybe_fail("ResetSession", context)
        return pb.ResetSessionResponse(session=common.Session(session_key=request.session_key))


async def with_server(servicer, body, **connect_args):
    server = grpc.aio.server()
    pb_grpc.add_SessionServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with await asc.connect(f"127.0.0.1:{port}", **connect_args) as client:
            return await body(client)
    finally:
        await server.stop(0)


def test_the_packaged_config_is_the_repository_one_and_retries_only_reads():
    assert json.loads(client_mod.SERVICE_CONFIG) == json.loads(REPO_CONFIG.read_text())
    (method_config,) = json.loads(client_mod.SERVICE_CONFIG)["methodConfig"]
    assert {n["method"] for n in method_config["name"]} == READS
    assert method_config["retryPolicy"]["retryableStatusCodes"] == ["UNAVAILABLE"]


def test_a_read_is_retried_on_unavailable():
    fake = FlakySessions(failures=2)

    async def body(client):
        return await client.get_session(session_key="agent:main:local:dm:me")

    session = asyncio.run(with_server(fake, body))
    assert session.session_key == "agent:main:local:dm:me"
    assert fake.calls["GetSession"] == 3


def test_a_write_is_not_retried():
    fake = FlakySessions(failures=1)

    async def body(client):
        with pytest.raises(asc.SidecarError) as info:
            await client.reset_session("agent:main:local:dm:me")
        return info.value

    err = asyncio.run(with_server(fake, body))
    assert err.code == grpc.StatusCode.UNAVAILABLE
    assert fake.calls["ResetSession"] == 1


def test_a_caller_supplied_service_config_replaces_the_shipped_one():
    fake = FlakySessions(failures=1)
    no_retries = json.dumps({"methodConfig": [{"name": [{"service": "agent_sidecar.v1.SessionService"}]}]})

    async def body(client):
        with pytest.raises(asc.SidecarError):
            await client.get_session(session_key="agent:main:local:dm:me")

    asyncio.run(with_server(fake, body, options=[("grpc.service_config", no_retries)]))
    assert fake.calls["GetSession"] == 1


def test_unary_calls_get_a_default_deadline_that_can_be_changed():
    async def body(client):
        await client.get_session(session_key="agent:main:local:dm:me")

    default, custom, none = FlakySessions(0), FlakySessions(0), FlakySessions(0)
    asyncio.run(with_server(default, body))
    asyncio.run(with_server(custom, body, call_timeout=5))
    asyncio.run(with_server(none, body, call_timeout=None))
    # The grpc-timeout header is rounded up in transit: allow a second's slack.
    assert client_mod.DEFAULT_CALL_TIMEOUT == 30.0
    assert 10 < default.deadlines[0] <= 31
    assert 0 < custom.deadlines[0] <= 6
    assert none.deadlines[0] is None

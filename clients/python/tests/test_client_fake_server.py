"""The library against a tiny in-process grpc.aio server: real calls, real
cancellation, real status trailers (the real sidecar is covered by the
conformance suite, clients/conformance/run.py)."""

import asyncio

import grpc
import pytest
from _client_fakes import frame, status_trailers

import agent_sidecar_client as asc
from agent_sidecar_client._proto import prompt_service_pb2 as pb
from agent_sidecar_client._proto import prompt_service_pb2_grpc as pb_grpc
from agent_sidecar_client._proto import tool_service_pb2 as tool_pb
from agent_sidecar_client._proto import tool_service_pb2_grpc as tool_grpc


class FakePrompts(pb_grpc.PromptServiceServicer):
    """Echo turns at 20 ms a word; frames kept per request for WatchActivity."""

    def __init__(self):
        self.frames: dict[str, list] = {}
        self.turns = 0

    async def _turn(self, req):
        frames = self.frames.setdefault(req.request_id, [])
        self.turns += 1
        words = req.text.split()
        kinds = [("accepted", {}), ("started", {})] + [("text_delta", {"text": w}) for w in words]
        for kind, payload in kinds + [("completed", {"final_text": req.text})]:
            frames.append(frame(len(frames) + 1, kind, req.request_id, **payload))
            await asyncio.sleep(0.02)

    async def _follow(self, request_id, after):
        while True:
            frames = self.frames.get(request_id, [])
            while after < len(frames):
                after += 1
                yield pb.PromptResponse(frame=frames[after - 1])
                if frames[after - 1].WhichOneof("event") == "completed":
                    return
            await asyncio.sleep(0.005)

    async def Prompt(self, req, context):
        if req.text == "busy":
            await context.abort(grpc.StatusCode.ABORTED, "busy",
                                status_trailers(grpc.StatusCode.ABORTED, "AGENT_BUSY", "busy"))
        if req.text == "scope":
            yield pb.PromptResponse(frame=frame(1, "accepted", req.request_id))
            yield pb.PromptResponse(frame=frame(2, "failed", req.request_id, reason="TOOL_SCOPE_VIOLATION"))
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "other.x",
                                status_trailers(grpc.StatusCode.PERMISSION_DENIED, "TOOL_SCOPE_VIOLATION", "other.x"))
        if req.text == "silent":  # accepted, then nothing ever (a connection that stopped answering)
            yield pb.PromptResponse(frame=frame(1, "accepted", req.request_id))
            await asyncio.sleep(3600)
        if req.request_id not in self.frames:
            asyncio.get_running_loop().create_task(self._turn(req))
        async for response in self._follow(req.request_id, 0):
            yield response

    async def WatchActivity(self, req, context):
        async for response in self._follow(req.request_id, req.after_seq):
            yield response


class FakeTools(tool_grpc.ToolServiceServicer):
    def __init__(self):
        self.results = asyncio.Queue()

    async def ServeTools(self, request_iterator, context):
        first = await request_iterator.__anext__()
        names = [t.name for t in first.register.tools]
        yield tool_pb.ServeToolsResponse(registered=tool_pb.ToolsRegistered(
            namespace=first.register.namespace, tool_names=names))
        for n, args in enumerate(['{"a": 2, "b": 3}', '{"a": "x"}']):
            yield tool_pb.ServeToolsResponse(invocation=tool_pb.ToolInvocation(
                invocation_id=f"i{n}", tool_name="conf.python.add", arguments_json=args, timeout_ms=2000))
        async for message in request_iterator:
            await self.results.put(message.result)


async def with_server(body, **client_options):
    server = grpc.aio.server()
    prompts, tools = FakePrompts(), FakeTools()
    pb_grpc.add_PromptServiceServicer_to_server(prompts, server)
    tool_grpc.add_ToolServiceServicer_to_server(tools, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with await asc.connect(f"127.0.0.1:{port}", token="t", **client_options) as client:
            return await body(client, prompts, tools)
    finally:
        await server.stop(0)


def test_drop_mid_turn_resumes_with_watch_activity():
    async def body(client, prompts, _):
        stream = client.prompt("a b c d e f", session_key="k")
        seen = []
        async for f in stream:
            seen.append(f)
            if len(seen) == 3:
                stream.drop()
        return seen, stream.resumes, prompts.turns

    seen, resumes, turns = asyncio.run(with_server(body))
    assert [f.seq for f in seen] == list(range(1, 10))
    assert asc.frame_kind(seen[-1]) == "completed" and seen[-1].completed.final_text == "a b c d e f"
    assert resumes == 1 and turns == 1


def test_typed_errors_over_the_wire():
    async def body(client, *_):
        with pytest.raises(asc.AgentBusy):
            await client.prompt("busy", session_key="k").collect()
        kinds = []
        with pytest.raises(asc.ToolScopeViolation) as info:
            async for f in client.prompt("scope", session_key="k"):
                kinds.append(asc.frame_kind(f))
        return kinds, info.value

    kinds, err = asyncio.run(with_server(body))
    assert kinds == ["accepted", "failed"] and err.message == "other.x"


def test_tool_host_registers_and_answers():
    host = asc.ToolHost("conf.python")

    @host.tool(description="Add two integers.")
    async def add(a: int, b: int) -> int:
        return a + b

    async def body(client, _, tools):
        async with host.running(client):
            assert list(host.registered.tool_names) == ["conf.python.add"]
            results = sorted([await tools.results.get(), await tools.results.get()], key=lambda r: r.invocation_id)
        return results

    ok, bad = asyncio.run(with_server(body))
    assert (ok.ok, ok.result_json) == (True, "5")
    assert not bad.ok and "TypeError" in bad.error


def test_schema_from_signature():
    host = asc.ToolHost("x")

    @host.tool
    def f(a: int, b: str = "", c=None):
        """Doc."""

    spec = host.tools["x.f"]
    assert spec.description == "Doc."
    assert spec.schema == {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                                                            "c": {}}, "required": ["a"]}


IDLE = 0.3  # seconds a stream may go without a frame in these tests


def test_a_caller_slow_over_a_frame_is_no_stalled_connection():
    """The idle watchdog timed the caller's work on a frame too: a consumer
    taking longer than the idle timeout over one had its healthy call cut
    and the client's channel replaced."""
    async def body(client, *_):
        channel = client.channel
        stream = client.prompt("a b c", session_key="k")
        kinds = []
        async for f in stream:
            kinds.append(asc.frame_kind(f))
            if len(kinds) == 1:
                await asyncio.sleep(IDLE * 3)  # a slow consumer, not a silent connection
        return kinds, stream.resumes, client.channel is channel

    kinds, resumes, same_channel = asyncio.run(with_server(body, stream_idle_timeout=IDLE))
    assert kinds[-1] == "completed" and resumes == 0 and same_channel


def test_a_stalled_stream_replaces_the_channel_without_cutting_the_others_on_it():
    """Replacing the channel closed the old one, which cancelled every other
    call on it: another turn's stream raised a bare CancelledError and a
    ToolHost stopped serving for good."""
    host = asc.ToolHost("conf.python")

    @host.tool(description="Add two integers.")
    async def add(a: int, b: int) -> int:
        return a + b

    async def body(client, _, tools):
        channel = client.channel
        async with host.running(client):
            silent = asyncio.ensure_future(client.prompt("silent", session_key="s", resume_timeout=IDLE * 4).collect())
            other = await client.prompt(" ".join(f"w{i}" for i in range(40)), session_key="k").collect()
            replaced = client.channel is not channel
            with pytest.raises(asc.SidecarError):
                await silent  # it never gets its turn's end: it gives up after its resume window
            results = [await tools.results.get(), await tools.results.get()]
            return other, replaced, results

    other, replaced, results = asyncio.run(with_server(body, stream_idle_timeout=IDLE))
    assert replaced, "the silent stream's watchdog replaced the channel"
    assert asc.frame_kind(other[-1]) == "completed" and len(other) == 43
    assert sorted(r.invocation_id for r in results) == ["i0", "i1"]


"""The API boundary (api/boundary.py, api/caps.py): what a hostile request can
cost the sidecar and what it gets back.

* every string, bytes and repeated field of every request has a cap, and the
  largest request an RPC accepts follows from them;
* a request past its RPC's size, or with a field past its cap, is
  INVALID_ARGUMENT naming the field, and the error quotes at most a short
  prefix of the input (a status message travels in the trailers, which the
  client caps);
* bytes protobuf cannot parse are INVALID_ARGUMENT naming the field, with
  ErrorInfo, and one short log line;
* large requests, refused or not, authenticated or not, leave the parent's
  memory where it was.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from helpers import procs
from helpers.ids import rid
from helpers.ids import source as src
from helpers.sessions import assert_serving, rpc_error, seed, turns
from helpers.waiting import wait_until
from sidecar_proc import Sidecar, error_info

from agent_sidecar.api.caps import Caps
from agent_sidecar.config import Limits
from agent_sidecar.v1 import prompt_service_pb2, session_service_pb2, tool_service_pb2
from agent_sidecar.v1 import prompt_service_pb2 as ppb
from agent_sidecar.v1 import session_service_pb2 as spb

INVALID = grpc.StatusCode.INVALID_ARGUMENT
MB = 1024 * 1024
KEY = "agent:main:telegram:dm:"
SERVICES = [m.DESCRIPTOR.services_by_name[n] for m, n in (
    (session_service_pb2, "SessionService"), (prompt_service_pb2, "PromptService"),
    (tool_service_pb2, "ToolService"))]
# What an error may cost in the trailers: far below the 8-16 KiB clients accept.
MAX_TRAILER_BYTES = 4096


def vm_rss_mb(pid: int) -> float:
    return procs.rss_bytes(pid) / 2**20


def trailer_bytes(err: grpc.RpcError) -> int:
    return sum(len(k) + len(v) for k, v in err.trailing_metadata() or ())


def expect_invalid(call, field: str) -> grpc.RpcError:
    """The call fails INVALID_ARGUMENT naming ``field``, with a short status."""
    with rpc_error(INVALID, "INVALID_ARGUMENT", field) as ei:
        call()
    err = ei.value
    assert len(err.details()) < 512, err.details()[:200]
    assert trailer_bytes(err) < MAX_TRAILER_BYTES
    return err


def raw_call(sc, method: str, data: bytes, *, stream: bool | str = False):
    """Call ``method`` (/pkg.Service/Name) with ``data`` as its request bytes
    (``stream="both"``: a request stream of that one message)."""
    ch = sc.channel()
    if stream == "both":
        return list(ch.stream_stream(method, request_serializer=lambda b: b,
                                     response_deserializer=lambda b: b)(iter([data]), timeout=10))
    if stream:
        return list(ch.unary_stream(method, request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)(data, timeout=10))
    return ch.unary_unary(method, request_serializer=lambda b: b,
                          response_deserializer=lambda b: b)(data, timeout=10)


# -- the caps table ----------------------------------------------------------------

def test_every_request_field_has_a_cap():
    """A new string, bytes or repeated field without a cap fails here (and at
    the sidecar's start), not in production with an unbounded field."""
    caps = Caps(Limits())
    for service in SERVICES:
        for m in service.methods:
            caps.plan(m.input_type)
            assert 0 < caps.request_limit(m.input_type) <= Limits().max_request_bytes, m.name


def test_small_rpcs_accept_small_requests():
    """Key-only RPCs are bounded by their fields, far below the server's limit."""
    caps = Caps(Limits())
    for name in ("GetSessionRequest", "DeleteSessionRequest", "SearchMessagesRequest"):
        assert caps.request_limit(spb.DESCRIPTOR.message_types_by_name[name]) < 64 * 1024
    for name in ("CancelRequest", "GetQueueRequest", "WatchActivityRequest"):
        assert caps.request_limit(ppb.DESCRIPTOR.message_types_by_name[name]) < 64 * 1024


def _one_field_over(desc, plan, caps):
    """Requests of type ``desc`` with one capped value just past its cap (an
    ASCII string or bytes of n + 1, or n + 1 empty items of a nested repeated
    field), each with that value's path."""
    from google.protobuf.message_factory import GetMessageClass
    for name, cap, sub, repeated in plan:
        field = desc.fields_by_name[name]
        if cap is not None and not repeated:
            msg = GetMessageClass(desc)()
            value = "x" * (cap.n + 1)
            setattr(msg, name, value.encode() if field.type == field.TYPE_BYTES else value)
            yield msg, name
        elif cap is not None:
            msg = GetMessageClass(desc)()
            for _ in range(cap.n + 1):
                if sub is not None:
                    getattr(msg, name).add()
                else:
                    getattr(msg, name).append(b"" if field.type == field.TYPE_BYTES else "")
            yield msg, name
        if sub:
            for inner, path in _one_field_over(field.message_type, sub, caps):
                msg = GetMessageClass(desc)()
                (getattr(msg, name).add() if repeated else getattr(msg, name)).CopyFrom(inner)
                yield msg, f"{name}.{path}"


def test_a_request_below_the_small_floor_breaks_no_string_cap():
    """Caps.check skips the string caps of a request no longer than its type's
    floor (the boundary passes the request's size): every value just past its
    cap makes a request longer than that, unless it is a top-level count,
    which the short check counts."""
    caps = Caps(Limits())
    checked = 0
    for service in SERVICES:
        for m in service.methods:
            floor, counts = caps.small(m.input_type)
            top_counts = {name for name, _ in counts}
            for msg, path in _one_field_over(m.input_type, caps.plan(m.input_type), caps):
                size = msg.ByteSize()
                if path in top_counts and size <= floor:
                    with pytest.raises(Exception, match="more than"):
                        caps.check(msg, size)
                else:
                    assert size > floor, (m.name, path, size, floor)
                checked += 1
    assert checked > 50


# -- string caps and short errors (issue 14 item 9) ------------------------------

@pytest.fixture(scope="module")
def known(shared_sidecar):
    return seed(shared_sidecar.sessions(), src(), turns("hello", "hi"))


def _prompt(sc, **kw):
    return lambda: list(sc.prompts().Prompt(ppb.PromptRequest(**kw), timeout=10))


def _watch(sc, **kw):
    return lambda: list(sc.prompts().WatchActivity(ppb.WatchActivityRequest(**kw), timeout=10))


# (name, call(sc, known) -> callable, field). Values just past a field's cap
# reach the field check; megabytes reach the size check, which names the field too.
CASES = [
    ("profile-100k", lambda sc, k: lambda: sc.sessions().GetOrCreateSession(
        spb.GetOrCreateSessionRequest(source=src(), profile="p" * 100_000), timeout=10), "profile"),
    ("profile-just-over", lambda sc, k: lambda: sc.sessions().GetOrCreateSession(
        spb.GetOrCreateSessionRequest(source=src(), profile="p" * 257), timeout=10), "profile"),
    ("context-profile-100k", lambda sc, k: lambda: sc.sessions().GetSessionContext(
        spb.GetSessionContextRequest(source=src(), profile="p" * 100_000), timeout=10), "profile"),
    ("prompt-key-3mb", lambda sc, k: _prompt(sc, request_id=rid(), text="hi",
                                             session_key=KEY + "k" * (3 * MB)), "session_key"),
    ("prompt-key-just-over", lambda sc, k: _prompt(sc, request_id=rid(), text="hi",
                                                   session_key=KEY + "k" * 1024), "session_key"),
    ("prompt-profile-100k", lambda sc, k: _prompt(sc, request_id=rid(), text="hi", source=src(),
                                                  profile="p" * 100_000), "profile"),
    ("watch-platform-3mb", lambda sc, k: _watch(sc, platform="t" * (3 * MB)), "platform"),
    ("watch-platform-just-over", lambda sc, k: _watch(sc, platform="t" * 257), "platform"),
    ("watch-request-id-3mb", lambda sc, k: _watch(sc, session_key=k.session_key,
                                                  request_id="r" * (3 * MB)), "request_id"),
    ("cancel-key-8mb", lambda sc, k: lambda: sc.prompts().Cancel(
        ppb.CancelRequest(session_key=KEY + "k" * (8 * MB)), timeout=10), "session_key"),
    ("cancel-request-id-just-over", lambda sc, k: lambda: sc.prompts().Cancel(
        ppb.CancelRequest(session_key=k.session_key, request_id="r" * 257), timeout=10),
     "request_id"),
    ("queue-key-3mb", lambda sc, k: lambda: sc.prompts().GetQueue(
        ppb.GetQueueRequest(session_key=KEY + "k" * (3 * MB)), timeout=10), "session_key"),
    ("queue-key-just-over", lambda sc, k: lambda: sc.prompts().GetQueue(
        ppb.GetQueueRequest(session_key=KEY + "k" * 1024), timeout=10), "session_key"),
    ("get-key-20mb", lambda sc, k: lambda: sc.sessions().GetSession(
        spb.GetSessionRequest(session_key="k" * (20 * MB)), timeout=30), "session_key"),
    ("search-query-3mb", lambda sc, k: lambda: sc.sessions().SearchMessages(
        spb.SearchMessagesRequest(query="q " * (3 * MB // 2)), timeout=10), "query"),
]


@pytest.mark.parametrize("name,call,field", CASES, ids=[c[0] for c in CASES])
def test_string_field_past_its_cap(shared_sidecar, known, name, call, field):
    err = expect_invalid(call(shared_sidecar, known), field)
    assert "k" * 100 not in err.details() and "p" * 100 not in err.details()


def test_unknown_profile_error_quotes_a_short_prefix(shared_sidecar):
    """Within its cap, an unknown profile is named in the error, cut short."""
    err = expect_invalid(lambda: shared_sidecar.sessions().GetOrCreateSession(
        spb.GetOrCreateSessionRequest(source=src(), profile="q" * 250), timeout=10), "profile")
    assert "q" * 32 in err.details() and "q" * 100 not in err.details()


# -- undecodable requests (issue 14 item 10) --------------------------------------

GET_SESSION = "/agent_sidecar.v1.SessionService/GetSession"
GET_OR_CREATE = "/agent_sidecar.v1.SessionService/GetOrCreateSession"
WATCH = "/agent_sidecar.v1.PromptService/WatchActivity"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
HEALTH_WATCH = "/grpc.health.v1.Health/Watch"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"


@pytest.mark.parametrize("method,data,field,stream", [
    (GET_SESSION, b"\x0a\x03ab\xff", "session_key", False),           # 1: invalid UTF-8
    (GET_SESSION, b"\x12\x02\xc0\x80", "session_id", False),          # 2: overlong NUL
    (GET_OR_CREATE, b"\x0a\x04\x0a\x02\xed\xa0", "source.platform", False),  # nested
    (GET_SESSION, b"\x0a\x09abc", "session_key", False),              # longer than the bytes
    (GET_SESSION, b"\xff\xff\xff", "request", False),                 # no wire format at all
    (WATCH, b"\x1a\x01\xfe", "platform", True),                       # a response stream
    # The standard services, which need no credential, the same way:
    (HEALTH_CHECK, b"\x0a\x02\xc3\x28", "service", False),
    (HEALTH_CHECK, b"\xff\xff\xff", "request", False),
    (HEALTH_WATCH, b"\xff\xff\xff", "request", True),
    (REFLECTION, b"\xff\xff\xff", "request", "both"),
], ids=["utf8", "overlong", "nested", "truncated", "garbage", "stream",
        "health-utf8", "health-garbage", "health-watch", "reflection"])
def test_undecodable_request_is_invalid_argument(sidecar, method, data, field, stream):
    before = len(sidecar.log())
    with rpc_error(INVALID, "INVALID_ARGUMENT", field):
        raw_call(sidecar, method, data, stream=stream)
    logged = sidecar.log_path.read_text()[before:]
    assert "Traceback" not in logged and "deserializ" not in logged.lower()
    assert_serving(sidecar)


# -- memory (issue 14 item 3) -----------------------------------------------------------

def _huge_get_session(channel, metadata=None) -> grpc.StatusCode:
    stub = spb.GetSessionRequest(session_key="k" * (20 * MB))
    try:
        channel.unary_unary(GET_SESSION, request_serializer=spb.GetSessionRequest.SerializeToString,
                            response_deserializer=spb.GetSessionResponse.FromString)(
            stub, timeout=60, metadata=metadata)
    except grpc.RpcError as e:
        assert error_info(e)[0], e.details()
        return e.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize("via", ["tcp-no-token", "unix"])
def test_large_requests_leave_no_memory_behind(tmp_path, via):
    """20 MB requests an RPC never accepts, over TCP without a token (refused
    before they are read) and over the trusted socket (refused before they are
    parsed): once they are answered the parent's RSS comes back to within
    twice what it was idle (it used to keep every one until a GC pass)."""
    sc = Sidecar(tmp_path / "data", tcp=True).start()
    try:
        assert_serving(sc)
        pid = sc.proc.pid
        idle = vm_rss_mb(pid)
        channels = [sc.channel(tcp=via != "unix") for _ in range(3)]
        want = grpc.StatusCode.UNAUTHENTICATED if via != "unix" else INVALID
        with ThreadPoolExecutor(3) as pool:
            codes = list(pool.map(lambda i: _huge_get_session(channels[i % 3]), range(15)))
        assert set(codes) == {want}, codes
        wait_until(lambda: vm_rss_mb(pid) <= 2 * idle, timeout=20,
                   what=f"parent RSS back within 2x idle {idle:.0f} MB (now {vm_rss_mb(pid):.0f})")
        assert_serving(sc)
    finally:
        sc.stop()


def test_refused_prompts_leave_no_memory_behind(tmp_path):
    """Prompts of 2.3 MB of text that parse but pass the text's cap: each is
    refused INVALID_ARGUMENT after it was read and parsed. The refusal's
    traceback held the frames holding the request, in a reference cycle that
    only a rare GC pass freed: a few hundred of them held gigabytes."""
    text = " ".join(f"w{i}" for i in range(300_000))
    sc = Sidecar(tmp_path / "data").start()
    try:
        pid = sc.proc.pid
        idle = vm_rss_mb(pid)
        stub = sc.prompts()

        def refused(i: int) -> grpc.StatusCode:
            req = ppb.PromptRequest(request_id=rid(), text=text)
            req.source.CopyFrom(src())
            with pytest.raises(grpc.RpcError) as e:
                list(stub.Prompt(req, timeout=30))
            return e.value.code()

        with ThreadPoolExecutor(4) as pool:
            assert set(pool.map(refused, range(60))) == {INVALID}
        wait_until(lambda: vm_rss_mb(pid) <= 2 * idle, timeout=20,
                   what=f"parent RSS back within 2x idle {idle:.0f} MB (now {vm_rss_mb(pid):.0f})")
        assert_serving(sc)
    finally:
        sc.stop()

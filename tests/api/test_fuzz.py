"""Fuzz every RPC of SessionService, PromptService and ToolService through a
real sidecar: hypothesis-built requests (strings near every cap, NULs, huge
and negative numbers, unknown enum values, known keys and ids so calls reach
the handlers' depths), and raw bytes that are no valid request at all.

Whatever comes in, the answer keeps the promise of docs/semantics.md
("Errors"): never INTERNAL or UNKNOWN (nor a hang: a call that times out fails
too), every error carries an ErrorInfo, every INVALID_ARGUMENT names a field of
the request ("request" when the bytes are no message at all).

Bounded: a fixed ``max_examples`` per RPC (the whole module takes about a
minute), ``derandomize`` so every run draws the same examples and a failure
reproduces (hypothesis prints the falsifying example).
"""

from __future__ import annotations

from collections import Counter

import grpc
import pytest
from google.protobuf import message_factory
from helpers.ids import rid
from helpers.ids import source as src
from helpers.sessions import seed, turns
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sidecar_proc import TOKEN, Sidecar, error_info

from agent_sidecar.v1 import common_pb2 as c
from agent_sidecar.v1 import prompt_service_pb2, session_service_pb2, tool_service_pb2

SERVICES = [m.DESCRIPTOR.services_by_name[n] for m, n in (
    (session_service_pb2, "SessionService"), (prompt_service_pb2, "PromptService"),
    (tool_service_pb2, "ToolService"))]
METHODS = {m.name: m for s in SERVICES for m in s.methods}
BAD = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
ID, KEY, TEXT = 256, 1024, 256 * 1024  # the default caps (api/caps.py)
CALL_TIMEOUT = 30

EXAMPLES = 80      # per RPC, built messages
RAW_EXAMPLES = 40  # per RPC, raw bytes
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck), print_blob=True)
RAW = settings(FUZZ, max_examples=RAW_EXAMPLES)


def path(method) -> str:
    return f"/{method.containing_service.full_name}/{method.name}"


def cls_of(desc):
    return message_factory.GetMessageClass(desc)


# -- strategies -------------------------------------------------------------------

def specials(known: dict) -> list[str]:
    """Strings worth trying in any string field: ones that reach deep (real keys,
    ids, profile and platform names) and ones at and past every cap."""
    return ["", " ", "\x00", "a\x00b", "main", "telegram", "dm", "group", "user",
            "assistant", "tool", "DELETE ALL SESSIONS", "agent:main:telegram",
            "agent:main:telegram:dm:", '"', "*", "é" * 200, "x" * ID, "x" * (ID + 1),
            "k" * (KEY + 1), "n" * 4097, "t" * (TEXT + 1), "ü" * (TEXT // 2 + 1),
            known["key"], known["id"], known["key"] + "x", known["id"][:-1] + "0"]


def plausible(known: dict) -> dict[str, list[str]]:
    """Per field name, values a real caller would send: they get requests past
    validation, into the handlers."""
    return {
        "session_key": [known["key"]], "session_id": [known["id"]],
        "target_session_id": [known["id"]], "platform": ["telegram", "discord"],
        "chat_id": ["c1", "c2"], "chat_type": ["dm", "group", "channel", "thread"],
        "role": ["user", "assistant", "system", "tool"], "profile": ["", "main"],
        "query": ["hello", "hi there"], "request_id": ["r1", "r2"], "namespace": ["fz"],
        "name": ["fz.t", "fz.u"], "reason": ["restart_timeout"], "page_token": [""],
        "tool_calls_json": ["[]", '[{"id": "1", "function": {"name": "t", "arguments": "{}"}}]'],
        "parameters_json_schema": ['{"type": "object"}'],
        "result_json": ['{"ok": 1}'], "invocation_id": ["i1"], "mime_type": ["image/png"],
    }


ATTACHMENT = 8 * 1024 * 1024
NUMBERS = {"int32": [-2**31, 2**31 - 1, -1, 1001, 2**30],
           "int64": [-2**63, 2**63 - 1, -1, 2**40 + 1, 2**62]}


def plausible_scalar(f, known: dict):
    t = f.type
    if t == f.TYPE_STRING:
        return st.sampled_from(plausible(known).get(f.name) or ["hello", "x"])
    if t == f.TYPE_BYTES:
        return st.binary(max_size=8)
    if t == f.TYPE_BOOL:
        return st.booleans()
    if t == f.TYPE_DOUBLE:
        return st.floats(0, 10)
    if t == f.TYPE_ENUM:
        return st.integers(0, max(v.number for v in f.enum_type.values))
    return st.integers(0, 3)


def hostile_scalar(f, known: dict):
    t = f.type
    if t == f.TYPE_STRING:  # mostly the special strings: random text rarely gets far
        special = st.sampled_from(specials(known))
        return st.one_of(special, special, st.text(st.characters(exclude_categories=("Cs",)),
                                                   max_size=12))
    if t == f.TYPE_BYTES:
        return st.one_of(st.binary(max_size=16), st.just(b"\0" * (ATTACHMENT + 1)))
    if t == f.TYPE_BOOL:
        return st.booleans()
    if t == f.TYPE_DOUBLE:
        return st.sampled_from([float("nan"), float("inf"), float("-inf"), -1.0, 1e300, -0.0])
    edges = NUMBERS["int32"] if t in (f.TYPE_INT32, f.TYPE_ENUM) else NUMBERS["int64"]
    return st.one_of(st.integers(-3, 9), st.sampled_from(edges))


def leaves(desc, depth: int = 0, prefix: tuple = ()) -> list[tuple]:
    """Every scalar field reachable from a message: a path of field descriptors."""
    out = []
    for f in desc.fields:
        if f.message_type is None:
            out.append(prefix + (f,))
        elif depth < 3:
            out += leaves(f.message_type, depth + 1, prefix + (f,))
    return out


def put(msg, path: tuple, value) -> None:
    """Set the field at ``path`` (a repeated field on the way: its first item)."""
    for f in path[:-1]:
        if f.is_repeated:
            items = getattr(msg, f.name)
            msg = items[0] if len(items) else items.add()
        else:
            msg = getattr(msg, f.name)
    setattr(msg, path[-1].name, value)


def valid(name: str, known: dict):
    """A request of this RPC that passes validation: the base every example
    changes a few fields of, so that the examples get as far as the handlers."""
    key, sid = known["key"], known["id"]
    source = c.SessionSource(platform="telegram", chat_id="c1", chat_type="dm", user_id="u1")
    hi = [c.Message(role="user", content="hi")]
    S, P, T = session_service_pb2, prompt_service_pb2, tool_service_pb2
    return {
        "GetOrCreateSession": lambda: S.GetOrCreateSessionRequest(source=source, profile="main"),
        "GetSession": lambda: S.GetSessionRequest(session_key=key),
        "ListSessions": lambda: S.ListSessionsRequest(platform="telegram", page_size=10),
        "ResetSession": lambda: S.ResetSessionRequest(session_key=key),
        "SwitchSession": lambda: S.SwitchSessionRequest(session_key=key, target_session_id=sid),
        "SuspendSession": lambda: S.SuspendSessionRequest(session_key=key),
        "MarkResumePending": lambda: S.MarkResumePendingRequest(session_key=key,
                                                                reason="restart_timeout"),
        "DeleteSession": lambda: S.DeleteSessionRequest(session_key=key),
        "ClearAllSessions": lambda: S.ClearAllSessionsRequest(confirm="DELETE ALL SESSIONS"),
        "SeedSession": lambda: S.SeedSessionRequest(source=source, messages=hi),
        "GetTranscript": lambda: S.GetTranscriptRequest(session_id=sid),
        "AppendMessages": lambda: S.AppendMessagesRequest(session_id=sid, messages=hi),
        "RewriteTranscript": lambda: S.RewriteTranscriptRequest(session_id=sid, messages=hi),
        "RewindSession": lambda: S.RewindSessionRequest(session_id=sid, n=1),
        "SearchMessages": lambda: S.SearchMessagesRequest(query="hello", session_key=key),
        "UpdateUsage": lambda: S.UpdateUsageRequest(session_key=key, delta=c.Usage(input_tokens=1)),
        "PruneSessions": lambda: S.PruneSessionsRequest(max_age_days=30),
        "GetSessionContext": lambda: S.GetSessionContextRequest(source=source),
        "Prompt": lambda: P.PromptRequest(request_id=rid("fz"), session_key=key, text="hi"),
        "WatchActivity": lambda: P.WatchActivityRequest(session_key=key),
        "Cancel": lambda: P.CancelRequest(session_key=key),
        "GetQueue": lambda: P.GetQueueRequest(session_key=key),
        "ServeTools": lambda: T.ServeToolsRequest(register=T.RegisterTools(namespace="fz", tools=[
            T.ToolSpec(name="fz.t", parameters_json_schema='{"type": "object"}')])),
    }[name]


def request(method, known: dict):
    """Requests of one RPC: a valid one with up to three fields changed, to a
    hostile value (strings past their caps, NULs, extreme numbers, unknown enum
    values) or another plausible one; for RPCs with a message list, sometimes
    one message past its cap."""
    desc = method.input_type
    make = valid(method.name, known)
    change = st.sampled_from(leaves(desc)).flatmap(lambda p: st.tuples(
        st.just(p), st.one_of(hostile_scalar(p[-1], known), plausible_scalar(p[-1], known))))

    def build(args):
        changes, too_many = args
        req = make()
        for p, value in changes:
            put(req, p, value)
        if too_many:
            req.messages.extend([c.Message(role="user", content="m")] * 1001)
        return req

    many = st.booleans() if "messages" in desc.fields_by_name else st.just(False)
    changes = st.one_of(st.just([]), st.lists(change, min_size=1, max_size=3))
    return st.tuples(changes, many).map(build)


def raw_bytes():
    """Bytes that are mostly no valid message: random ones, and string fields
    1-4 (every request has one of these numbers) holding invalid UTF-8 or
    announcing more bytes than follow."""
    bad_utf8 = st.sampled_from([b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"ok\xfe"])
    field = st.integers(1, 4)
    broken = st.one_of(
        st.tuples(field, bad_utf8).map(lambda t: bytes([t[0] << 3 | 2, len(t[1])]) + t[1]),
        st.tuples(field, st.binary(max_size=4)).map(lambda t: bytes([t[0] << 3 | 2, 9]) + t[1]),
    )
    return st.one_of(st.binary(max_size=48), broken,
                     st.tuples(st.binary(max_size=8), broken).map(lambda t: t[0] + t[1]))


# -- calling ------------------------------------------------------------------------

def outcome(method, channel, req, *, raw: bool = False, metadata=None):
    """(code, ErrorInfo reason, field) of one call; streams are read to their end
    (a watch stream: to its first response, then cancelled)."""
    ser = (lambda b: b) if raw else cls_of(method.input_type).SerializeToString
    de = cls_of(method.output_type).FromString
    kw = dict(timeout=CALL_TIMEOUT, metadata=metadata)
    try:
        if method.client_streaming:  # a tool host's messages, then it half-closes
            call = channel.stream_stream(path(method), request_serializer=ser,
                                         response_deserializer=de)(iter(req), **kw)
            for _ in call:
                pass
        elif method.server_streaming:
            call = channel.unary_stream(path(method), request_serializer=ser,
                                        response_deserializer=de)(req, **kw)
            for _ in call:
                if method.name == "WatchActivity":  # a valid watch never ends
                    call.cancel()
                    break
        else:
            channel.unary_unary(path(method), request_serializer=ser,
                                response_deserializer=de)(req, **kw)
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.CANCELLED and method.name == "WatchActivity":
            return grpc.StatusCode.OK, None, None
        try:
            info = error_info(e)
        except ValueError:  # a status whose details do not match its code: none readable
            info = (None, None)
        return e.code(), *info, e.details()
    return grpc.StatusCode.OK, None, None


COUNTS: Counter = Counter()  # (kind, code) -> calls, printed at the end of the module


def check(method, out, kind: str = "message") -> None:
    code, reason, field, *details = out
    COUNTS[kind, code.name] += 1
    assert code not in BAD, f"{method.name}: {code.name} {details}"
    if code == grpc.StatusCode.OK:
        return
    assert reason, f"{method.name}: {code.name} without ErrorInfo: {details}"
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        assert field, f"{method.name}: INVALID_ARGUMENT names no field: {details}"
        root = field.split(".")[0].split("[")[0]
        assert root == "request" or root in method.input_type.fields_by_name, (method.name, field)


# -- the sidecar and the tests -------------------------------------------------------------

@pytest.fixture(scope="module")
def fuzz_sidecar(tmp_path_factory):
    """A sidecar (Unix socket and TCP) with a short keepalive, so a watch's first
    response comes at once."""
    sc = Sidecar(tmp_path_factory.mktemp("fuzz") / "data", tcp=True,
                 config="[sidecar]\nkeepalive_s = 0.2\n").start()
    yield sc
    sc.stop()
    print("\nfuzz calls by kind and status:", dict(sorted(COUNTS.items())))


@pytest.fixture
def fuzzed(fuzz_sidecar):
    """The sidecar and a session of its own for each test's requests to find
    (a fuzzed ClearAllSessions or DeleteSession takes it away)."""
    s = seed(fuzz_sidecar.sessions(), src(), turns("hello there", "hi"))
    return fuzz_sidecar, {"key": s.session_key, "id": s.session_id}


# Every string field of every RPC gets each of these once, in an otherwise valid
# request: what random draws would reach only by luck.
SWEEP = ["", "\x00", "a\x00b", '"', "é" * 200, "x" * (ID + 1), "k" * (KEY + 1), "n" * 4097,
         "p" * 100_000, "t" * (TEXT + 1)]


@pytest.mark.parametrize("name", list(METHODS))
def test_fuzz_string_fields(fuzzed, name):
    sc, known = fuzzed
    method = METHODS[name]
    channel = sc.channel()
    for leaf in leaves(method.input_type):
        if leaf[-1].type != leaf[-1].TYPE_STRING:
            continue
        for value in SWEEP:
            req = valid(name, known)()
            put(req, leaf, value)
            out = outcome(method, channel, [req] if method.client_streaming else req)
            check(method, out, "sweep")


@pytest.mark.parametrize("name", list(METHODS))
def test_fuzz_requests(fuzzed, name):
    sc, known = fuzzed
    method = METHODS[name]
    channel = sc.channel()
    strategy = request(method, known)
    if method.client_streaming:
        strategy = st.lists(strategy, min_size=1, max_size=3)

    @FUZZ
    @given(req=strategy)
    def run(req):
        check(method, outcome(method, channel, req))

    run()


VIA = ["unix", "tcp", "tcp-token"]


@pytest.mark.parametrize("name", list(METHODS))
def test_fuzz_raw_bytes(fuzzed, name):
    """Undecodable requests over every listener: INVALID_ARGUMENT (or
    UNAUTHENTICATED without a token), never UNKNOWN."""
    sc, _ = fuzzed
    method = METHODS[name]
    channels = {"unix": sc.channel(), "tcp": sc.channel(tcp=True), "tcp-token": sc.channel(tcp=True)}
    data = st.lists(raw_bytes(), min_size=1, max_size=2) if method.client_streaming else raw_bytes()

    @RAW
    @given(raw=data, via=st.sampled_from(VIA))
    def run(raw, via):
        md = [("authorization", f"Bearer {TOKEN}")] if via == "tcp-token" else None
        out = outcome(method, channels[via], raw, raw=True, metadata=md)
        check(method, out, "raw")
        if via == "tcp":
            assert out[0] == grpc.StatusCode.UNAUTHENTICATED, out

    run()

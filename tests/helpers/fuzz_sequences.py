"""Calls of every RPC in odd orders, for the sequence fuzzers
(tests/api/test_fuzz_sequences.py on one sidecar, tests/cluster/test_cluster_fuzz.py
on the nodes of a cluster): ``run(nodes, seed, steps)`` makes a seeded random
run of calls on a few sessions while their turns go on (prompts in every
delivery mode and unknown ones, steers and cancels after the end, rewinds
past the start, rewrites and prunes of a running turn, switches to another
session's or a stale incarnation's id, tool results for calls never made,
watches from hostile cursors), each call on any of the nodes, with hostile
values where a caller could put them.

It asks of a sequence what tests/api/test_fuzz.py asks of one call: every
answer is OK or a documented status with an ErrorInfo (INVALID_ARGUMENT
naming a field of the request), never INTERNAL, UNKNOWN or a hang; and a
refused call leaves what the API shows of the sessions as it was.
``assert_clean(nodes)`` then checks every node alive, its workers too, and
its log free of errors: an error logged is a failure no caller saw (a
callback that raised: a turn left hanging, a stream never ended).

A node's config is ``CONFIG``; ``tool_host(node)`` is the host of the
"tools" profile's tool, answering each call with the next of ``RESULTS``.
A failure names the seed, the step and the call.
"""

from __future__ import annotations

import random
from collections import Counter

import grpc
from sidecar_proc import Sidecar, error_info

from agent_sidecar.v1 import common_pb2 as c
from agent_sidecar.v1 import prompt_service_pb2 as P
from agent_sidecar.v1 import session_service_pb2 as S
from agent_sidecar.v1 import tool_service_pb2 as T

from .config import echo, scripted, table
from .ids import rid
from .ids import source as new_source
from .logs import log_lines
from .sessions import msg, transcript
from .streams import TERMINAL, PromptRun, kind_of
from .tools import ToolHost
from .waiting import wait_until

BAD = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED}
CALL_TIMEOUT = 20
TOOL_STEPS = [{"tool_calls": [{"name": "fz.t", "arguments": {"a": 1}}]},
              {"text_from_last_tool_result": True}]
CONFIG = (table("sidecar", keepalive_s=0.2) + echo("main", 15, queue_cap=3)
          + scripted("tools", TOOL_STEPS, tools=["fz.*"], tool_timeout_s=1))
# What the run's tool host answers, in turn: (ok, result_json, error).
RESULTS = [(True, '{"a": 1}', ""), (True, "not json", ""), (False, "", "a\x00b"), (True, "", ""),
           (True, '"\\ud800"', ""), (False, '{"x": 1}', "é" * 300), (True, "[" * 900 + "]" * 900, ""),
           (True, "x" * (256 * 1024), ""), None]
INT32 = [-2**31, -1, 0, 1, 2, 3, 1000, 2**31 - 1]
INT64 = [-2**63, -1, 0, 1, 5, 2**31, 2**63 - 1]
TEXTS = ["hi", "one two three four five six seven eight", "", "\x00", "a\x00b", "é" * 100,
         "w " * 300, '"; DROP TABLE sessions; --', "\U0001f600" * 50]


class World:
    """The run's sessions (their keys and every incarnation id seen), its
    request ids and the Prompt streams still open."""

    def __init__(self, nodes: list[Sidecar], rnd: random.Random):
        self.rnd = rnd
        self.stubs = [(n.sessions(), n.prompts(), n.tools()) for n in nodes]
        self.sources = [new_source(chat_type=t) for t in ("dm", "group", "dm")]
        self.keys: list[str] = []
        self.ids: list[str] = []
        self.rids: list[str] = ["", "r" * 300]
        self.streams: list[PromptRun] = []
        for s in self.sources:
            r = self.sessions.GetOrCreateSession(S.GetOrCreateSessionRequest(source=s), timeout=10)
            self.keys.append(r.session.session_key)
            self.ids.append(r.session.session_id)

    @property
    def sessions(self):
        """A SessionService stub of one of the nodes (each call: any of them)."""
        return self.rnd.choice(self.stubs)[0]

    @property
    def prompts(self):
        return self.rnd.choice(self.stubs)[1]

    @property
    def tools(self):
        return self.rnd.choice(self.stubs)[2]

    def key(self) -> str:
        r = self.rnd.random()
        if r < 0.8:
            return self.rnd.choice(self.keys)
        return self.rnd.choice(["", "agent:main:telegram:dm:nobody", "agent:main:telegram",
                                self.keys[0] + "\x00", self.keys[0].upper(), "x" * 1025])

    def sid(self) -> str:
        if self.rnd.random() < 0.85:
            return self.rnd.choice(self.ids)
        return self.rnd.choice(["", "20200101_000000_deadbeef", self.ids[0] + "x", "i" * 257])

    def request_id(self) -> str:
        return self.rnd.choice(self.rids) if self.rids and self.rnd.random() < 0.4 else rid("fz")

    def messages(self) -> list[c.Message]:
        rnd = self.rnd
        pool = [msg("user", rnd.choice(TEXTS) or "u"), msg("assistant", "a"),
                msg("assistant", "", tool_calls_json='[{"id": "k1", "function": {"name": "fz.t",'
                                                     ' "arguments": "{}"}}]'),
                msg("tool", '{"ok": 1}', tool_call_id=rnd.choice(["k1", "nope", ""]), tool_name="fz.t"),
                msg("system", "be brief"), msg("user", "x", created_at=c.Message().created_at)]
        return [rnd.choice(pool) for _ in range(rnd.choice([0, 1, 2, 5, 1000]))]

    def learn(self, session) -> None:
        if session.session_id and session.session_id not in self.ids:
            self.ids.append(session.session_id)
        if session.session_key and session.session_key not in self.keys:
            self.keys.append(session.session_key)

    def quiet(self) -> bool:
        return all(s.done.is_set() for s in self.streams)

    def snapshot(self) -> list:
        """What the API shows of every session of the run (state, usage,
        transcript with rewound messages)."""
        out, stub = [], self.stubs[0][0]  # no draw: whether a snapshot is taken depends on timing
        for key in self.keys:
            try:
                s = stub.GetSession(S.GetSessionRequest(session_key=key), timeout=10).session
            except grpc.RpcError as e:
                out.append((key, e.code()))
                continue
            out.append((s.SerializeToString(deterministic=True),
                        [m.SerializeToString() for m in transcript(stub, s.session_id, True)]))
        return out


# -- the calls ------------------------------------------------------------------------------

def op_prompt(w: World):
    rnd = w.rnd
    req = P.PromptRequest(request_id=w.request_id(), text=rnd.choice(TEXTS),
                          delivery=rnd.choice([0, 1, 2, 3, 4, 5, 6, 6, 7, -1]),
                          profile=rnd.choice(["", "", "tools", "nope"]))
    if rnd.random() < 0.2 or req.profile == "tools":  # a key names its profile: a source for "tools"
        req.source.CopyFrom(rnd.choice(w.sources))
    else:
        req.session_key = w.key()
    if rnd.random() < 0.1:
        req.attachments.add(name="a", mime_type=rnd.choice(["image/png", ""]), data=b"\x89PNG",
                            url=rnd.choice(["", "http://x/y"]))
    w.rids.append(req.request_id)
    w.streams.append(PromptRun(w.prompts, req, timeout=CALL_TIMEOUT))
    return "Prompt", None


def op_cancel(w: World):
    rnd = w.rnd
    by_key = rnd.random() < 0.5
    req = P.CancelRequest(session_key=w.key() if by_key or rnd.random() < 0.1 else "",
                          request_id="" if by_key else rnd.choice(w.rids + ["nope"]))
    return "Cancel", lambda: w.prompts.Cancel(req, timeout=CALL_TIMEOUT)


def op_queue(w: World):
    return "GetQueue", lambda: w.prompts.GetQueue(P.GetQueueRequest(session_key=w.key()),
                                                  timeout=CALL_TIMEOUT)


def op_watch(w: World):
    rnd = w.rnd
    after = rnd.choice(INT64) if rnd.random() < 0.3 else rnd.choice([0, 1, 2, 3])
    req = P.WatchActivityRequest()
    by = rnd.choice(["request_id", "session_key", "platform"])
    if by == "request_id":
        req.request_id, req.after_seq = rnd.choice(w.rids), after
    elif by == "session_key":
        req.session_key, req.after_cursor = w.key(), after
    else:
        req.platform = rnd.choice(["telegram", "", "TELEGRAM", "tele:gram"])
        req.after_cursor = after

    def call():  # to the terminal frame, or to the first keepalive: a watch need not end
        stream = w.prompts.WatchActivity(req, timeout=CALL_TIMEOUT)
        for r in stream:
            if kind_of(r.frame) in TERMINAL + ("keepalive",):
                stream.cancel()
                return
    return "WatchActivity", call


def op_rewind(w: World):
    req = S.RewindSessionRequest(session_id=w.sid(), n=w.rnd.choice(INT32))
    return "RewindSession", lambda: w.sessions.RewindSession(req, timeout=CALL_TIMEOUT)


def op_rewrite(w: World):
    req = S.RewriteTranscriptRequest(session_id=w.sid(), messages=w.messages())
    return "RewriteTranscript", lambda: w.sessions.RewriteTranscript(req, timeout=CALL_TIMEOUT)


def op_append(w: World):
    req = S.AppendMessagesRequest(session_id=w.sid(), messages=w.messages())
    return "AppendMessages", lambda: w.sessions.AppendMessages(req, timeout=CALL_TIMEOUT)


def op_seed(w: World):
    req = S.SeedSessionRequest(messages=w.messages())
    if w.rnd.random() < 0.5:
        req.session_key = w.key()
    else:
        req.source.CopyFrom(w.rnd.choice(w.sources))

    def call():
        w.learn(w.sessions.SeedSession(req, timeout=CALL_TIMEOUT).session)
    return "SeedSession", call


def op_lane(w: World):
    """The calls on a lane as a whole: reset, switch, suspend, resume mark, delete, get."""
    rnd, key = w.rnd, w.key()
    name = rnd.choice(["ResetSession", "SwitchSession", "SuspendSession", "MarkResumePending",
                       "DeleteSession", "GetSession", "GetOrCreateSession"])
    req = {"ResetSession": lambda: S.ResetSessionRequest(session_key=key,
                                                         display_name=rnd.choice(["", "n\x00", "é"])),
           "SwitchSession": lambda: S.SwitchSessionRequest(session_key=key, target_session_id=w.sid()),
           "SuspendSession": lambda: S.SuspendSessionRequest(session_key=key),
           "MarkResumePending": lambda: S.MarkResumePendingRequest(
               session_key=key, reason=rnd.choice(["restart_timeout", "", "\x00"])),
           "DeleteSession": lambda: S.DeleteSessionRequest(session_key=key),
           "GetSession": lambda: S.GetSessionRequest(session_key=key, session_id=rnd.choice(["", w.sid()])),
           "GetOrCreateSession": lambda: S.GetOrCreateSessionRequest(
               source=rnd.choice(w.sources), force_new=rnd.random() < 0.3),
           }[name]()

    def call():
        r = getattr(w.sessions, name)(req, timeout=CALL_TIMEOUT)
        if hasattr(r, "session"):
            w.learn(r.session)
    return name, call


def op_misc(w: World):
    """Reads and housekeeping: list, search, usage, prune, context."""
    rnd = w.rnd
    name = rnd.choice(["ListSessions", "SearchMessages", "UpdateUsage", "PruneSessions",
                       "GetSessionContext", "GetTranscript"])
    req = {"ListSessions": lambda: S.ListSessionsRequest(
               platform=rnd.choice(["", "telegram"]), page_size=rnd.choice(INT32),
               active_within_seconds=rnd.choice(INT64)),
           "SearchMessages": lambda: S.SearchMessagesRequest(
               query=rnd.choice(["one", '"', "*", "a OR", "NEAR(", "-x", "é", "\x00"]),
               session_key=rnd.choice(["", w.key()]), limit=rnd.choice(INT32)),
           "UpdateUsage": lambda: S.UpdateUsageRequest(
               session_key=w.key(), delta=c.Usage(input_tokens=rnd.choice(INT64),
                                                  cost_usd=rnd.choice([0.0, -1.0, 1e300, 0.5])),
               last_prompt_tokens=rnd.choice(INT64), cost_status=rnd.choice(["", "ok", "x" * 65])),
           "PruneSessions": lambda: S.PruneSessionsRequest(max_age_days=rnd.choice(INT32)),
           "GetSessionContext": lambda: S.GetSessionContextRequest(source=rnd.choice(w.sources),
                                                                   profile=rnd.choice(["", "x"])),
           "GetTranscript": lambda: S.GetTranscriptRequest(
               session_id=w.sid(), include_rewound=rnd.random() < 0.5, page_size=rnd.choice(INT32)),
           }[name]()
    return name, lambda: getattr(w.sessions, name)(req, timeout=CALL_TIMEOUT)


def op_tools(w: World):
    """A tool host's stream in an odd order: results for calls never made
    (before and after registering), an empty message, a second registration."""
    rnd = w.rnd
    schema = rnd.choice(['{"type": "object"}', "", "[]", '{"x": ' + "[" * 300 + "]" * 300 + "}"])
    reg = T.ServeToolsRequest(register=T.RegisterTools(namespace="fz", tools=[
        T.ToolSpec(name="fz.t", parameters_json_schema=schema)]))
    stray = T.ServeToolsRequest(result=T.ToolInvocationResult(
        invocation_id=rnd.choice(["", "nope", "i" * 256]), ok=rnd.random() < 0.5,
        result_json=rnd.choice(["", "{}", "nope", "[" * 70 + "]" * 70])))
    msgs = [rnd.choice([reg, stray, T.ServeToolsRequest()]) for _ in range(rnd.randint(1, 4))]

    def call():
        for _ in w.tools.ServeTools(iter(msgs), timeout=CALL_TIMEOUT):
            pass
    return "ServeTools", call


COUNTS: Counter = Counter()  # (rpc, code[, how a prompt ended]) -> calls, printed at the end
OPS = [op_prompt] * 5 + [op_cancel] * 2 + [op_queue, op_watch, op_rewind, op_rewrite, op_append,
                                           op_seed, op_lane, op_lane, op_misc, op_misc, op_tools]
WRITES = {"Cancel", "RewindSession", "RewriteTranscript", "AppendMessages", "SeedSession",
          "ResetSession", "SwitchSession", "SuspendSession", "MarkResumePending", "DeleteSession",
          "UpdateUsage", "PruneSessions", "GetOrCreateSession"}


def check_error(where: str, err: grpc.RpcError) -> None:
    assert err.code() not in BAD, f"{where}: {err.code().name} {err.details()}"
    reason, field = error_info(err)
    assert reason, f"{where}: {err.code().name} without ErrorInfo: {err.details()}"
    if err.code() == grpc.StatusCode.INVALID_ARGUMENT:
        assert field, f"{where}: INVALID_ARGUMENT names no field: {err.details()}"


def tool_host(node: Sidecar) -> ToolHost:
    """The "tools" profile's tool host on ``node``, answering each call with
    the next of RESULTS (None: never); use it as a context manager."""
    answers = iter(RESULTS * 1000)
    return ToolHost(node.tools(), "fz", [("fz.t", "", {"type": "object"})], lambda inv: next(answers))


def run(nodes: list[Sidecar], seed: int, steps: int) -> None:
    """``steps`` random calls, each on any of ``nodes``; a refused write is
    checked against a snapshot taken while no turn runs; then every Prompt
    stream is read to its end."""
    rnd = random.Random(seed)
    w = World(nodes, rnd)
    for step in range(steps):
        name, call = rnd.choice(OPS)(w)
        if call is None:
            continue
        before = w.snapshot() if name in WRITES and w.quiet() else None
        where = f"seed {seed} step {step} {name}"
        try:
            call()
            COUNTS[name, "OK"] += 1
        except grpc.RpcError as e:
            COUNTS[name, e.code().name] += 1
            check_error(where, e)
            if before is not None and w.quiet():
                after = w.snapshot()
                assert after == before, (f"{where}: refused ({e.code().name}) but changed the sessions: "
                                         f"{changes(w.keys, before, after)}")
    for s in w.streams:
        s.result(CALL_TIMEOUT + 5)
        COUNTS["Prompt", s.code.name, s.kinds()[-1] if s.frames else ""] += 1
        if s.error is not None:
            check_error(f"seed {seed} Prompt {s.request_id}", s.error)


def changes(keys: list[str], before: list, after: list) -> list[str]:
    """What differs between two snapshots, per session: the Session fields
    that changed and whether its transcript did, for a failure to say."""
    out = []
    for key, b, a in zip(keys, before, after):
        if a == b:
            continue
        if not (isinstance(a[0], bytes) and isinstance(b[0], bytes)):
            out.append(f"{key}: {b[0]} -> {a[0]}")
            continue
        old, new = c.Session.FromString(b[0]), c.Session.FromString(a[0])
        fields = [f.name for f in c.Session.DESCRIPTOR.fields if getattr(old, f.name) != getattr(new, f.name)]
        out.append(f"{key}: {fields}" + ("" if a[1] == b[1] else f", transcript {len(b[1])} -> {len(a[1])}"))
    return out


def assert_clean(nodes: list[Sidecar]) -> None:
    """Every node and its workers alive, and no error in its log."""
    for node in nodes:
        assert node.proc.poll() is None, node.log()
        wait_until(lambda n=node: all(wk.alive for wk in n.status().workers), 10, what="every worker alive")
        errors = [d for d in log_lines(node) if d.get("level") in ("error", "critical")]
        assert not errors, errors[:3]

#!/usr/bin/env python3
"""Conformance runner for the Python client (protocol: clients/conformance/README.md).

Runs every scenario of scenarios.json, in file order, against a live sidecar
using only the public API of agent_sidecar_client (that is the point: the
suite checks the library, not the wire), and prints one JSON line per
scenario. Exit 0 whenever every scenario ran, whatever the outcomes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
import traceback
import uuid
from typing import Any

import agent_sidecar_client as asc

SCENARIO_TIMEOUT = 20.0


def substitute(value: Any, lang: str) -> Any:
    """Replace {lang} in every string of a scenario."""
    if isinstance(value, str):
        return value.replace("{lang}", lang)
    if isinstance(value, list):
        return [substitute(v, lang) for v in value]
    if isinstance(value, dict):
        return {k: substitute(v, lang) for k, v in value.items()}
    return value


class Failure(Exception):
    """A scenario expectation that did not hold."""


def check(cond: bool, message: str) -> None:
    if not cond:
        raise Failure(message)


def kinds_of(frames: list) -> list[str]:
    return [asc.frame_kind(f) for f in frames]


def matches_pattern(kinds: list[str], pattern: list[str]) -> bool:
    """``["accepted", "text_delta+", "usage?", "x*"]`` against a list of kinds."""
    regex = "".join(f"(?:{re.escape(p.rstrip('+*?'))},){p[-1] if p[-1] in '+*?' else ''}" for p in pattern)
    return re.fullmatch(regex, "".join(k + "," for k in kinds)) is not None


def check_gapless(frames: list) -> None:
    seqs = [f.seq for f in frames]
    check(seqs == list(range(1, len(seqs) + 1)), f"seq not gapless from 1: {seqs}")


def frame_summary(frames: list) -> list[tuple]:
    """What must be identical between a turn and its replay."""
    return [(f.request_id, f.session_id, f.seq, f.WhichOneof("event"),
             getattr(f, f.WhichOneof("event") or "keepalive").SerializeToString(deterministic=True))
            for f in frames]


async def wait_for_kind(stream: asc.FrameStream, kind: str, into: list) -> None:
    async for f in stream:
        into.append(f)
        if asc.frame_kind(f) == kind:
            return
    raise Failure(f"stream ended before a {kind!r} frame: {kinds_of(into)}")


async def drain(stream: asc.FrameStream, into: list) -> None:
    async with stream:
        async for f in stream:
            into.append(f)


class Runner:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.unix: asc.SidecarClient | None = None
        self.tcp: asc.SidecarClient | None = None

    async def client(self, transport: str) -> asc.SidecarClient:
        if transport == "tcp":
            if self.tcp is None:
                self.tcp = await asc.connect(self.args.tcp, token=self.args.token)
            return self.tcp
        if self.unix is None:
            self.unix = await asc.connect(self.args.unix)
        return self.unix

    async def close(self) -> None:
        for c in (self.unix, self.tcp):
            if c is not None:
                await c.close()

    # -- scenarios, named by id ---------------------------------------------

    async def get_or_create_idempotent(self, s: dict) -> None:
        client = await self.client("unix")
        sessions = await asyncio.gather(*(client.get_or_create_session(s["source"])
                                          for _ in range(s.get("concurrency", 8))))
        ids = {x.session_id for x in sessions}
        check(len(ids) == s["expect"]["distinct_session_ids"], f"distinct session ids: {sorted(ids)}")
        keys = {x.session_key for x in sessions}
        check(keys == {s["expect"]["session_key"]}, f"session keys: {sorted(keys)}")

    async def echo_prompt(self, s: dict) -> None:
        client = await self.client("unix")
        frames = await client.prompt(s["text"], source=s["source"], profile=s.get("profile")).collect()
        check_gapless(frames)
        check(matches_pattern(kinds_of(frames), s["expect"]["kinds_pattern"]),
              f"frame kinds {kinds_of(frames)} do not match {s['expect']['kinds_pattern']}")
        final = frames[-1].completed.final_text
        check(final == s["expect"]["final_text"], f"final_text {final!r}")
        text = "".join(f.text_delta.text for f in frames if asc.frame_kind(f) == "text_delta")
        check(text == final, f"text deltas concatenate to {text!r}, final_text is {final!r}")

    async def duplicate_request_id(self, s: dict) -> None:
        client = await self.client("unix")
        rid = str(uuid.uuid4())
        first = await client.prompt(s["text"], source=s["source"], profile=s.get("profile"), request_id=rid).collect()
        second = await client.prompt(s["text"], source=s["source"], profile=s.get("profile"), request_id=rid).collect()
        if s["expect"].get("same_frames"):
            check(frame_summary(first) == frame_summary(second),
                  f"replay differs: {kinds_of(first)} vs {kinds_of(second)}")
        session = await client.get_session(session_key=first[0].session_key)
        check(session.turn_count == s["expect"]["turn_count"], f"turn_count {session.turn_count}")

    async def reject_if_busy(self, s: dict) -> None:
        client = await self.client("unix")
        first = client.prompt(s["first_text"], source=s["source"], profile=s.get("profile"))
        first_frames: list = []
        await wait_for_kind(first, "started", first_frames)
        rest = asyncio.create_task(drain(first, first_frames))
        try:
            got: list = []
            try:
                async for f in client.prompt(s["second_text"], source=s["source"], profile=s.get("profile"),
                                             delivery="reject_if_busy"):
                    got.append(f)
                raise Failure(f"second prompt was not rejected; frames {kinds_of(got)}")
            except asc.AgentBusy as err:
                check(err.reason == s["expect"]["error_reason"], f"reason {err.reason}")
                check(not got, f"frames before the rejection: {kinds_of(got)}")
        finally:
            await rest
        if s["expect"].get("first_completes"):
            check(kinds_of(first_frames)[-1:] == ["completed"], f"first turn ended {kinds_of(first_frames)[-1:]}")

    async def queue_order(self, s: dict) -> None:
        client = await self.client("unix")
        completions: list[str] = []
        positions: list[int] = []

        async def finish(stream: asc.FrameStream, frames: list) -> None:
            await drain(stream, frames)
            end = frames[-1] if frames else None
            completions.append(end.completed.final_text if end is not None and end.HasField("completed")
                               else f"<{kinds_of(frames)[-1:]}>")

        first = client.prompt(s["first_text"], source=s["source"], profile=s.get("profile"))
        frames: list = []
        await wait_for_kind(first, "started", frames)
        tasks = [asyncio.create_task(finish(first, frames))]
        for text in s["queued_texts"]:
            stream = client.prompt(text, source=s["source"], profile=s.get("profile"), delivery="queue")
            qframes: list = []
            await wait_for_kind(stream, "accepted", qframes)  # in order: one accepted before the next is sent
            positions.append(qframes[-1].accepted.queue_position)
            tasks.append(asyncio.create_task(finish(stream, qframes)))
        await asyncio.gather(*tasks)
        check(positions == s["expect"]["queue_positions"], f"queue positions {positions}")
        check(completions == s["expect"]["completion_order"], f"completion order {completions}")

    async def proxy(self, command: str) -> int:
        """Send one command to the harness's cuttable proxy; the connections it has accepted."""
        host, port = self.args.proxy_control.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(command.encode() + b"\n")
            await writer.drain()
            reply = (await reader.readline()).decode().split()
        finally:
            writer.close()
        check(reply[:1] == ["ok"], f"proxy {command}: {reply}")
        return int(reply[1])

    async def _cut_turn(self, s: dict, client: asc.SidecarClient, action: Any) -> list:
        """Run the scenario's prompt through ``client``, calling ``action()`` after cut_after_frames."""
        stream = client.prompt(s["text"], source=s["source"], profile=s.get("profile"))
        frames: list = []
        pending = None
        async with stream:
            async for f in stream:
                frames.append(f)
                if len(frames) == s["cut_after_frames"]:
                    pending = asyncio.create_task(action())
        if pending is not None:
            await pending
        check(stream.resumes >= 1, "the stream was never cut and resumed")
        check_gapless(frames)
        check(kinds_of(frames)[-1] == s["expect"]["last_kind"], f"last kind {kinds_of(frames)[-1]}")
        check(frames[-1].completed.final_text == s["expect"]["final_text"],
              f"final_text {frames[-1].completed.final_text!r}")
        return frames

    async def stream_resume(self, s: dict) -> None:
        await self.proxy("up")
        async with await asc.connect(self.args.proxy) as client:
            await self._cut_turn(s, client, lambda: self.proxy("cut"))

    async def stream_stall(self, s: dict) -> None:
        await self.proxy("up")
        options = [("grpc.keepalive_time_ms", s["keepalive_time_ms"]),
                   ("grpc.keepalive_timeout_ms", s["keepalive_timeout_ms"])]
        async with await asc.connect(self.args.proxy, options=options,
                                     stream_idle_timeout=s["stream_idle_timeout_ms"] / 1000) as client:
            await self._cut_turn(s, client, lambda: self.proxy("stall"))

    async def prompt_outage(self, s: dict) -> None:
        await self.proxy("up")

        async def outage() -> None:
            await self.proxy("down")
            await asyncio.sleep(s["outage_ms"] / 1000)
            await self.proxy("up")

        async with await asc.connect(self.args.proxy) as client:
            await self._cut_turn(s, client, outage)

    async def watch_after_terminal(self, s: dict) -> None:
        client = await self.client("unix")
        frames = await client.prompt(s["text"], source=s["source"], profile=s.get("profile")).collect()
        rid, last = frames[-1].request_id, frames[-1].seq
        for after, want in ((last, s["expect"]["at_terminal_kinds"]), (last - 1, s["expect"]["before_terminal_kinds"])):
            got = await asyncio.wait_for(client.watch(request_id=rid, after_seq=after).collect(),
                                         s["within_ms"] / 1000)
            check(kinds_of(got) == want, f"watch after_seq={after}: {kinds_of(got)}, expected {want}")

    async def watch_too_slow(self, s: dict) -> None:
        """A platform watch left unread is cut STREAM_TOO_SLOW and resumes by itself."""
        producer = await self.client("unix")
        source, platform = dict(s["source"]), s["source"]["platform"]
        text = " ".join("x" * s["word_chars"] + str(i) for i in range(s["words"]))
        first = await producer.prompt("before", source=source, profile=s["profile"]).collect()
        small_window = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024)]
        async with await asc.connect(self.args.unix, options=small_window) as watcher:
            stream = watcher.watch(platform=platform, after_cursor=first[-2].cursor)
            async with stream:
                check((await anext(stream)).cursor == first[-1].cursor, "the watch did not start after its cursor")
                published: list[int] = []
                for i in range(s["turns"]):  # the watch is not read meanwhile
                    source["chat_id"] = f"{s['source']['chat_id']}-{i}"
                    frames = await producer.prompt(text, source=source, profile=s["profile"]).collect()
                    published += [f.cursor for f in frames]
                await asyncio.sleep(s["pause_ms"] / 1000)
                got: list[int] = []
                async for frame in stream:
                    got.append(frame.cursor)
                    if frame.cursor >= published[-1]:
                        break
        check(got == published, f"{len(got)} frames read, {len(published)} published: a gap, a repeat or disorder")
        check(stream.resumes >= 1, "the watch was never reopened: the sidecar did not cut it")

    async def tool_host_outage(self, s: dict) -> None:
        await self.proxy("down")
        spec = s["tool"]
        host = asc.ToolHost(spec["namespace"])

        @host.tool(name=spec["name"], description=spec["description"], schema=spec["schema"])
        def add(a: int, b: int) -> int:
            return a + b

        async with await asc.connect(self.args.proxy, wait_ready=False) as via_proxy:
            serving = asyncio.create_task(host.serve(via_proxy))
            try:
                await asyncio.sleep(s["first_outage_ms"] / 1000)
                check(host.registered is None and not serving.done(), "registered while out of reach")
                await self.proxy("up")
                await host.wait_registered(10)
                await self.proxy("down")
                await asyncio.sleep(s["outage_ms"] / 1000)
                check(not serving.done(), "the tool host stopped during the outage")
                await self.proxy("up")
                await host.wait_registered(10)
                client = await self.client("unix")
                frames = await client.prompt(s["text"], source=s["source"], profile=s.get("profile")).collect()
            finally:
                serving.cancel()
                with contextlib.suppress(asyncio.CancelledError, asc.SidecarError):
                    await serving
                await self.proxy("up")
        results = [f.tool_result for f in frames if asc.frame_kind(f) == "tool_result"]
        check([r.ok for r in results] == [s["expect"]["tool_result_ok"]], f"tool results {results}")
        check(s["expect"]["final_text_contains"] in frames[-1].completed.final_text, f"frames {kinds_of(frames)}")

    async def client_deadline(self, s: dict) -> None:
        await self.proxy("up")
        async with await asc.connect(self.args.proxy, call_timeout=s["call_timeout_ms"] / 1000) as client:
            await self.proxy("stall")  # the connection is up, and nothing will answer on it
            try:
                await client.get_or_create_session(s["source"])
            except asc.SidecarError as err:
                check(err.code.name == s["expect"]["code"] and err.reason == s["expect"]["reason"],
                      f"{type(err).__name__} {err.code.name} reason {err.reason!r}")
                check(isinstance(err, asc.DeadlineExceeded) and not isinstance(err, asc.AgentTimeout),
                      f"{type(err).__name__}")
                return
        raise Failure(f"a call with a {s['call_timeout_ms']} ms deadline succeeded")

    async def target_forms(self, s: dict) -> None:
        path = self.args.unix.removeprefix("unix:")
        ids = set()
        for form in s["forms"]:
            target = form.replace("{path}", path).replace("{tcp}", self.args.tcp)
            token = self.args.token if "{tcp}" in form else None
            async with await asc.connect(target, token, timeout=5) as client:
                ids.add((await client.get_or_create_session(s["source"])).session_id)
        check(len(ids) == 1, f"session ids {ids}")
        for target in s["invalid"]:
            try:
                asc.SidecarClient(target)
            except ValueError:
                continue
            raise Failure(f"target {target!r} was accepted")

    async def tool_call(self, s: dict) -> None:
        client = await self.client("unix")
        spec = s["tool"]
        host = asc.ToolHost(spec["namespace"])

        @host.tool(name=spec["name"], description=spec["description"], schema=spec["schema"])
        def add(a: int, b: int) -> int:
            return a + b

        async with host.running(client):
            frames = await client.prompt(s["text"], source=s["source"], profile=s.get("profile")).collect()
        exp = s["expect"]
        calls = [f.tool_call for f in frames if asc.frame_kind(f) == "tool_call"]
        check([c.name for c in calls] == [exp["tool_call_name"]], f"tool calls {[c.name for c in calls]}")
        results = [f.tool_result for f in frames if asc.frame_kind(f) == "tool_result"]
        check([r.ok for r in results] == [exp["tool_result_ok"]],
              f"tool results {[(r.ok, r.result_json) for r in results]}")
        check(results[0].call_id == calls[0].call_id, "tool_result.call_id differs from tool_call.call_id")
        final = frames[-1].completed.final_text
        check(exp["final_text_contains"] in final, f"final_text {final!r}")

    async def tool_scope_violation(self, s: dict) -> None:
        client = await self.client("unix")
        frames: list = []
        try:
            async for f in client.prompt(s["text"], source=s["source"], profile=s.get("profile")):
                frames.append(f)
            raise Failure(f"no error raised; frames {kinds_of(frames)}")
        except asc.ToolScopeViolation as err:
            check(err.reason == s["expect"]["error_reason"], f"reason {err.reason}")
        check(kinds_of(frames)[-1:] == [s["expect"]["last_kind"]], f"frames {kinds_of(frames)}")
        check(frames[-1].failed.reason == s["expect"]["error_reason"], f"failed.reason {frames[-1].failed.reason}")

    async def unix_and_tcp(self, s: dict) -> None:
        via_unix = await (await self.client("unix")).get_or_create_session(s["source"])
        via_tcp = await (await self.client("tcp")).get_or_create_session(s["source"])
        check(via_unix.session_id == via_tcp.session_id,
              f"unix {via_unix.session_id} vs tcp {via_tcp.session_id}")
        async with await asc.connect(self.args.tcp) as anonymous:
            try:
                await anonymous.get_or_create_session(s["source"])
                raise Failure("TCP call without a token succeeded")
            except asc.Unauthenticated as err:
                check(err.reason == s["expect"]["tcp_without_token_reason"], f"reason {err.reason}")

    async def _tls_session(self, target: str, source: dict, **tls) -> str:
        """The scenario source's session id over a TLS listener (no wait: a
        refused handshake fails the call at once, UNAVAILABLE)."""
        async with await asc.connect(target, self.args.token, wait_ready=False, **tls) as client:
            return (await client.get_or_create_session(source)).session_id

    async def _refused(self, target: str, source: dict, code: str, matches: str = "", **tls) -> None:
        try:
            await self._tls_session(target, source, **tls)
        except asc.SidecarError as err:
            check(err.code.name == code, f"refused with {err.code.name}, not {code}: {err}")
            check(re.search(matches, str(err), re.IGNORECASE) is not None, f"error does not match {matches!r}: {err}")
            return
        raise Failure(f"{target} accepted a client with {sorted(tls)}")

    async def tls_custom_ca(self, s: dict) -> None:
        via_unix = await (await self.client("unix")).get_or_create_session(s["source"])
        via_tls = await self._tls_session(self.args.tls, s["source"], ca_file=self.args.ca)
        check(via_tls == via_unix.session_id, f"unix {via_unix.session_id} vs tls {via_tls}")
        await self._refused(self.args.tls, s["source"], s["expect"]["wrong_ca_code"], ca_file=self.args.wrong_ca)

    async def mtls_client_cert(self, s: dict) -> None:
        via_unix = await (await self.client("unix")).get_or_create_session(s["source"])
        via_mtls = await self._tls_session(self.args.mtls, s["source"], ca_file=self.args.ca,
                                           cert_file=self.args.client_cert, key_file=self.args.client_key)
        check(via_mtls == via_unix.session_id, f"unix {via_unix.session_id} vs mtls {via_mtls}")
        await self._refused(self.args.mtls, s["source"], s["expect"]["without_client_cert_code"],
                            s["expect"].get("without_client_cert_matches", ""), ca_file=self.args.ca)
        await self._refused(self.args.mtls, s["source"], s["expect"]["without_client_cert_code"],
                            s["expect"]["foreign_client_cert_matches"], ca_file=self.args.ca,
                            cert_file=self.args.foreign_cert, key_file=self.args.foreign_key)

    async def connect_failure_reason(self, s: dict) -> None:
        """connect() waits within_ms for the connection; its error says why there is none."""
        expect, nobody = s["expect"], self.args.unix.rsplit("/", 1)[0] + "/nobody.sock"
        cases = ((nobody, {}, expect["missing_socket_matches"]),
                 (self.args.tls, {"ca_file": self.args.wrong_ca}, expect["wrong_ca_matches"]),
                 (self.args.mtls, {"ca_file": self.args.ca}, expect["without_client_cert_matches"]),
                 (self.args.tls, {}, expect["plain_on_tls_matches"]))
        for target, tls, pattern in cases:
            try:
                client = await asc.connect(target, self.args.token, timeout=s["within_ms"] / 1000, **tls)
            except asc.SidecarError as err:
                check(re.search(pattern, str(err), re.IGNORECASE) is not None,
                      f"{target}: error does not match {pattern!r}: {err}")
                continue
            await client.close()
            raise Failure(f"{target} connected with {sorted(tls)}")

    # -- driver -----------------------------------------------------------

    async def run_one(self, scenario: dict) -> dict:
        sid = scenario.get("id", "?")
        handler = SCENARIOS.get(sid)
        if handler is None:
            return {"scenario": sid, "ok": False, "error": "scenario not implemented by the python runner"}
        try:
            await asyncio.wait_for(handler(self, scenario), SCENARIO_TIMEOUT)
            return {"scenario": sid, "ok": True}
        except Failure as exc:
            return {"scenario": sid, "ok": False, "error": str(exc)}
        except TimeoutError:
            return {"scenario": sid, "ok": False, "error": f"timed out after {SCENARIO_TIMEOUT:g}s"}
        except Exception as exc:  # noqa: BLE001 - a crashing scenario is a failed cell, not a crashed runner
            traceback.print_exc(file=sys.stderr)
            return {"scenario": sid, "ok": False, "error": f"{type(exc).__name__}: {exc}"}

    async def run_all(self, scenarios: list[dict]) -> None:
        try:
            for scenario in scenarios:
                print(json.dumps(await self.run_one(substitute(scenario, self.args.lang))), flush=True)
        finally:
            await self.close()


SCENARIOS = {name: getattr(Runner, name) for name in (
    "get_or_create_idempotent", "echo_prompt", "duplicate_request_id", "reject_if_busy", "queue_order",
    "stream_resume", "stream_stall", "prompt_outage", "watch_after_terminal", "watch_too_slow", "tool_call",
    "tool_host_outage", "client_deadline", "target_forms", "tool_scope_violation", "unix_and_tcp", "tls_custom_ca",
    "mtls_client_cert", "connect_failure_reason")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lang", default="python")
    parser.add_argument("--unix", required=True, help="unix:/path/sidecar.sock")
    parser.add_argument("--tcp", required=True, help="127.0.0.1:PORT")
    parser.add_argument("--token", required=True)
    parser.add_argument("--proxy", required=True, help="127.0.0.1:PORT of the harness's cuttable proxy")
    parser.add_argument("--proxy-control", required=True, help="127.0.0.1:PORT of the proxy's control")
    parser.add_argument("--tls", required=True, help="127.0.0.1:PORT of the TLS listener")
    parser.add_argument("--mtls", required=True, help="127.0.0.1:PORT of the mTLS listener")
    parser.add_argument("--ca", required=True, help="PEM CA of both listeners' certificate")
    parser.add_argument("--wrong-ca", required=True, help="PEM CA that signed nothing here")
    parser.add_argument("--client-cert", required=True)
    parser.add_argument("--client-key", required=True)
    parser.add_argument("--foreign-cert", required=True, help="PEM client certificate of --wrong-ca (refused)")
    parser.add_argument("--foreign-key", required=True)
    parser.add_argument("--scenarios", required=True)
    parser.add_argument("--only", default="", help="comma-separated scenario ids (debugging)")
    args = parser.parse_args()
    with open(args.scenarios, encoding="utf-8") as fh:
        scenarios = json.load(fh)["scenarios"]
    if args.only:
        wanted = set(args.only.split(","))
        scenarios = [s for s in scenarios if s.get("id") in wanted]
    asyncio.run(Runner(args).run_all(scenarios))
    return 0


if __name__ == "__main__":
    sys.exit(main())

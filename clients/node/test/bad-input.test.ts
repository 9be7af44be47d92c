/**
 * Bad input gets a clear error naming the argument, at once: never a crash, a
 * hang, a silent wrong result, or a long retry of something that cannot work.
 * Runs against a small in-process fake server on a Unix socket.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { Metadata, status as GrpcCode, type ServerWritableStream } from "@grpc/grpc-js";
import { connect, type SidecarClient } from "../src/client";
import { normalizeTarget } from "../src/connection";
import { SidecarError } from "../src/errors";
import { FrameSequencer } from "../src/frames";
import { Session } from "../src/gen/agent_sidecar/v1/common";
import {
  type ActivityFrame,
  type PromptRequest,
  type PromptResponse,
  PromptServiceService,
  type WatchActivityRequest,
  type WatchActivityResponse,
} from "../src/gen/agent_sidecar/v1/prompt_service";
import { SessionServiceService } from "../src/gen/agent_sidecar/v1/session_service";
import { ToolServiceService } from "../src/gen/agent_sidecar/v1/tool_service";
import { FrameStream, isTransportError } from "../src/stream";
import { ToolHost } from "../src/tools";
import { frame, shortTurn, namesField, serveForTests, sleep, toolStandIn } from "./helpers";

const T = { timeout: 5000 };

let prompts = 0;
/** ServeTools: confirms each registration, then invokes its first tool (invocation id `inv-<registration count>`). */
const tools = toolStandIn((toolNames, n) => [[`inv-${n}`, toolNames[0]]]);

async function prompt(call: ServerWritableStream<PromptRequest, PromptResponse>): Promise<void> {
  prompts += 1;
  const frames = shortTurn(call.request.requestId);
  if (call.request.text === "hang") {
    frames.slice(0, 2).forEach((f) => call.write({ frame: f }));
    await new Promise((r) => call.on("cancelled", r));
    return;
  }
  frames.forEach((f) => call.write({ frame: f }));
  call.end();
}

function watchActivity(call: ServerWritableStream<WatchActivityRequest, WatchActivityResponse>): void {
  shortTurn(call.request.requestId || "feed").forEach((f) => call.write({ frame: f }));
  call.end();
}

const { client, target } = serveForTests(
  [
    [PromptServiceService, { prompt, watchActivity } as any],
    [SessionServiceService, {
      getOrCreateSession: (_call: unknown, cb: Function) =>
        cb(null, { session: Session.fromPartial({ sessionKey: "agent:main:test:dm:x", sessionId: "s1" }), created: true }),
    } as any],
    [ToolServiceService, { serveTools: tools.serveTools }],
  ],
  { resume: { initialBackoffMs: 1, maxBackoffMs: 1 } },
);
const deadSocket = () => `unix:${target.slice("unix:".length)}.missing`;

const run = (opts: Partial<Parameters<SidecarClient["prompt"]>[0]>) =>
  client.prompt({ sessionKey: "agent:main:test:dm:x", text: "ok", ...opts } as any);

// ---- 1. deadlines and timeouts --------------------------------------------------

test("a deadline too far ahead for gRPC counts as none: the turn completes", T, async () => {
  for (const deadline of [1e300, Number.MAX_SAFE_INTEGER, new Date(8.64e15)]) {
    const frames = await run({ deadline }).collect();
    assert.equal(frames.length, 4, `deadline ${deadline}`);
  }
});

test("a deadline that is no deadline throws at once, naming deadline", T, () => {
  for (const deadline of [NaN, Infinity, -Infinity, 0, -1, new Date(NaN)]) {
    assert.throws(() => run({ deadline }), (e: unknown) => e instanceof RangeError && /^deadline: /.test(e.message));
  }
  for (const deadline of ["5000", {}, true]) {
    assert.throws(() => run({ deadline: deadline as any }), (e: unknown) => e instanceof TypeError && /^deadline: /.test(e.message));
  }
});

test("callTimeoutMs is checked at connect; a huge one is no deadline, 0 none", T, async () => {
  for (const callTimeoutMs of [NaN, Infinity, -1, "100"]) {
    assert.throws(() => connect(target, { callTimeoutMs: callTimeoutMs as any }), /^\w*Error: callTimeoutMs: /);
  }
  for (const callTimeoutMs of [1e15, 1e300, 0]) {
    const c = connect(target, { callTimeoutMs });
    try {
      assert.equal((await c.getOrCreateSession({ platform: "test" })).sessionId, "s1");
    } finally {
      c.close();
    }
  }
});

test("ready(timeoutMs) rejects a bad wait, naming timeoutMs, and a huge one waits without limit", T, async () => {
  const c = connect(target);
  const deadlines: Array<Date | number> = [];
  c.raw.sessions.waitForReady = (deadline, cb) => {
    deadlines.push(deadline);
    cb();
  };
  try {
    for (const bad of [NaN, -1, -Infinity, "x", null]) {
      await assert.rejects(c.ready(bad as any), (e: unknown) => e instanceof Error && /^timeoutMs: /.test(e.message));
    }
    assert.equal(deadlines.length, 0);
    await c.ready(1e15);
    await c.ready(Infinity);
    await c.ready(1000);
    assert.deepEqual(deadlines.slice(0, 2), [Infinity, Infinity]);
    assert.ok(typeof deadlines[2] === "number" && deadlines[2] > Date.now() && deadlines[2] <= Date.now() + 1000);
  } finally {
    c.close();
  }
});

// ---- 2. resume options ---------------------------------------------------------

test("resume options must be finite numbers >= 0, naming the option", T, () => {
  const cases: Array<[object, RegExp]> = [
    [{ maxRetries: NaN }, /^resume\.maxRetries: /],
    [{ maxRetries: -1 }, /^resume\.maxRetries: /],
    [{ maxRetries: Infinity }, /^resume\.maxRetries: /],
    [{ initialBackoffMs: NaN }, /^resume\.initialBackoffMs: /],
    [{ initialBackoffMs: -5 }, /^resume\.initialBackoffMs: /],
    [{ maxBackoffMs: Infinity }, /^resume\.maxBackoffMs: /],
    [{ maxRetries: "3" }, /^resume\.maxRetries: /],
  ];
  for (const [resume, re] of cases) {
    assert.throws(() => connect(deadSocket(), { resume }), (e: unknown) => e instanceof Error && re.test(e.message));
    assert.throws(() => run({ resume }), (e: unknown) => e instanceof Error && re.test(e.message));
  }
  assert.throws(() => connect(deadSocket(), { resume: "x" as any }), /resume: expected an object or false/);
});

// ---- 3. serialization failures and numeric arguments ---------------------------

test("a local request serialization failure is not resumed", T, async () => {
  // The client's calls build requests that always serialize (fromPartial); a raw stub's need not.
  const stream = new FrameStream(
    () => client.raw.prompts.prompt({ sessionKey: "k", text: "ok", attachments: [{ bogus: 1 }] } as any, new Metadata()),
    new FrameSequencer("request"),
    { throwOnFailed: true, resume: { initialBackoffMs: 1, maxBackoffMs: 1 } },
  );
  await assert.rejects(stream.collect(), (e: unknown) => {
    assert.ok(e instanceof SidecarError);
    assert.equal(e.code, GrpcCode.INTERNAL);
    assert.match(e.message, /serialization failure/);
    return true;
  });
  assert.equal(stream.resumes, 0);
  const err = (message: string) => new SidecarError({ code: GrpcCode.INTERNAL, reason: "", message });
  assert.equal(isTransportError(err("Request message serialization failure: invalid int32: 1.5")), false);
  assert.equal(isTransportError(err("Received RST_STREAM with code 2")), true);
});

test("numeric arguments are checked before sending, naming the argument", T, async () => {
  for (const delivery of [1.5, NaN, 2 ** 31]) {
    assert.throws(() => run({ delivery: delivery as any }), (e: unknown) => e instanceof RangeError && /^delivery: /.test(e.message));
  }
  for (const delivery of [true, "bogus", "0"]) {
    assert.throws(() => run({ delivery: delivery as any }), (e: unknown) => e instanceof TypeError && /^delivery: /.test(e.message));
  }
  for (const afterSeq of [NaN, 1e300, 1.5, -1]) {
    assert.throws(() => client.watch({ requestId: "r", afterSeq }), (e: unknown) => e instanceof RangeError && /^afterSeq: /.test(e.message));
  }
  for (const afterCursor of [NaN, Infinity, -2]) {
    assert.throws(() => client.watch({ sessionKey: "k", afterCursor }), /^RangeError: afterCursor: /);
  }
  // The resume point a watch does not use: the sidecar refuses it too, never ignores it.
  assert.throws(() => client.watch({ sessionKey: "k", afterSeq: 5 }), namesField("afterSeq", /applies only with requestId/));
  assert.throws(() => client.watch({ requestId: "r", afterCursor: 5 }), namesField("afterCursor", /applies only with sessionKey/));
  const range = (name: string) => (e: unknown) => e instanceof RangeError && e.message.startsWith(`${name}: `);
  await assert.rejects(client.rewindSession("s", NaN), range("n"));
  await assert.rejects(client.rewindSession("s", 1e12), range("n"));
  await assert.rejects(client.searchMessages("x", { limit: 1e12 }), range("limit"));
  await assert.rejects(client.listSessions({ pageSize: 1.5 }), range("pageSize"));
  await assert.rejects(client.listSessions({ activeWithinSeconds: NaN }), range("activeWithinSeconds"));
  await assert.rejects(client.getTranscript("s", { pageSize: Infinity }), range("pageSize"));
  await assert.rejects(client.pruneSessions(NaN), range("maxAgeDays"));
  await assert.rejects(client.updateUsage("k", {}, { lastPromptTokens: 0.5 }), range("lastPromptTokens"));
});

test("text is required and must be a string, naming text", T, () => {
  for (const text of [undefined, null, 42, { a: 1 }]) {
    assert.throws(() => run({ text: text as any }), namesField("text"));
  }
});

// ---- 4. abort and close --------------------------------------------------------

test("an already-aborted signal ends prompt and watch at once, sending nothing", T, async () => {
  const before = prompts;
  assert.deepEqual(await run({ signal: AbortSignal.abort() }).collect(), []);
  assert.deepEqual(await client.watch({ sessionKey: "k", signal: AbortSignal.abort() }).collect(), []);
  assert.deepEqual(await client.watch({ requestId: "r", signal: AbortSignal.abort() }).collect(), []);
  assert.equal(prompts, before);
});

test("client.close() ends streams in flight, and later calls, with CANCELLED", T, async () => {
  const c = connect(target);
  const host = new ToolHost("t");
  host.tool("t.x", "x", { type: "object" }, () => 1);
  await host.serve(c);
  const hostEnded = host.wait().then(() => undefined, (e: unknown) => e);
  const cancelled = (e: unknown) => e instanceof SidecarError && e.code === GrpcCode.CANCELLED;
  const seen: number[] = [];
  await assert.rejects(
    (async () => {
      for await (const f of c.prompt({ sessionKey: "k", text: "hang" })) {
        seen.push(f.seq);
        if (seen.length === 2) c.close();
      }
    })(),
    cancelled,
  );
  assert.deepEqual(seen, [1, 2]);
  assert.ok(cancelled(await hostEnded), "the ToolHost's stream ends too");
  await assert.rejects(c.prompt({ sessionKey: "k", text: "ok" }).collect(), cancelled);
  await assert.rejects(c.getOrCreateSession({ platform: "test" }), cancelled);
});

test("close() or an abort during a resume backoff ends the stream without waiting it out", T, async () => {
  const slow = { initialBackoffMs: 60_000, maxBackoffMs: 60_000 };
  const c = connect(deadSocket(), { resume: slow });
  const ac = new AbortController();
  const aborted = c.prompt({ sessionKey: "k", text: "ok", signal: ac.signal }).collect();
  const closed = c.prompt({ sessionKey: "k", text: "ok" }).collect();
  await sleep(200); // both fail to connect at once, then sit in their 60 s backoff
  const t0 = Date.now();
  ac.abort();
  assert.deepEqual(await aborted, []);
  c.close();
  await assert.rejects(closed, (e: unknown) => e instanceof SidecarError && e.code === GrpcCode.CANCELLED);
  assert.ok(Date.now() - t0 < 1000);
});

// ---- 5, 6. token and target ----------------------------------------------------

test("a token gRPC metadata cannot carry fails at connect, naming token without showing it", T, () => {
  for (const token of ["s3cr\nt", "s3crét", "s3cr\r\nx-evil: 1", "s3cr\u0000t", "s3cr😀"]) {
    assert.throws(
      () => connect(target, { token }),
      (e: unknown) => e instanceof TypeError && /^token: /.test(e.message) && !e.message.includes("s3cr"),
    );
  }
  assert.throws(() => connect(target, { token: 42 as any }), /^TypeError: token: expected a string/);
});

test("a malformed target fails at connect, naming target", T, () => {
  const bad = ["", "   ", "unix:", "unix://", "unix:///", "host:", ":99999", "localhost:99999", "127.0.0.1:0",
    "127.0.0.1:-1", "a b:80", "dns:///", "::1:50051", undefined, null, 42,
    // Outside the targets every client takes (TARGET_FORMS): no port, another scheme.
    "localhost", "::1", "ipv4:127.0.0.1:1", "http://127.0.0.1:1", "tcp:", "tcp:127.0.0.1", "relative/x.sock",
    // As the Python client reads them (_args.normalize_target): a signed port, a bracketed host that is
    // no IPv6 address, a scheme in capitals, an authority without a path, "/" as the socket path.
    "localhost:+80", "[::1]:+80", "dns:localhost:+80", "tcp:localhost:+80", "localhost: 80", "[127.0.0.1]:80",
    "[localhost]:80", "[]:80", "[::1]80", "DNS:///localhost:1", "Unix:/tmp/s.sock", "dns:", "dns:localhost",
    "dns://auth", "dns:///[::1]", "unix-abstract:", "unix-abstract://x", "unix://localhost", "unix:/",
    " localhost:80", "localhost:80 ", "a*b:80", "localhost:\u0663"];
  for (const target of bad) {
    assert.throws(() => connect(target as any), (e: unknown) => e instanceof Error && /^target: /.test(e.message), String(target));
  }
  // gRPC's own address schemes are named as such (before, ipv4:127.0.0.1:1 was told of IPv6 brackets).
  for (const target of ["ipv4:127.0.0.1:1", "ipv6:[::1]:1"]) {
    assert.throws(() => connect(target), /has gRPC's ipv[46]: scheme, which this client does not dial: give the address alone/);
  }
  const good = ["unix:/tmp/x.sock", "unix:///tmp/x.sock", "unix:rel.sock", "./x.sock", "/x.sock", "localhost:50051",
    "[::1]:50051", "dns:///localhost:50051", "example.com:443", "tcp:127.0.0.1:1", "tcp://127.0.0.1:1",
    "../x.sock",
    // As the Python client reads them: an authority before a unix path, leading zeros in a port.
    "unix://localhost/abs/s.sock", "unix-abstract:///name", "unix-abstract:name", "dns:127.0.0.1:1",
    "dns://8.8.8.8/localhost:1", "[::ffff:127.0.0.1]:1", "[fe80::1]:80", "localhost:0080", "my_host.internal:65535",
    "a".repeat(300) + ":80"];
  for (const target of good) connect(target).close();
});

test("unix://AUTHORITY/PATH is the socket PATH (grpc-js would dial PATH relative)", T, () => {
  assert.equal(normalizeTarget("unix://localhost/tmp/s.sock"), "unix:///tmp/s.sock");
  assert.equal(normalizeTarget("unix:///tmp/s.sock"), "unix:///tmp/s.sock");
  assert.equal(normalizeTarget("unix:rel.sock"), "unix:rel.sock");
});

test("a Unix socket path past 107 bytes fails at connect, naming target and its length", T, () => {
  // Before, connect accepted it and the first call failed UNAVAILABLE "connect ENOENT"
  // (libuv cuts the path to 108 bytes, so it could even reach another socket).
  const s = (c: string, n: number) => c.repeat(n);
  const tooLong: [string, number][] = [
    ["unix:/tmp/" + s("s", 110), 115],
    ["unix:/tmp/" + s("s", 103), 108], // one byte too many
    ["unix:///tmp/" + s("s", 103), 108], // the path is /tmp/sss…
    ["unix:" + s("s", 108), 108], // relative
    ["/tmp/" + s("s", 103), 108], // a bare path is unix:
    ["./" + s("s", 106), 108],
    ["unix:/tmp/" + s("é", 52), 109], // bytes of UTF-8, not characters
  ];
  for (const [t, n] of tooLong) {
    assert.throws(
      () => connect(t),
      (e: unknown) =>
        e instanceof RangeError &&
        e.message === `target: ${JSON.stringify(t)}: a Unix socket path may be at most 107 bytes; this one is ${n}`,
      t,
    );
  }
  // Exactly 107 bytes is still a target.
  for (const t of ["unix:/tmp/" + s("s", 102), "unix:///tmp/" + s("s", 102), "unix:" + s("s", 107),
    "/tmp/" + s("s", 102), "./" + s("s", 105), "unix:/tmp/" + s("é", 51)]) {
    connect(t).close();
  }
});

test("a directory given as the socket fails at connect, naming it, as in the Go and Python clients", T, () => {
  // Before, connect accepted the sidecar's data dir (its socket is sidecar.sock inside):
  // ready() waited out its timeout and every call failed UNAVAILABLE "connect ECONNREFUSED".
  const dir = mkdtempSync(join(tmpdir(), "as-dir-"));
  try {
    for (const t of [dir, `unix:${dir}`, `unix://${dir}`]) {
      assert.throws(
        () => connect(t),
        (e: unknown) => e instanceof TypeError && e.message.startsWith(`target: ${JSON.stringify(t)}: ${dir} is a directory, not a socket`),
        t,
      );
    }
  } finally {
    rmSync(dir, { recursive: true });
  }
});

// ---- 7. ToolHost ---------------------------------------------------------------

test("ToolHost: a second tool under the same name throws, naming it", T, () => {
  const host = new ToolHost("t");
  host.tool("t.dup", "first", {}, () => 1);
  assert.throws(() => host.tool("dup", "second", {}, () => 2), /t\.dup/);
  assert.throws(() => host.tool("t.nf", "d", {}, 42 as any), /^TypeError: handler: /);
  assert.deepEqual(host.toolNames, ["t.dup"]);
});

test("ToolHost: close() before serve() makes serve() register nothing", T, async () => {
  const before = tools.registrations.length;
  const host = new ToolHost("t");
  host.tool("t.x", "x", {}, () => 1);
  host.close();
  assert.deepEqual(await host.serve(client), []);
  await host.wait();
  assert.equal(tools.registrations.length, before);
});

test("ToolHost: a thrown value whose toString throws still answers ok=false", T, async () => {
  const host = new ToolHost("t");
  host.tool("t.weird", "x", {}, () => {
    throw { toString: () => { throw new Error("no text"); } };
  });
  await host.serve(client);
  const id = `inv-${tools.registrations.length}`;
  for (let i = 0; i < 200 && !tools.results.some((r) => r.invocationId === id); i++) await sleep(5);
  const r = tools.results.find((x) => x.invocationId === id);
  host.close();
  await host.wait();
  assert.ok(r, "no result came back");
  assert.equal(r.ok, false);
  assert.ok(r.error.length > 0);
});

/**
 * The library against an in-process fake sidecar (a grpc-js server on a Unix
 * socket): resume after a drop, gap repair, typed errors from trailers, bearer
 * token metadata, and the tool host.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { Metadata, Server, status as GrpcCode, type ServerWritableStream, type ServerDuplexStream } from "@grpc/grpc-js";
import { connect, type SidecarClient } from "../src/client";
import { AgentBusy, AgentTimeout, DeadlineExceeded, encodeStatusDetails, STATUS_DETAILS_KEY, ToolScopeViolation, Unauthenticated } from "../src/errors";
import { frameKind } from "../src/frames";
import { Session } from "../src/gen/agent_sidecar/v1/common";
import {
  type ActivityFrame,
  DeliveryMode,
  type PromptRequest,
  type PromptResponse,
  PromptServiceService,
  type WatchActivityRequest,
  type WatchActivityResponse,
} from "../src/gen/agent_sidecar/v1/prompt_service";
import { type GetOrCreateSessionRequest, SessionServiceService } from "../src/gen/agent_sidecar/v1/session_service";
import { type ServeToolsRequest, type ServeToolsResponse, ToolServiceService } from "../src/gen/agent_sidecar/v1/tool_service";
import { ToolHost } from "../src/tools";
import { frame, fullTurn, listenUnix, sleep, type TestServer } from "./helpers";

function sidecarError(code: GrpcCode, reason: string, details: string) {
  const metadata = new Metadata();
  metadata.set(STATUS_DETAILS_KEY, encodeStatusDetails({ code, message: details, reason, retryDelayMs: 250 }));
  return { code, details, metadata };
}

const watches: WatchActivityRequest[] = [];
const TOKEN = "s3cret";

/** Prompt behaviours chosen by the request text. */
async function prompt(call: ServerWritableStream<PromptRequest, PromptResponse>): Promise<void> {
  const req = call.request;
  const frames = fullTurn(req.requestId);
  const send = (f: ActivityFrame) => call.write({ frame: f });
  switch (req.text) {
    case "drop": // three frames, then the connection "drops"
      frames.slice(0, 3).forEach(send);
      call.emit("error", { code: GrpcCode.UNAVAILABLE, details: "Connection dropped" });
      return;
    case "gap": // seq 3 goes missing
      [frames[0], frames[1], frames[3]].forEach(send);
      await sleep(2000);
      call.end();
      return;
    case "hang": // two frames, then silence until the client cuts
      frames.slice(0, 2).forEach(send);
      await new Promise((r) => call.on("cancelled", r));
      return;
    case "scope":
      send(frames[0]);
      send(frames[1]);
      send(frame(3, "failed", "TOOL_SCOPE_VIOLATION", req.requestId));
      call.emit("error", sidecarError(GrpcCode.PERMISSION_DENIED, "TOOL_SCOPE_VIOLATION", "other.x outside conf.*"));
      return;
    case "busy":
      assert.equal(req.delivery, DeliveryMode.REJECT_IF_BUSY);
      call.emit("error", sidecarError(GrpcCode.ABORTED, "AGENT_BUSY", "a turn is in flight"));
      return;
    default:
      frames.forEach(send);
      call.end();
  }
}

/** WatchActivity replays from one frame *before* after_seq, to prove duplicates are dropped. */
function watchActivity(call: ServerWritableStream<WatchActivityRequest, WatchActivityResponse>): void {
  watches.push(call.request);
  for (const f of fullTurn(call.request.requestId)) {
    if (f.seq >= call.request.afterSeq) call.write({ frame: f });
    if (f.seq === 4) call.write({ frame: frame(4, "keepalive", "", call.request.requestId) });
  }
  call.end();
}

function getOrCreateSession(call: { request: GetOrCreateSessionRequest; metadata: Metadata }, cb: Function): void {
  if (call.metadata.get("authorization")[0] !== `Bearer ${TOKEN}`) {
    cb(sidecarError(GrpcCode.UNAUTHENTICATED, "UNAUTHENTICATED", "missing bearer token"));
    return;
  }
  const session = Session.fromPartial({ sessionKey: `agent:main:${call.request.source?.platform}:dm`, sessionId: "s1" });
  cb(null, { session, created: true });
}

function serveTools(call: ServerDuplexStream<ServeToolsRequest, ServeToolsResponse>): void {
  call.on("data", (msg: ServeToolsRequest) => {
    const m = msg.message;
    if (m?.$case === "register" && m.value.namespace === "flaky") {
      registrations += 1;
      call.write({ message: { $case: "registered", value: { namespace: "flaky", toolNames: [] } } });
      if (registrations === 1) call.emit("error", { code: GrpcCode.UNAVAILABLE, details: "going away" });
    } else if (m?.$case === "register") {
      const names = m.value.tools.map((t) => t.name);
      call.write({ message: { $case: "registered", value: { namespace: m.value.namespace, toolNames: names } } });
      for (const [id, tool, args] of [["i1", names[0], '{"a":2,"b":3}'], ["i2", "conf.node.nope", "{}"]]) {
        const inv = { invocationId: id, toolName: tool, argumentsJson: args, sessionKey: "k", sessionId: "s", requestId: "r", timeoutMs: 5000 , traceContext: {} };
        call.write({ message: { $case: "invocation", value: inv } });
      }
    } else if (m?.$case === "result") {
      toolResults.push(m.value);
    }
  });
  call.on("end", () => call.end());
}
let registrations = 0;
const toolResults: Array<{ invocationId: string; ok: boolean; resultJson: string; error: string }> = [];

let srv: TestServer;
let client: SidecarClient;

before(async () => {
  const server = new Server();
  server.addService(PromptServiceService, { prompt, watchActivity } as any);
  server.addService(SessionServiceService, { getOrCreateSession } as any);
  server.addService(ToolServiceService, { serveTools } as any);
  srv = await listenUnix(server);
  client = connect(srv.target, { token: TOKEN, resume: { initialBackoffMs: 10 } });
});

after(async () => {
  client.close();
  await srv.stop();
});

const seqs = (fs: ActivityFrame[]) => fs.map((f) => f.seq);

test("a clean turn streams every frame once", async () => {
  const frames = await client.prompt({ source: { platform: "test" }, text: "ok", requestId: "ok-1" }).collect();
  assert.deepEqual(seqs(frames), [1, 2, 3, 4, 5, 6]);
  assert.equal(frameKind(frames[5]), "completed");
});

test("a dropped stream resumes with WatchActivity(after_seq) without gap or duplicate", async () => {
  watches.length = 0;
  const stream = client.prompt({ sessionKey: "k", text: "drop", requestId: "drop-1" });
  const frames = await stream.collect();
  assert.deepEqual(seqs(frames), [1, 2, 3, 4, 5, 6]);
  assert.equal(stream.resumes, 1);
  assert.deepEqual(watches.map((w) => [w.requestId, w.afterSeq]), [["drop-1", 3]]);
});

test("a gap in seq triggers a resume from the last contiguous frame", async () => {
  watches.length = 0;
  const frames = await client.prompt({ sessionKey: "k", text: "gap", requestId: "gap-1" }).collect();
  assert.deepEqual(seqs(frames), [1, 2, 3, 4, 5, 6]);
  assert.deepEqual(watches.map((w) => w.afterSeq), [2]);
});

test("disconnect() cuts the RPC and the stream resumes transparently", async () => {
  watches.length = 0;
  const stream = client.prompt({ sessionKey: "k", text: "hang", requestId: "hang-1" });
  const got: number[] = [];
  for await (const f of stream) {
    got.push(f.seq);
    if (got.length === 2) stream.disconnect();
  }
  assert.deepEqual(got, [1, 2, 3, 4, 5, 6]);
  assert.equal(stream.resumes, 1);
  assert.deepEqual(watches.map((w) => w.afterSeq), [2]);
});

test("a failed frame is yielded, then the typed error from the trailer is thrown", async () => {
  const got: string[] = [];
  await assert.rejects(
    (async () => {
      for await (const f of client.prompt({ sessionKey: "k", text: "scope" })) got.push(frameKind(f)!);
    })(),
    (err: unknown) => {
      assert.ok(err instanceof ToolScopeViolation);
      assert.equal(err.code, GrpcCode.PERMISSION_DENIED);
      assert.equal(err.message, "other.x outside conf.*");
      return true;
    },
  );
  assert.deepEqual(got, ["accepted", "started", "failed"]);
});

test("REJECT_IF_BUSY surfaces AgentBusy with no frames", async () => {
  const got: ActivityFrame[] = [];
  await assert.rejects(
    (async () => {
      for await (const f of client.prompt({ sessionKey: "k", text: "busy", delivery: "reject_if_busy" })) got.push(f);
    })(),
    (err: unknown) => err instanceof AgentBusy && err.retryDelayMs === 250,
  );
  assert.equal(got.length, 0);
});

test("the token travels as bearer metadata; without it the call is Unauthenticated", async () => {
  const s = await client.getOrCreateSession({ platform: "test" });
  assert.equal(s.sessionId, "s1");
  const anon = connect(srv.target);
  try {
    await assert.rejects(anon.getOrCreateSession({ platform: "test" }), Unauthenticated);
  } finally {
    anon.close();
  }
});

test("ToolHost registers, answers invocations, reports unknown tools", async () => {
  toolResults.length = 0;
  const host = new ToolHost("conf.node");
  host.tool("add", "Add a and b", { type: "object" }, async ({ a, b }: { a: number; b: number }) => a + b);
  assert.deepEqual(await host.serve(client), ["conf.node.add"]);
  for (let i = 0; i < 100 && toolResults.length < 2; i++) await sleep(10);
  const byId = Object.fromEntries(toolResults.map((r) => [r.invocationId, r]));
  assert.deepEqual(byId.i1, { invocationId: "i1", ok: true, resultJson: "5", error: "" });
  assert.equal(byId.i2.ok, false);
  assert.match(byId.i2.error, /unknown tool/);
  host.close();
  await host.wait();
});

test("ToolHost re-registers after the stream drops", async () => {
  const host = new ToolHost("flaky");
  await host.serve(client);
  for (let i = 0; i < 200 && host.reconnects < 1; i++) await sleep(10);
  assert.equal(host.reconnects, 1);
  assert.equal(registrations, 2);
  host.close();
  await host.wait();
});

test("the turn's own deadline surfaces as DeadlineExceeded with no reason (never AGENT_TIMEOUT)", async () => {
  const stream = client.prompt({ sessionKey: "k", text: "hang", deadline: 300 });
  await assert.rejects(
    stream.collect(),
    (err: unknown) => err instanceof DeadlineExceeded && !(err instanceof AgentTimeout) && err.reason === "",
  );
});

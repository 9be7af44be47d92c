/**
 * The stream idle watchdog (streamIdleTimeoutMs) against an in-process grpc-js
 * server on a Unix socket: the caller's time over a frame is not counted, and a
 * silent stream that makes the client replace its channel leaves the other
 * calls on the old one whole (a stream completes, a ToolHost goes on).
 */
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { Server, type ServerDuplexStream, type ServerWritableStream } from "@grpc/grpc-js";
import { connect, type SidecarClient } from "../src/client";
import {
  type ActivityFrame,
  type PromptRequest,
  type PromptResponse,
  PromptServiceService,
  type WatchActivityRequest,
  type WatchActivityResponse,
} from "../src/gen/agent_sidecar/v1/prompt_service";
import { type ServeToolsRequest, type ServeToolsResponse, ToolServiceService } from "../src/gen/agent_sidecar/v1/tool_service";
import { ToolHost } from "../src/tools";
import { frame, fullTurn, listenUnix, type TestServer } from "./helpers";

const T = { timeout: 20_000 };

/** Resolves when `fire` is called. */
function latch(): { promise: Promise<void>; fire: () => void } {
  let fire!: () => void;
  const promise = new Promise<void>((r) => (fire = r));
  return { promise, fire };
}

const watches: number[] = [];
let prompts = 0;
const steadyAt3 = latch();
const stallCut = latch();
const registrations: Array<() => void> = [];
const registered = [latch(), latch()];
const results = [latch(), latch()];

function prompt(call: ServerWritableStream<PromptRequest, PromptResponse>): void {
  prompts += 1;
  const frames = fullTurn(call.request.requestId);
  const send = (f: ActivityFrame) => call.write({ frame: f });
  switch (call.request.text) {
    case "stall": // two frames, then a black hole: nothing, not even keepalives
      frames.slice(0, 2).forEach(send);
      call.on("cancelled", () => stallCut.fire());
      return;
    case "steady": {
      // three frames, keepalives while the stalled stream is silent, the rest once it was cut
      frames.slice(0, 3).forEach(send);
      steadyAt3.fire();
      const ka = setInterval(() => send(frame(3, "keepalive", "", call.request.requestId)), 50);
      call.on("cancelled", () => clearInterval(ka));
      void stallCut.promise.then(() => {
        clearInterval(ka);
        if (call.cancelled) return;
        frames.slice(3).forEach(send);
        call.end();
      });
      return;
    }
    default:
      frames.forEach(send);
      call.end();
  }
}

function watchActivity(call: ServerWritableStream<WatchActivityRequest, WatchActivityResponse>): void {
  watches.push(call.request.afterSeq);
  for (const f of fullTurn(call.request.requestId)) if (f.seq > call.request.afterSeq) call.write({ frame: f });
  call.end();
}

function serveTools(call: ServerDuplexStream<ServeToolsRequest, ServeToolsResponse>): void {
  call.on("data", (msg: ServeToolsRequest) => {
    const m = msg.message;
    if (m?.$case === "register") {
      const n = registrations.push(() => {});
      call.write({ message: { $case: "registered", value: { namespace: m.value.namespace, toolNames: ["t.echo"] } } });
      registered[n - 1]?.fire();
      const inv = { invocationId: String(n), toolName: "t.echo", argumentsJson: "{}", sessionKey: "k", sessionId: "s", requestId: "r", timeoutMs: 5000, traceContext: {} };
      call.write({ message: { $case: "invocation", value: inv } });
    } else if (m?.$case === "result") {
      results[Number(m.value.invocationId) - 1]?.fire();
    }
  });
  call.on("end", () => call.end());
  call.on("error", () => {});
}

let srv: TestServer | undefined;
const clients: SidecarClient[] = [];

async function start(idleMs: number): Promise<SidecarClient> {
  if (!srv) {
    const server = new Server();
    server.addService(PromptServiceService, { prompt, watchActivity } as any);
    server.addService(ToolServiceService, { serveTools } as any);
    srv = await listenUnix(server);
  }
  const c = connect(srv.target, { streamIdleTimeoutMs: idleMs, resume: { initialBackoffMs: 10 } });
  clients.push(c);
  return c;
}

after(async () => {
  for (const c of clients) c.close();
  await srv?.stop();
});

test("a consumer slower than the idle timeout over a frame is no stall: the call is not cut", T, async (t) => {
  // The clock is the test's: setTimeout (the watchdog's timer) fires only when
  // the test moves it. So the sidecar's frames may take as long as a loaded
  // machine makes them take, and the caller's work on a frame (three idle
  // timeouts of the clock, moved while it holds the frame) is all the time
  // that passes: a watchdog that counted it would cut the call.
  t.mock.timers.enable({ apis: ["setTimeout"] });
  const idleMs = 200;
  const client = await start(idleMs);
  const [p0, w0] = [prompts, watches.length];
  const stream = client.prompt({ sessionKey: "k", text: "slow consumer" });
  const seqs: number[] = [];
  for await (const f of stream) {
    seqs.push(f.seq);
    if (f.seq <= 2) t.mock.timers.tick(3 * idleMs); // the caller's own work on a frame
  }
  assert.deepEqual(seqs, [1, 2, 3, 4, 5, 6]);
  assert.equal(stream.resumes, 0);
  assert.deepEqual([prompts - p0, watches.length - w0], [1, 0]);
});

test("a silent stream beside a healthy stream and a tool host: the healthy stream completes, the host goes on", T, async () => {
  const client = await start(500);
  const host = new ToolHost("t").tool("echo", "", {}, () => "ok");
  let ended: unknown = "running";
  const serving = host.serve(client);
  void host.wait().then(
    () => (ended = "ended"),
    (err) => (ended = err),
  );
  await serving;
  await results[0].promise;

  const steady = client.prompt({ requestId: "steady", sessionKey: "k", text: "steady" }).collect();
  await steadyAt3.promise;
  const stalled = client.prompt({ requestId: "stall", sessionKey: "k", text: "stall" }).collect();
  const [a, b] = await Promise.all([steady, stalled]);
  assert.deepEqual(a.map((f) => f.seq), [1, 2, 3, 4, 5, 6]);
  assert.deepEqual(b.map((f) => f.seq), [1, 2, 3, 4, 5, 6]);
  assert.ok(watches.includes(2), `the stalled stream resumed after seq 2 (watches ${watches})`);
  // The tool host was on the replaced channel: it registers on the new one and answers there.
  await registered[1].promise;
  await results[1].promise;
  assert.equal(ended, "running");
  host.close();
  await host.wait();
});

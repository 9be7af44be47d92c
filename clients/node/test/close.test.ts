/**
 * close() ends unary calls in flight at once with the client's "closed" error
 * (CANCELLED) and cancels them on the wire, as it does streams; a call made
 * after close() fails at once. Before, a unary call in flight went on after
 * close() until the sidecar answered or its deadline passed (or never, with
 * callTimeoutMs: 0). Runs against a grpc-js server that never answers.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { Server, status as GrpcCode } from "@grpc/grpc-js";
import { connect } from "../src/client";
import { SidecarError } from "../src/errors";
import { PromptServiceService } from "../src/gen/agent_sidecar/v1/prompt_service";
import { SessionServiceService } from "../src/gen/agent_sidecar/v1/session_service";
import { listenUnix, sleep, type TestServer } from "./helpers";

const T = { timeout: 5000 };

/** Calls the server got, and how many of them the client cancelled. */
let started = 0;
let cancelled = 0;

/** A handler that never answers; it counts the call and its cancellation. */
function never(call: { on(event: "cancelled", f: () => void): void }): void {
  started += 1;
  call.on("cancelled", () => (cancelled += 1));
}

let srv: TestServer;

before(async () => {
  const server = new Server();
  server.addService(SessionServiceService, { getSession: never, appendMessages: never } as any);
  server.addService(PromptServiceService, { cancel: never } as any);
  srv = await listenUnix(server);
});

after(() => srv.stop());

const closed = (e: unknown) =>
  e instanceof SidecarError && e.code === GrpcCode.CANCELLED && e.message === "the client was closed";

test("close() ends unary calls in flight at once with the closed error, and cancels them", T, async () => {
  for (const callTimeoutMs of [0, 30_000]) {
    const c = connect(srv.target, { callTimeoutMs });
    const before = { started, cancelled };
    const pending = [
      c.getSession({ sessionKey: "k" }),
      c.appendMessages("s1", [{ role: "user", content: "hi" }]),
      c.cancel({ sessionKey: "k" }),
    ];
    pending.forEach((p) => p.catch(() => {}));
    for (let i = 0; i < 200 && started < before.started + 3; i++) await sleep(5);
    assert.equal(started, before.started + 3, "the server got the three calls");
    const t0 = Date.now();
    c.close();
    for (const p of pending) await assert.rejects(p, closed);
    assert.ok(Date.now() - t0 < 500, `took ${Date.now() - t0} ms`);
    for (let i = 0; i < 200 && cancelled < before.cancelled + 3; i++) await sleep(5);
    assert.equal(cancelled, before.cancelled + 3, "each call was cancelled on the wire");
  }
});

test("a unary call made after close() fails at once with the closed error, sending nothing", T, async () => {
  const c = connect(srv.target);
  c.close();
  const before = started;
  await assert.rejects(c.getSession({ sessionKey: "k" }), closed);
  await assert.rejects(c.appendMessages("s1", [{ role: "user", content: "hi" }]), closed);
  await sleep(50);
  assert.equal(started, before);
});

test("ready() rejects with typed errors: UNAVAILABLE when nobody listens, the closed error after close()", T, async () => {
  // Before, it rejected a plain Error, unlike every other failure of the client (and
  // Python's connect, which raises a SidecarError UNAVAILABLE); after close() grpc-js's own.
  const absent = connect(srv.target + ".absent");
  await assert.rejects(absent.ready(200), (e: unknown) =>
    e instanceof SidecarError && e.code === GrpcCode.UNAVAILABLE && e.reason === "" &&
    e.message.startsWith(`sidecar at ${srv.target}.absent not ready within 200 ms`));
  absent.close();
  await assert.rejects(absent.ready(200), closed);
});

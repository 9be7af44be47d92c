/**
 * The shipped gRPC service config, over a real in-process grpc-js server that
 * fails on purpose: the idempotent reads are retried on UNAVAILABLE, writes are
 * not; and the typed-error table speaks only reasons the proto declares.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { status as GrpcCode, type sendUnaryData, type ServerUnaryCall } from "@grpc/grpc-js";
import { SERVICE_CONFIG } from "../src/connection";
import { REASONS, SidecarError } from "../src/errors";
import { Session } from "../src/gen/agent_sidecar/v1/common";
import { ErrorReason } from "../src/gen/agent_sidecar/v1/error_reason";
import { SessionServiceService } from "../src/gen/agent_sidecar/v1/session_service";
import { serveForTests } from "./helpers";

const READS = ["GetSession", "ListSessions", "GetTranscript", "SearchMessages", "GetSessionContext", "GetQueue"];
const calls: Record<string, number> = {};

/** Fails each method's first `failures` calls with UNAVAILABLE, then answers. */
function flaky(name: string, failures: number) {
  return (call: ServerUnaryCall<{ sessionKey: string }, unknown>, cb: sendUnaryData<unknown>) => {
    calls[name] = (calls[name] ?? 0) + 1;
    if (calls[name] <= failures) cb({ code: GrpcCode.UNAVAILABLE, details: "try again" });
    else cb(null, { session: Session.fromPartial({ sessionKey: call.request.sessionKey }) });
  };
}

const { client } = serveForTests([
  [SessionServiceService, { getSession: flaky("getSession", 2), resetSession: flaky("resetSession", 1) } as any],
]);

test("the packaged service config is the repository's and retries only the reads", () => {
  const repo = JSON.parse(readFileSync(join(__dirname, "..", "..", "..", "service_config.json"), "utf8"));
  assert.deepEqual(JSON.parse(SERVICE_CONFIG), repo);
  const [methodConfig] = repo.methodConfig;
  assert.deepEqual(methodConfig.name.map((n: { method: string }) => n.method).sort(), [...READS].sort());
  assert.deepEqual(methodConfig.retryPolicy.retryableStatusCodes, ["UNAVAILABLE"]);
});

test("a read is retried on UNAVAILABLE", async () => {
  const session = await client.getSession({ sessionKey: "agent:main:local:dm:me" });
  assert.equal(session.sessionKey, "agent:main:local:dm:me");
  assert.equal(calls.getSession, 3);
});

test("a write is not retried", async () => {
  await assert.rejects(client.resetSession("agent:main:local:dm:me"), (err: unknown) => {
    assert.ok(err instanceof SidecarError);
    assert.equal(err.code, GrpcCode.UNAVAILABLE);
    return true;
  });
  assert.equal(calls.resetSession, 1);
});

test("every reason of the typed-error table is declared in ErrorReason", () => {
  for (const reason of Object.keys(REASONS)) {
    // restart_interrupted and shutdown_timeout are sent in lower case.
    assert.equal(typeof ErrorReason[reason.toUpperCase() as keyof typeof ErrorReason], "number", reason);
  }
});

/** Test helpers: frame builders and an in-process fake sidecar (grpc-js server on a Unix socket). */
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Server, ServerCredentials, type ServiceDefinition, type UntypedServiceImplementation } from "@grpc/grpc-js";
import type { FrameKind } from "../src/frames";
import type { ActivityFrame } from "../src/gen/agent_sidecar/v1/prompt_service";

/** Build a frame of a kind; `text` fills text_delta/completed. */
export function frame(
  seq: number,
  kind: FrameKind,
  text = "",
  requestId = "r1",
  cursor = 100 + seq,
): ActivityFrame {
  const base = { requestId, sessionKey: "agent:main:test:dm:x", sessionId: "s1", seq, at: undefined, cursor };
  switch (kind) {
    case "accepted":
      return { ...base, event: { $case: "accepted", value: { queuePosition: 0 } } };
    case "started":
      return { ...base, event: { $case: "started", value: {} } };
    case "text_delta":
      return { ...base, event: { $case: "textDelta", value: { text } } };
    case "tool_call":
      return { ...base, event: { $case: "toolCall", value: { callId: "c1", name: "t.x", argumentsJson: "{}" } } };
    case "tool_result":
      return { ...base, event: { $case: "toolResult", value: { callId: "c1", ok: true, resultJson: "1" } } };
    case "usage":
      return {
        ...base,
        event: {
          $case: "usage",
          value: { inputTokens: 1, outputTokens: 1, cacheReadTokens: 0, cacheWriteTokens: 0, costUsd: 0 },
        },
      };
    case "completed":
      return { ...base, event: { $case: "completed", value: { finalText: text } } };
    case "failed":
      return { ...base, event: { $case: "failed", value: { reason: text, message: text.toLowerCase() } } };
    case "superseded":
      return { ...base, event: { $case: "superseded", value: { byRequestId: "r2" } } };
    case "keepalive":
      return { ...base, event: { $case: "keepalive", value: {} } };
  }
}

/**
 * Handlers for every method of `service` that record `[method, request]` in
 * `into` (the request as the server decoded it) and answer an empty response;
 * a server stream gets one terminal frame (a request-id stream ends there; a
 * feed ends cleanly).
 */
export function recording(service: ServiceDefinition, into: Array<[string, any]>): UntypedServiceImplementation {
  const handlers: UntypedServiceImplementation = {};
  for (const [name, def] of Object.entries(service)) {
    const empty = def.responseDeserialize(Buffer.alloc(0));
    handlers[name] = def.responseStream
      ? (call: any) => {
          into.push([name, call.request]);
          call.write({ frame: frame(1, "completed", "", call.request.requestId || "feed") });
          call.end();
        }
      : (call: any, cb: Function) => {
          into.push([name, call.request]);
          cb(null, empty);
        };
  }
  return handlers;
}

/** A started grpc-js server on a fresh Unix socket; `stop()` removes it. */
export interface TestServer {
  server: Server;
  target: string;
  stop(): Promise<void>;
}

/** Start `server` (services already added) on a Unix socket in a temp dir. */
export async function listenUnix(server: Server): Promise<TestServer> {
  const dir = mkdtempSync(join(tmpdir(), "sidecar-node-test-"));
  const target = `unix:${join(dir, "s.sock")}`;
  await new Promise<void>((resolve, reject) =>
    server.bindAsync(target, ServerCredentials.createInsecure(), (err) => (err ? reject(err) : resolve())),
  );
  return {
    server,
    target,
    stop: async () => {
      server.forceShutdown();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** The PEM files of tests/helpers/certs.py (a CA, server and client certificates, a wrong CA). */
export interface Certs {
  ca: string;
  serverCert: string;
  serverKey: string;
  clientCert: string;
  clientKey: string;
  otherCa: string;
}

/**
 * Certificates made by the repository's one certificate helper
 * (tests/helpers/certs.py, the openssl command), or undefined when python3
 * or openssl is missing.
 */
export function makeCerts(dir: string): Certs | undefined {
  const tests = join(__dirname, "..", "..", "..", "..", "tests");
  const code = [
    "import sys; from pathlib import Path",
    `sys.path.insert(0, ${JSON.stringify(tests)})`,
    "from helpers.certs import available, make_certs",
    `sys.exit(3) if not available() else make_certs(Path(${JSON.stringify(dir)}))`,
  ].join("\n");
  try {
    execFileSync("python3", ["-c", code], { stdio: "ignore", timeout: 30_000 });
  } catch {
    return undefined;
  }
  const f = (name: string) => join(dir, name);
  return {
    ca: f("ca.pem"),
    serverCert: f("server.pem"),
    serverKey: f("server.key"),
    clientCert: f("client.pem"),
    clientKey: f("client.key"),
    otherCa: f("other-ca.pem"),
  };
}

/** Resolve after `ms`. */
export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

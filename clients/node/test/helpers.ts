/** Test helpers: frame builders and an in-process fake sidecar (grpc-js server on a Unix socket). */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, beforeEach } from "node:test";
import {
  status as GrpcCode,
  Server,
  ServerCredentials,
  type ServiceDefinition,
  type UntypedServiceImplementation,
} from "@grpc/grpc-js";
import { type ConnectOptions, connect, type SidecarClient } from "../src/client";
import { InvalidArgument } from "../src/errors";
import type { FrameKind } from "../src/frames";
import { type ActivityFrame, PromptServiceService } from "../src/gen/agent_sidecar/v1/prompt_service";
import { SessionServiceService } from "../src/gen/agent_sidecar/v1/session_service";
import {
  type RegisterTools,
  type ServeToolsRequest,
  type ToolInvocationResult,
  ToolServiceService,
} from "../src/gen/agent_sidecar/v1/tool_service";

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

/** The full turn the fake prompts play: seq 1..6, "hello world" in two deltas and a usage frame. */
export function fullTurn(requestId: string): ActivityFrame[] {
  return [
    frame(1, "accepted", "", requestId),
    frame(2, "started", "", requestId),
    frame(3, "text_delta", "hello ", requestId),
    frame(4, "text_delta", "world", requestId),
    frame(5, "usage", "", requestId),
    frame(6, "completed", "hello world", requestId),
  ];
}

/** A short completed turn of `requestId`: accepted, started, one text delta "hi", completed "hi". */
export function shortTurn(requestId: string): ActivityFrame[] {
  return [
    frame(1, "accepted", "", requestId),
    frame(2, "started", "", requestId),
    frame(3, "text_delta", "hi", requestId),
    frame(4, "completed", "hi", requestId),
  ];
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

/** A fresh temp dir and a Unix-socket target in it. */
export function tempSocket(): { dir: string; target: string } {
  const dir = mkdtempSync(join(tmpdir(), "sidecar-node-test-"));
  return { dir, target: `unix:${join(dir, "s.sock")}` };
}

/** Start `server` (services already added) on a Unix socket in a temp dir (`at`, a fresh one by default). */
export async function listenUnix(server: Server, at = tempSocket()): Promise<TestServer> {
  const { dir, target } = at;
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

/** The services a test server offers: each definition with its handlers. */
export type Services = Array<[ServiceDefinition, UntypedServiceImplementation]>;

/** A client of a server that runs for one test file's tests, and the server's target. */
export interface Served {
  client: SidecarClient;
  target: string;
}

/**
 * Serve `services` on a fresh Unix socket for this file's tests: the server
 * listens before the first test and stops after the last (node:test hooks);
 * `client`, connected with `options`, is closed then. The client exists at
 * once (its channel connects on the first call, made by a test).
 */
export function serveForTests(services: Services, options?: ConnectOptions): Served {
  const server = new Server();
  for (const [definition, handlers] of services) server.addService(definition, handlers);
  const at = tempSocket();
  const client = connect(at.target, options);
  let srv: TestServer | undefined;
  before(async () => {
    srv = await listenUnix(server, at);
  });
  after(async () => {
    client.close();
    await srv?.stop();
  });
  return { client, target: at.target };
}

/** A ServeTools handler and what it recorded. */
export interface ToolStandIn {
  /** Every registration, in order. */
  registrations: RegisterTools[];
  /** Every invocation result the client sent. */
  results: ToolInvocationResult[];
  serveTools(call: any): void;
}

/**
 * A ServeTools stand-in: records and confirms each registration, then sends
 * the invocations `invoke` lists for it ([invocationId, toolName]; none by
 * default), given the registered tool names and how many registrations there
 * have been; records the results.
 */
export function toolStandIn(
  invoke: (toolNames: string[], registrations: number) => Array<[string, string]> = () => [],
): ToolStandIn {
  const stand: ToolStandIn = { registrations: [], results: [], serveTools };
  function serveTools(call: any): void {
    call.on("data", (msg: ServeToolsRequest) => {
      const m = msg.message;
      if (m?.$case === "register") {
        stand.registrations.push(m.value);
        const toolNames = m.value.tools.map((t) => t.name);
        call.write({ message: { $case: "registered", value: { namespace: m.value.namespace, toolNames } } });
        for (const [invocationId, toolName] of invoke(toolNames, stand.registrations.length)) {
          const inv = { invocationId, toolName, argumentsJson: "{}", sessionKey: "k", sessionId: "s", requestId: "r",
            timeoutMs: 5000, traceContext: {} };
          call.write({ message: { $case: "invocation", value: inv } });
        }
      } else if (m?.$case === "result") {
        stand.results.push(m.value);
      }
    });
    call.on("end", () => call.end());
    call.on("error", () => {});
  }
  return stand;
}

/**
 * The recording sidecar stand-in for this file's tests: every session and
 * prompt call is recorded in `received` ([method, request]), ServeTools goes
 * to `tools`; `received` and what `tools` recorded are emptied before each
 * test. The client does not resume.
 */
export function recordingSidecar(tools: ToolStandIn): Served & { received: Array<[string, any]> } {
  const received: Array<[string, any]> = [];
  const served = serveForTests(
    [
      [SessionServiceService, recording(SessionServiceService, received)],
      [PromptServiceService, recording(PromptServiceService, received)],
      [ToolServiceService, { serveTools: tools.serveTools }],
    ],
    { resume: false },
  );
  beforeEach(() => {
    received.length = 0;
    tools.registrations.length = 0;
    tools.results.length = 0;
  });
  return { ...served, received };
}

/** A call giving `v` for one argument (the others fixed). */
export type Send = (v: any, c: SidecarClient) => unknown;

/**
 * The session calls that take only required strings: [the argument's name,
 * the call giving `v` for it]. Tables of what each argument refuses start here.
 */
export const SESSION_ARGS: Array<[string, Send]> = [
  ["sessionKey", (v, c) => c.resetSession(v)],
  ["sessionKey", (v, c) => c.switchSession(v, "t")],
  ["targetSessionId", (v, c) => c.switchSession("k", v)],
  ["sessionKey", (v, c) => c.suspendSession(v)],
  ["sessionKey", (v, c) => c.markResumePending(v, "r")],
  ["reason", (v, c) => c.markResumePending("k", v)],
  ["sessionKey", (v, c) => c.deleteSession(v)],
  ["confirm", (v, c) => c.clearAllSessions(v)],
];

/**
 * An assert.throws/rejects check: `e` is the client's InvalidArgument naming
 * `field` (its message starts `field: `, its one field violation is `field`),
 * its message matching `why` (anything by default); `label` says which case failed.
 */
export function namesField(field: string, why: RegExp = /./, label = field) {
  return (e: unknown) => {
    assert.ok(e instanceof InvalidArgument, `${label}: ${String(e)}`);
    assert.equal(e.code, GrpcCode.INVALID_ARGUMENT);
    assert.equal(e.reason, "INVALID_ARGUMENT");
    assert.ok(e.message.startsWith(`${field}: `), `${label}: ${e.message}`);
    assert.match(e.message, why, label);
    assert.deepEqual(e.fieldViolations.map((v) => v.field), [field], label);
    return true;
  };
}

/** The PEM files of tests/helpers/certs.py (a CA, server and client certificates, a wrong CA and a client of it). */
export interface Certs {
  ca: string;
  serverCert: string;
  serverKey: string;
  clientCert: string;
  clientKey: string;
  otherCa: string;
  foreignCert: string;
  foreignKey: string;
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
    foreignCert: f("foreign-client.pem"),
    foreignKey: f("foreign-client.key"),
  };
}

/** Resolve after `ms`. */
export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/**
 * A small fake sidecar (grpc-js, in-process) with just enough of the real
 * semantics to run the conformance scenario handlers: session get-or-create,
 * echo and slow-echo turns, request-id dedup with replay, REJECT_IF_BUSY,
 * QUEUE order, WatchActivity resume, a tool call through ServeTools, a scope
 * violation, bearer tokens on TCP, and a TLS and an mTLS listener when given
 * certificates. Not a reference implementation.
 */
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { EventEmitter } from "node:events";
import { Metadata, Server, ServerCredentials, status as GrpcCode } from "@grpc/grpc-js";
import { encodeStatusDetails, STATUS_DETAILS_KEY } from "../src/errors";
import { Session } from "../src/gen/agent_sidecar/v1/common";
import { type ActivityFrame, DeliveryMode, PromptServiceService, type PromptRequest } from "../src/gen/agent_sidecar/v1/prompt_service";
import { SessionServiceService } from "../src/gen/agent_sidecar/v1/session_service";
import { ToolServiceService, type ServeToolsRequest, type ToolInvocationResult } from "../src/gen/agent_sidecar/v1/tool_service";
import { type Certs, listenUnix, sleep, type TestServer } from "./helpers";

type Event = NonNullable<ActivityFrame["event"]>;

function statusError(code: GrpcCode, reason: string, details: string) {
  const metadata = new Metadata();
  metadata.set(STATUS_DETAILS_KEY, encodeStatusDetails({ code, message: details, reason }));
  return { code, details, metadata };
}

/** One turn: its frame log and the listeners following it live. */
class Turn extends EventEmitter {
  frames: ActivityFrame[] = [];
  error?: ReturnType<typeof statusError>;
  done = false;
  constructor(readonly req: PromptRequest, readonly key: string, readonly sessionId: string, readonly profile: string) {
    super();
  }
  emitFrame(event: Event): void {
    const f: ActivityFrame = {
      requestId: this.req.requestId, sessionKey: this.key, sessionId: this.sessionId,
      seq: this.frames.length + 1, at: new Date(), cursor: 0, event,
    };
    this.frames.push(f);
    this.emit("frame", f);
  }
  finish(error?: ReturnType<typeof statusError>): void {
    this.error = error;
    this.done = true;
    this.emit("done");
  }
}

/** The fake; `start()` listens on a Unix socket and on 127.0.0.1 (token required there). */
export class FakeSidecar {
  readonly token = "fake-token";
  tcpTarget = "";
  /** With certificates: a TLS listener and an mTLS one (client certificates of `certs.ca`). */
  tlsTarget = "";
  mtlsTarget = "";

  constructor(private readonly certs?: Certs) {}
  private unix?: TestServer;
  private readonly sessions = new Map<string, Session>();
  private readonly turns = new Map<string, Turn>();
  private readonly lanes = new Map<string, { running?: Turn; queue: Turn[] }>();
  private readonly toolHosts = new Map<string, (inv: { name: string; args: string }) => Promise<ToolInvocationResult>>();

  get unixTarget(): string {
    return this.unix!.target;
  }

  async start(): Promise<void> {
    const server = new Server();
    const auth = (call: { getPeer(): string; metadata: Metadata }) =>
      !call.getPeer().startsWith("127.0.0.1") || call.metadata.get("authorization")[0] === `Bearer ${this.token}`;
    const denied = statusError(GrpcCode.UNAUTHENTICATED, "UNAUTHENTICATED", "missing or wrong bearer token");
    server.addService(SessionServiceService, {
      getOrCreateSession: (call: any, cb: any) =>
        auth(call) ? cb(null, { session: this.session(call.request.source, call.request.profile), created: false }) : cb(denied),
      getSession: (call: any, cb: any) => {
        const s = this.sessions.get(call.request.sessionKey);
        s ? cb(null, { session: s }) : cb(statusError(GrpcCode.NOT_FOUND, "SESSION_NOT_FOUND", "no such session"));
      },
    } as any);
    server.addService(PromptServiceService, {
      prompt: (call: any) => this.prompt(call),
      watchActivity: (call: any) => {
        const t = this.turns.get(call.request.requestId);
        if (!t) return call.emit("error", statusError(GrpcCode.NOT_FOUND, "SESSION_NOT_FOUND", "no such request"));
        this.follow(t, call, call.request.afterSeq);
      },
    } as any);
    server.addService(ToolServiceService, { serveTools: (call: any) => this.serveTools(call) } as any);
    this.unix = await listenUnix(server);
    const port = await new Promise<number>((resolve, reject) =>
      server.bindAsync("127.0.0.1:0", ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))),
    );
    this.tcpTarget = `127.0.0.1:${port}`;
    if (this.certs) {
      const c = this.certs;
      const pair = { cert_chain: readFileSync(c.serverCert), private_key: readFileSync(c.serverKey) };
      const bind = (creds: ServerCredentials) =>
        new Promise<string>((resolve, reject) =>
          server.bindAsync("127.0.0.1:0", creds, (e, p) => (e ? reject(e) : resolve(`127.0.0.1:${p}`))),
        );
      this.tlsTarget = await bind(ServerCredentials.createSsl(null, [pair]));
      this.mtlsTarget = await bind(ServerCredentials.createSsl(readFileSync(c.ca), [pair], true));
    }
  }

  async stop(): Promise<void> {
    await this.unix?.stop();
  }

  private session(src: any, profile: string): Session {
    const p = profile || "main";
    const key = `agent:${p}:${src.platform}:${src.chatType || "dm"}:${src.chatId}`;
    let s = this.sessions.get(key);
    if (!s) {
      s = Session.fromPartial({ sessionKey: key, sessionId: randomUUID().slice(0, 8), profile: p });
      this.sessions.set(key, s);
    }
    return s;
  }

  /** Replay frames after `afterSeq`, follow live ones, end with the turn's status. */
  private follow(t: Turn, call: any, afterSeq: number): void {
    let sent = afterSeq;
    const send = (f: ActivityFrame) => {
      if (f.seq > sent && !call.cancelled) {
        sent = f.seq;
        call.write({ frame: f });
      }
    };
    const end = () => {
      t.off("frame", send);
      if (call.cancelled) return;
      t.error ? call.emit("error", t.error) : call.end();
    };
    t.frames.forEach(send);
    if (t.done) return end();
    t.on("frame", send);
    t.once("done", end);
    call.on("cancelled", () => t.off("frame", send));
  }

  private prompt(call: any): void {
    const req: PromptRequest = call.request;
    const existing = this.turns.get(req.requestId);
    if (existing) return this.follow(existing, call, 0);
    const s = req.source ? this.session(req.source, req.profile) : this.sessions.get(req.sessionKey)!;
    const lane = this.lanes.get(s.sessionKey) ?? { queue: [] };
    this.lanes.set(s.sessionKey, lane);
    if (lane.running && req.delivery === DeliveryMode.REJECT_IF_BUSY) {
      return call.emit("error", statusError(GrpcCode.ABORTED, "AGENT_BUSY", "a turn is in flight"));
    }
    const t = new Turn(req, s.sessionKey, s.sessionId, s.profile);
    this.turns.set(req.requestId, t);
    t.emitFrame({ $case: "accepted", value: { queuePosition: lane.running ? lane.queue.length + 1 : 0 } });
    this.follow(t, call, 0);
    if (lane.running) lane.queue.push(t);
    else void this.run(lane, t);
  }

  private async run(lane: { running?: Turn; queue: Turn[] }, t: Turn): Promise<void> {
    lane.running = t;
    t.emitFrame({ $case: "started", value: {} });
    const words = t.req.text.split(/\s+/).filter(Boolean);
    let final = t.req.text;
    if (t.profile.startsWith("tools_") || t.profile === "scope") {
      const name = t.profile === "scope" ? "other.x" : `conf.${t.profile.slice(6)}.add`;
      t.emitFrame({ $case: "toolCall", value: { callId: "c1", name, argumentsJson: '{"a":2,"b":3}' } });
      if (t.profile === "scope") {
        t.emitFrame({ $case: "failed", value: { reason: "TOOL_SCOPE_VIOLATION", message: `${name} is outside conf.*` } });
        return this.next(lane, t, statusError(GrpcCode.PERMISSION_DENIED, "TOOL_SCOPE_VIOLATION", `${name} is outside conf.*`));
      }
      const r = await this.toolHosts.get(name)!({ name, args: '{"a":2,"b":3}' });
      t.emitFrame({ $case: "toolResult", value: { callId: "c1", ok: r.ok, resultJson: r.resultJson } });
      final = r.resultJson;
      words.splice(0, words.length, final);
    }
    for (const [i, w] of words.entries()) {
      if (t.profile === "slow") await sleep(60);
      t.emitFrame({ $case: "textDelta", value: { text: (i ? " " : "") + w } });
    }
    const usage = { inputTokens: words.length, outputTokens: words.length, cacheReadTokens: 0, cacheWriteTokens: 0, costUsd: 0 };
    t.emitFrame({ $case: "usage", value: usage });
    const s = this.sessions.get(t.key)!;
    s.turnCount += 1;
    t.emitFrame({ $case: "completed", value: { finalText: final } });
    this.next(lane, t);
  }

  private next(lane: { running?: Turn; queue: Turn[] }, t: Turn, error?: ReturnType<typeof statusError>): void {
    t.finish(error);
    lane.running = undefined;
    const n = lane.queue.shift();
    if (n) void this.run(lane, n);
  }

  private serveTools(call: any): void {
    const pending = new Map<string, (r: ToolInvocationResult) => void>();
    call.on("data", (msg: ServeToolsRequest) => {
      const m = msg.message;
      if (m?.$case === "register") {
        for (const tool of m.value.tools) {
          this.toolHosts.set(tool.name, ({ name, args }) => {
            const id = randomUUID();
            const inv = { invocationId: id, toolName: name, argumentsJson: args, sessionKey: "", sessionId: "", requestId: "", timeoutMs: 5000 , traceContext: {} };
            call.write({ message: { $case: "invocation", value: inv } });
            return new Promise((r) => pending.set(id, r));
          });
        }
        const toolNames = m.value.tools.map((x) => x.name);
        call.write({ message: { $case: "registered", value: { namespace: m.value.namespace, toolNames } } });
      } else if (m?.$case === "result") {
        pending.get(m.value.invocationId)?.(m.value);
      }
    });
    call.on("end", () => call.end());
    call.on("error", () => {});
  }
}

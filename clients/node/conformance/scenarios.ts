/**
 * One handler per scenario id of clients/conformance/scenarios.json. A handler
 * resolves when the scenario passes and throws an Error saying what differed.
 */
import { createConnection } from "node:net";
import { isDeepStrictEqual } from "node:util";
import { connect, type ConnectOptions, type SidecarClient, type SourceInput } from "../src/client";
import { AgentTimeout, DeadlineExceeded, REASONS, SidecarError } from "../src/errors";
import { frameKind, type FrameKind } from "../src/frames";
import { ActivityFrame } from "../src/gen/agent_sidecar/v1/prompt_service";
import type { FrameStream } from "../src/stream";
import { ToolHost } from "../src/tools";

/** A scenario after `{lang}` substitution (fields as in scenarios.json). */
export type Scenario = { id: string; transport?: string; expect: Record<string, any> } & Record<string, any>;

/** What every handler gets: the runner's connections and arguments. */
export interface Ctx {
  lang: string;
  unix: SidecarClient;
  /** Connected with the bearer token; undefined when --tcp was not given. */
  tcp?: SidecarClient;
  tcpTarget?: string;
  token: string;
  unixTarget: string;
  /** The harness's cuttable proxy and its control port. */
  proxy?: string;
  proxyControl?: string;
  /** The TLS scenarios' listeners and PEM files (clients/conformance/README.md). */
  tls?: TlsArgs;
}

/** --tls, --mtls, --ca, --wrong-ca, --client-cert, --client-key, --foreign-cert, --foreign-key. */
export interface TlsArgs {
  tls: string;
  mtls: string;
  ca: string;
  wrongCa: string;
  clientCert: string;
  clientKey: string;
  /** A client certificate of wrongCa, which the mTLS listener refuses. */
  foreignCert: string;
  foreignKey: string;
}

type Handler = (sc: Scenario, ctx: Ctx) => Promise<void>;

function check(cond: unknown, message: string): asserts cond {
  if (!cond) throw new Error(message);
}

/** scenarios.json writes sources in proto (snake_case) names; the library takes camelCase. */
function toSource(src: Record<string, unknown>): SourceInput {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(src)) out[k.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase())] = v;
  return out as SourceInput;
}

function client(sc: Scenario, ctx: Ctx): SidecarClient {
  if (sc.transport === "tcp") {
    check(ctx.tcp, "scenario needs --tcp");
    return ctx.tcp;
  }
  return ctx.unix;
}

const kinds = (frames: ActivityFrame[]) => frames.map((f) => frameKind(f) ?? "?");

/** The source's session id over a TLS listener, with these connect options. */
async function tlsSession(target: string, sc: Scenario, ctx: Ctx, opts: ConnectOptions): Promise<string> {
  const c = connect(target, { token: ctx.token, ...opts });
  try {
    return (await c.getOrCreateSession(toSource(sc.source))).sessionId;
  } finally {
    c.close();
  }
}

/**
 * A TLS listener refuses these connect options: the call fails with `code` (a
 * name), its text matching `matches` (a regular expression, case-insensitive).
 */
async function tlsRefused(target: string, sc: Scenario, ctx: Ctx, opts: ConnectOptions, code: string,
  matches = ""): Promise<void> {
  let error: unknown;
  try {
    await tlsSession(target, sc, ctx, opts);
  } catch (err) {
    error = err;
  }
  check(error instanceof SidecarError, `${target} accepted a client with ${Object.keys(opts).join(", ")}`);
  check(error.codeName === code, `refused with ${error.codeName}, not ${code}: ${error.message}`);
  check(new RegExp(matches, "i").test(error.message), `error does not match /${matches}/i: ${error.message}`);
}

/** `ready(withinMs)` fails for `target`, its text matching `matches` (case-insensitive). */
async function readyRefused(target: string, ctx: Ctx, opts: ConnectOptions, withinMs: number,
  matches: string): Promise<void> {
  const c = connect(target, { token: ctx.token, ...opts });
  try {
    await c.ready(withinMs);
  } catch (err) {
    check(err instanceof SidecarError, `${target}: not a SidecarError: ${err}`);
    check(new RegExp(matches, "i").test(err.message), `${target}: error does not match /${matches}/i: ${err.message}`);
    return;
  } finally {
    c.close();
  }
  check(false, `${target} was ready with ${Object.keys(opts).join(", ")}`);
}

/** Match kinds against a pattern like ["accepted", "text_delta+", "usage?", "x*"]. */
export function matchKinds(actual: string[], pattern: string[]): boolean {
  const re = pattern
    .map((p) => {
      const m = /^([a-z_]+)([+*?]?)$/.exec(p);
      if (!m) throw new Error(`bad kinds pattern entry: ${p}`);
      return `(?:${m[1]},)${m[2]}`;
    })
    .join("");
  return new RegExp(`^${re}$`).test(actual.map((k) => k + ",").join(""));
}

function checkGapless(frames: ActivityFrame[]): void {
  const seqs = frames.map((f) => f.seq);
  check(
    seqs.every((s, i) => s === i + 1),
    `seq is not gapless from 1: [${seqs.join(", ")}]`,
  );
}

function finalText(frames: ActivityFrame[]): string | undefined {
  const last = frames[frames.length - 1];
  return last?.event?.$case === "completed" ? last.event.value.finalText : undefined;
}

/** Read a turn to its end, keeping the frames and the error it ended with. */
async function drain(stream: FrameStream, onFrame?: (f: ActivityFrame) => void) {
  const frames: ActivityFrame[] = [];
  let error: unknown;
  try {
    for await (const f of stream) {
      frames.push(f);
      onFrame?.(f);
    }
  } catch (err) {
    error = err;
  }
  return { frames, error };
}

/** Start reading a turn in the background; `first(kind)` resolves when that kind arrives. */
function background(stream: FrameStream) {
  const waiters = new Map<FrameKind, (f: ActivityFrame) => void>();
  const seen = new Map<FrameKind, ActivityFrame>();
  const done = drain(stream, (f) => {
    const k = frameKind(f)!;
    if (!seen.has(k)) seen.set(k, f);
    waiters.get(k)?.(f);
  });
  const first = (kind: FrameKind) =>
    new Promise<ActivityFrame>((resolve, reject) => {
      const s = seen.get(kind);
      if (s) return resolve(s);
      waiters.set(kind, resolve);
      void done.then(({ frames, error }) =>
        reject(new Error(`turn ended before a ${kind} frame (kinds ${kinds(frames)}; ${error ?? "no error"})`)),
      );
    });
  return { done, first };
}

/** The error must be the typed error of `reason`. */
function checkTypedError(error: unknown, reason: string): void {
  check(error !== undefined, `expected ${reason}, but no error was raised`);
  const cls = REASONS[reason]?.cls;
  check(cls, `unknown reason ${reason}`);
  check(
    error instanceof cls && (error as SidecarError).reason === reason,
    `expected ${cls.name} (${reason}), got ${error instanceof SidecarError ? `${error.name} reason=${error.reason || "none"}: ${error.message}` : String(error)}`,
  );
}

/** A frame as comparable JSON (every field, `at` included). */
const asJson = (f: ActivityFrame) => ActivityFrame.toJSON(f);

/** One command to the harness's cuttable proxy (clients/conformance/README.md); the connections it accepted. */
async function proxy(ctx: Ctx, command: string): Promise<number> {
  check(ctx.proxyControl, "scenario needs --proxy-control");
  const [host, port] = [ctx.proxyControl.slice(0, ctx.proxyControl.lastIndexOf(":")), +ctx.proxyControl.slice(ctx.proxyControl.lastIndexOf(":") + 1)];
  const reply = await new Promise<string>((resolve, reject) => {
    const sock = createConnection({ host, port }, () => sock.write(command + "\n"));
    let data = "";
    sock.setEncoding("ascii");
    sock.on("data", (d) => {
      data += d;
      if (data.includes("\n")) {
        sock.end();
        resolve(data.trim());
      }
    });
    sock.on("error", reject);
  });
  const m = /^ok (\d+)$/.exec(reply);
  check(m, `proxy ${command}: ${reply}`);
  return Number(m[1]);
}

function proxyTarget(ctx: Ctx): string {
  check(ctx.proxy, "scenario needs --proxy");
  return ctx.proxy;
}

/** The scenario's prompt through `c`, with `action` run after cut_after_frames frames; it must complete gapless. */
async function cutTurn(sc: Scenario, c: SidecarClient, action: () => Promise<unknown>): Promise<void> {
  const stream = c.prompt({ source: toSource(sc.source), profile: sc.profile, text: sc.text });
  const cutAfter = Number(sc.cut_after_frames);
  const frames: ActivityFrame[] = [];
  let acted: Promise<unknown> | undefined;
  for await (const f of stream) {
    frames.push(f);
    if (frames.length === cutAfter) acted = action();
  }
  await acted;
  check(frames.length > cutAfter, `the turn ended after ${frames.length} frames, before the cut could matter`);
  check(stream.resumes >= 1, "the stream was never resumed");
  checkGapless(frames);
  check(frameKind(frames[frames.length - 1]) === sc.expect.last_kind, `kinds were [${kinds(frames)}]`);
  check(finalText(frames) === sc.expect.final_text, `final_text was ${JSON.stringify(finalText(frames))}`);
}

export const HANDLERS: Record<string, Handler> = {
  async get_or_create_idempotent(sc, ctx) {
    const c = client(sc, ctx);
    const n = Number(sc.concurrency ?? 8);
    const sessions = await Promise.all(Array.from({ length: n }, () => c.getOrCreateSession(toSource(sc.source))));
    const keys = [...new Set(sessions.map((s) => s.sessionKey))];
    const ids = [...new Set(sessions.map((s) => s.sessionId))];
    check(isDeepStrictEqual(keys, [sc.expect.session_key]), `session keys were [${keys}]`);
    check(ids.length === sc.expect.distinct_session_ids, `${ids.length} distinct session ids: [${ids}]`);
  },

  async echo_prompt(sc, ctx) {
    const frames = await client(sc, ctx).prompt({ source: toSource(sc.source), profile: sc.profile, text: sc.text }).collect();
    const k = kinds(frames);
    check(matchKinds(k, sc.expect.kinds_pattern), `kinds were [${k}]`);
    checkGapless(frames);
    check(finalText(frames) === sc.expect.final_text, `final_text was ${JSON.stringify(finalText(frames))}`);
  },

  async duplicate_request_id(sc, ctx) {
    const c = client(sc, ctx);
    const source = toSource(sc.source);
    const before = await c.getOrCreateSession(source, { profile: sc.profile });
    const requestId = `conf-${ctx.lang}-dup-${Date.now()}-${process.pid}`;
    const req = { requestId, source, profile: sc.profile, text: sc.text };
    const first = await c.prompt(req).collect();
    const second = await c.prompt(req).collect();
    checkGapless(first);
    if (sc.expect.same_frames) {
      check(first.length === second.length, `frame counts differ: ${first.length} vs ${second.length}`);
      first.forEach((f, i) =>
        check(
          isDeepStrictEqual(asJson(f), asJson(second[i])),
          `frame ${i + 1} differs: ${JSON.stringify(asJson(f))} vs ${JSON.stringify(asJson(second[i]))}`,
        ),
      );
    }
    const after = await c.getSession({ sessionKey: first[0].sessionKey });
    const turns = after.turnCount - (after.sessionId === before.sessionId ? before.turnCount : 0);
    check(turns === sc.expect.turn_count, `turn_count grew by ${turns} (was ${before.turnCount}, now ${after.turnCount})`);
  },

  async reject_if_busy(sc, ctx) {
    const c = client(sc, ctx);
    const source = toSource(sc.source);
    const first = background(c.prompt({ source, profile: sc.profile, text: sc.first_text }));
    await first.first("started");
    const second = await drain(c.prompt({ source, profile: sc.profile, text: sc.second_text, delivery: "reject_if_busy" }));
    check(second.frames.length === 0, `the rejected prompt yielded frames [${kinds(second.frames)}]`);
    checkTypedError(second.error, sc.expect.error_reason);
    const { frames, error } = await first.done;
    if (sc.expect.first_completes) {
      check(!error && frameKind(frames[frames.length - 1]) === "completed", `first turn ended with [${kinds(frames)}] ${error ?? ""}`);
    }
  },

  async queue_order(sc, ctx) {
    const c = client(sc, ctx);
    const source = toSource(sc.source);
    const completed: string[] = [];
    const start = (text: string, delivery?: "queue") => {
      const t = background(c.prompt({ source, profile: sc.profile, text, delivery }));
      void t.first("completed").then(() => completed.push(text), () => {});
      return t;
    };
    const turns = [start(sc.first_text)];
    await turns[0].first("started");
    const positions: number[] = [];
    for (const text of sc.queued_texts as string[]) {
      const t = start(text, "queue");
      turns.push(t);
      const acc = await t.first("accepted");
      positions.push(acc.event?.$case === "accepted" ? acc.event.value.queuePosition : -1);
    }
    const results = await Promise.all(turns.map((t) => t.done));
    results.forEach(({ error }, i) => check(!error, `turn ${i} failed: ${error}`));
    check(isDeepStrictEqual(positions, sc.expect.queue_positions), `queue positions were [${positions}]`);
    check(isDeepStrictEqual(completed, sc.expect.completion_order), `completion order was ${JSON.stringify(completed)}`);
  },

  async stream_resume(sc, ctx) {
    await proxy(ctx, "up");
    const c = connect(proxyTarget(ctx));
    try {
      await cutTurn(sc, c, () => proxy(ctx, "cut"));
    } finally {
      c.close();
    }
  },

  async stream_stall(sc, ctx) {
    await proxy(ctx, "up");
    const c = connect(proxyTarget(ctx), {
      streamIdleTimeoutMs: sc.stream_idle_timeout_ms,
      channelOptions: { "grpc.keepalive_time_ms": sc.keepalive_time_ms, "grpc.keepalive_timeout_ms": sc.keepalive_timeout_ms },
    });
    try {
      await cutTurn(sc, c, () => proxy(ctx, "stall"));
    } finally {
      c.close();
    }
  },

  async prompt_outage(sc, ctx) {
    await proxy(ctx, "up");
    const c = connect(proxyTarget(ctx));
    try {
      await cutTurn(sc, c, async () => {
        await proxy(ctx, "down");
        await new Promise((r) => setTimeout(r, sc.outage_ms));
        await proxy(ctx, "up");
      });
    } finally {
      c.close();
    }
  },

  async watch_too_slow(sc, ctx) {
    const source = toSource(sc.source);
    const text = Array.from({ length: sc.words }, (_, i) => "x".repeat(sc.word_chars) + i).join(" ");
    const first = await ctx.unix.prompt({ source, profile: sc.profile, text: "before" }).collect();
    // Its own connection, whose 64 KB HTTP/2 window flow control fills.
    const watcher = connect(ctx.unixTarget, { channelOptions: { "grpc-node.flow_control_window": 65535 } });
    try {
      const stream = watcher.watch({ platform: sc.source.platform, afterCursor: first[first.length - 2].cursor });
      const it = stream[Symbol.asyncIterator]();
      const opened = await it.next();
      check(!opened.done && opened.value.cursor === first[first.length - 1].cursor, "the watch did not start after its cursor");
      const published: number[] = [];
      for (let i = 0; i < sc.turns; i++) { // the watch is not read meanwhile
        const src = { ...source, chatId: `${sc.source.chat_id}-${i}` };
        for (const f of await ctx.unix.prompt({ source: src, profile: sc.profile, text }).collect()) published.push(f.cursor);
      }
      await new Promise((resolve) => setTimeout(resolve, sc.pause_ms));
      const got: number[] = [];
      for (let r = await it.next(); !r.done; r = await it.next()) {
        got.push(r.value.cursor);
        if (r.value.cursor >= published[published.length - 1]) break;
      }
      check(isDeepStrictEqual(got, published),
        `${got.length} frames read, ${published.length} published: a gap, a repeat or disorder`);
      check(stream.resumes >= 1, "the watch was never reopened: the sidecar did not cut it");
    } finally {
      watcher.close();
    }
  },

  async watch_after_terminal(sc, ctx) {
    const c = client(sc, ctx);
    const frames = await c.prompt({ source: toSource(sc.source), profile: sc.profile, text: sc.text }).collect();
    const last = frames[frames.length - 1];
    for (const [after, want] of [
      [last.seq, sc.expect.at_terminal_kinds],
      [last.seq - 1, sc.expect.before_terminal_kinds],
    ] as const) {
      const ac = new AbortController();
      const timer = setTimeout(() => ac.abort(), sc.within_ms);
      let got: ActivityFrame[];
      try {
        got = await c.watch({ requestId: last.requestId, afterSeq: after, signal: ac.signal }).collect();
      } finally {
        clearTimeout(timer);
      }
      check(!ac.signal.aborted, `watch after_seq=${after} did not end within ${sc.within_ms} ms`);
      check(isDeepStrictEqual(kinds(got), want), `watch after_seq=${after}: [${kinds(got)}], want [${want}]`);
    }
  },

  async tool_call(sc, ctx) {
    const c = client(sc, ctx);
    const t = sc.tool;
    const host = new ToolHost(t.namespace).tool(t.name, t.description, t.schema, ({ a, b }: { a: unknown; b: unknown }) => {
      if (!Number.isInteger(a) || !Number.isInteger(b)) throw new Error("a and b must be integers");
      return (a as number) + (b as number);
    });
    await host.serve(c);
    try {
      const { frames, error } = await drain(c.prompt({ source: toSource(sc.source), profile: sc.profile, text: sc.text }));
      check(!error, `turn failed: ${error} (kinds [${kinds(frames)}])`);
      const call = frames.find((f) => f.event?.$case === "toolCall");
      const name = call?.event?.$case === "toolCall" ? call.event.value.name : undefined;
      check(name === sc.expect.tool_call_name, `tool_call name was ${name} (kinds [${kinds(frames)}])`);
      const result = frames.find((f) => f.event?.$case === "toolResult");
      const ok = result?.event?.$case === "toolResult" ? result.event.value.ok : undefined;
      check(ok === sc.expect.tool_result_ok, `tool_result ok was ${ok}`);
      const text = finalText(frames) ?? "";
      check(text.includes(sc.expect.final_text_contains), `final_text was ${JSON.stringify(text)}`);
    } finally {
      host.close();
    }
  },

  async tool_scope_violation(sc, ctx) {
    const { frames, error } = await drain(
      client(sc, ctx).prompt({ source: toSource(sc.source), profile: sc.profile, text: sc.text }),
    );
    checkTypedError(error, sc.expect.error_reason);
    check(frameKind(frames[frames.length - 1]) === sc.expect.last_kind, `kinds were [${kinds(frames)}]`);
    const last = frames[frames.length - 1];
    const reason = last?.event?.$case === "failed" ? last.event.value.reason : undefined;
    check(reason === sc.expect.error_reason, `failed frame reason was ${reason}`);
  },

  async tool_host_outage(sc, ctx) {
    await proxy(ctx, "down");
    const c = connect(proxyTarget(ctx), { resume: { windowMs: sc.resume_window_ms } });
    const t = sc.tool;
    const host = new ToolHost(t.namespace).tool(t.name, t.description, t.schema, ({ a, b }: { a: number; b: number }) => a + b);
    try {
      const registered = host.serve(c);
      let settled = false;
      registered.then(() => (settled = true), () => (settled = true));
      await new Promise((r) => setTimeout(r, sc.first_outage_ms));
      check(!settled, "serve() settled while the sidecar was out of reach");
      await proxy(ctx, "up");
      await registered;
      const before = host.reconnects;
      await proxy(ctx, "down");
      await new Promise((r) => setTimeout(r, sc.outage_ms));
      await proxy(ctx, "up");
      for (;;) {
        const { frames, error } = await drain(ctx.unix.prompt({ source: toSource(sc.source), profile: sc.profile, text: sc.text }));
        if (!error && (finalText(frames) ?? "").includes(sc.expect.final_text_contains)) break;
        check(host.reconnects === before, `no tool call served after re-registering: ${error}`);
        await new Promise((r) => setTimeout(r, 200)); // until the host has registered again
      }
    } finally {
      host.close();
      c.close();
      await proxy(ctx, "up");
    }
  },

  async client_deadline(sc, ctx) {
    await proxy(ctx, "up");
    const c = connect(proxyTarget(ctx), { callTimeoutMs: sc.call_timeout_ms });
    try {
      await c.ready(5000);
      await proxy(ctx, "stall");
      let error: unknown;
      try {
        await c.getOrCreateSession(toSource(sc.source));
      } catch (err) {
        error = err;
      }
      check(error instanceof SidecarError, `a call with a ${sc.call_timeout_ms} ms deadline did not fail: ${error}`);
      check(error.codeName === sc.expect.code && error.reason === sc.expect.reason, `${error.name} ${error.codeName} reason ${JSON.stringify(error.reason)}`);
      check(error instanceof DeadlineExceeded && !(error instanceof AgentTimeout), error.name);
    } finally {
      c.close();
    }
  },

  async target_forms(sc, ctx) {
    const path = ctx.unixTarget.replace(/^unix:/, "");
    const ids = new Set<string>();
    for (const form of sc.forms as string[]) {
      const target = form.replace("{path}", path).replace("{tcp}", ctx.tcpTarget ?? "");
      const c = connect(target, form.includes("{tcp}") ? { token: ctx.token } : {});
      try {
        ids.add((await c.getOrCreateSession(toSource(sc.source))).sessionId);
      } finally {
        c.close();
      }
    }
    check(ids.size === 1, `session ids ${[...ids]}`);
    for (const target of sc.invalid as string[]) {
      let thrown = false;
      try {
        connect(target).close();
      } catch {
        thrown = true;
      }
      check(thrown, `target ${JSON.stringify(target)} was accepted`);
    }
    for (const target of (sc.accepted ?? []) as string[]) {
      // Forms no sidecar here listens on: taken, not dialled.
      try {
        connect(target).close();
      } catch (err) {
        check(false, `target ${JSON.stringify(target)} was refused: ${err}`);
      }
    }
  },

  async unix_and_tcp(sc, ctx) {
    check(ctx.tcp && ctx.tcpTarget, "scenario needs --tcp");
    const source = toSource(sc.source);
    const viaUnix = await ctx.unix.getOrCreateSession(source);
    const viaTcp = await ctx.tcp.getOrCreateSession(source);
    if (sc.expect.same_session_id) {
      check(viaUnix.sessionId === viaTcp.sessionId, `session ids differ: ${viaUnix.sessionId} vs ${viaTcp.sessionId}`);
    }
    const anon = connect(ctx.tcpTarget);
    try {
      let error: unknown;
      try {
        await anon.getOrCreateSession(source);
      } catch (err) {
        error = err;
      }
      checkTypedError(error, sc.expect.tcp_without_token_reason);
    } finally {
      anon.close();
    }
  },

  async tls_custom_ca(sc, ctx) {
    check(ctx.tls, "scenario needs --tls");
    const viaUnix = await ctx.unix.getOrCreateSession(toSource(sc.source));
    const viaTls = await tlsSession(ctx.tls.tls, sc, ctx, { caFile: ctx.tls.ca });
    check(viaTls === viaUnix.sessionId, `session ids differ: ${viaUnix.sessionId} vs ${viaTls}`);
    await tlsRefused(ctx.tls.tls, sc, ctx, { caFile: ctx.tls.wrongCa }, sc.expect.wrong_ca_code);
  },

  async mtls_client_cert(sc, ctx) {
    check(ctx.tls, "scenario needs --mtls");
    const viaUnix = await ctx.unix.getOrCreateSession(toSource(sc.source));
    const viaMtls = await tlsSession(ctx.tls.mtls, sc, ctx, {
      caFile: ctx.tls.ca,
      certFile: ctx.tls.clientCert,
      keyFile: ctx.tls.clientKey,
    });
    check(viaMtls === viaUnix.sessionId, `session ids differ: ${viaUnix.sessionId} vs ${viaMtls}`);
    await tlsRefused(ctx.tls.mtls, sc, ctx, { caFile: ctx.tls.ca }, sc.expect.without_client_cert_code,
      sc.expect.without_client_cert_matches ?? "");
    await tlsRefused(ctx.tls.mtls, sc, ctx, { caFile: ctx.tls.ca, certFile: ctx.tls.foreignCert, keyFile: ctx.tls.foreignKey },
      sc.expect.without_client_cert_code, sc.expect.foreign_client_cert_matches);
  },

  async connect_failure_reason(sc, ctx) {
    check(ctx.tls, "scenario needs --tls and --mtls");
    const nobody = ctx.unixTarget.replace(/[^/]*$/, "nobody.sock");
    await readyRefused(nobody, ctx, {}, sc.within_ms, sc.expect.missing_socket_matches);
    await readyRefused(ctx.tls.tls, ctx, { caFile: ctx.tls.wrongCa }, sc.within_ms, sc.expect.wrong_ca_matches);
    await readyRefused(ctx.tls.mtls, ctx, { caFile: ctx.tls.ca }, sc.within_ms, sc.expect.without_client_cert_matches);
    await readyRefused(ctx.tls.tls, ctx, {}, sc.within_ms, sc.expect.plain_on_tls_matches);
  },
};

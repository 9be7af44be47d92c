/**
 * ToolHost: host tools for the agent over ToolService.ServeTools. Register
 * functions, `serve` the namespace on a client, and the host answers
 * invocations concurrently until `close`.
 *
 *     const host = new ToolHost("local");
 *     host.tool("local.clock.now", "Current time", { type: "object" }, async () => new Date().toISOString());
 *     await host.serve(client);
 */
import { status as GrpcCode, type ClientDuplexStream } from "@grpc/grpc-js";
import { closedError, type SidecarClient } from "./client";
import { typeOf } from "./connection";
import { CLOSED_AT_SETUP_HINT, fromGrpcError, isSerializationError, SidecarError } from "./errors";
import { checkTexts, required, requireTexts, toValidText } from "./text";
import {
  ServeToolsRequest,
  type ServeToolsResponse,
  type ToolInvocation,
  type ToolInvocationResult,
  type ToolSpec,
} from "./gen/agent_sidecar/v1/tool_service";

/** What a tool handler learns about the call besides its arguments. */
export interface ToolContext {
  invocationId: string;
  /** Full dotted tool name. */
  toolName: string;
  sessionKey: string;
  sessionId: string;
  requestId: string;
  /** How long the sidecar waits for the result (0 if unknown). */
  timeoutMs: number;
  /**
   * W3C Trace Context of the sidecar's span for this call (`traceparent`,
   * `tracestate`); empty when the sidecar does not trace.
   */
  traceContext: { [key: string]: string };
  /** Aborted when the sidecar's timeout passes or the host closes. */
  signal: AbortSignal;
}

/**
 * A tool implementation: receives the parsed arguments object and returns a
 * JSON-serializable result (or a promise of one). Throwing reports
 * `ok=false` with the error's message to the model.
 */
export type ToolHandler = (args: any, ctx: ToolContext) => unknown;

interface Registered {
  spec: ToolSpec;
  handler: ToolHandler;
}

type ToolStream = ClientDuplexStream<ServeToolsRequest, ServeToolsResponse>;

/** Options of {@link ToolHost.serve}. */
export interface ServeOptions {
  /** Re-open and re-register after the stream drops (default true). */
  reconnect?: boolean;
  /** Ceiling of the backoff between re-registration attempts (default 5000 ms). */
  maxBackoffMs?: number;
  /**
   * Called before each new attempt to open and register after a failed one
   * (attempt 1, 2, ... since the last registration), with why it failed: a
   * sidecar not up yet and a wrong port look the same, and the host waits for
   * both. Default: `console.warn` of the 1st failure and every
   * {@link RETRY_LOG_EVERY}-th after it.
   */
  onRetry?: (err: SidecarError, attempt: number) => void;
}

/** Without `onRetry`, the host warns of the 1st failed attempt and every this many-th (about a minute at 5 s). */
export const RETRY_LOG_EVERY = 12;

/**
 * Node's text for a connection the peer closed or reset during the TLS
 * handshake: a proxy whose sidecar is down (Docker's port forwarding, say)
 * does that to every connection, and a wait mends it.
 */
const CLOSED_IN_HANDSHAKE = /socket disconnected before secure TLS connection was established|ECONNRESET/i;

/**
 * A TLS handshake or certificate failure (a CA that did not sign the sidecar's
 * certificate, TLS to a plain port): UNAVAILABLE like a refused connection,
 * told apart by grpc-js's text (it keeps OpenSSL's). No wait mends it: the
 * host stops with it. Not a connection the peer closed, during the handshake
 * or as it was set up: an mTLS listener refusing the client looks so, but so
 * does a proxy whose sidecar is down, which a wait mends (each attempt's error
 * names the client certificate).
 */
export function isTlsFailure(e: SidecarError): boolean {
  if (e.reason !== "" || e.code !== GrpcCode.UNAVAILABLE || e.message.includes(CLOSED_AT_SETUP_HINT)) return false;
  if (CLOSED_IN_HANDSHAKE.test(e.message)) return false;
  return /certificate|SSL routines|\bssl\b|\btls\b|handshake|self[- ]signed|unable to verify|alert/i.test(e.message);
}

/**
 * Codes worth retrying a registration on (the sidecar is down or restarting),
 * without an agent-sidecar reason: the Python and Go clients' set.
 */
const RETRY_CODES = new Set<number>([GrpcCode.UNAVAILABLE, GrpcCode.INTERNAL, GrpcCode.UNKNOWN, GrpcCode.CANCELLED]);

/** Hosts tools under one namespace (a dotted prefix such as `discord` or `conf.node`). */
export class ToolHost {
  private readonly tools = new Map<string, Registered>();
  /** How many times the stream was re-opened and re-registered after a drop. */
  reconnects = 0;
  private client?: SidecarClient;
  private call?: ToolStream;
  private reconnect = true;
  private maxBackoffMs = 5000;
  private onRetry?: (err: SidecarError, attempt: number) => void;
  private attempts = 0;
  private closing = false;
  private ended = false;
  private endError?: SidecarError;
  private readonly waiters: Array<() => void> = [];
  private readonly inFlight = new Map<string, AbortController>();
  /** Ends the waits between attempts (close). */
  private readonly wakers = new Set<() => void>();

  /**
   * A namespace that is absent (undefined, null), not a string or holds a lone
   * surrogate throws InvalidArgument naming `namespace`.
   */
  constructor(readonly namespace: string) {
    requireTexts({ namespace });
  }

  /**
   * Add a tool. `name` is the full dotted name (`local.clock.now`); a name
   * without the namespace prefix gets it (`clock.now` → `local.clock.now`).
   * `schema` is the JSON Schema of the arguments object (object or JSON text).
   * A description or schema left out (undefined, null) is sent empty (the
   * sidecar reads no schema as `{"type": "object"}`); a name left out throws
   * InvalidArgument naming it. A second tool under the same full name throws;
   * so does a name, description or schema text with a lone surrogate
   * (InvalidArgument naming it).
   */
  tool(
    name: string,
    description: string | null | undefined,
    schema: object | string | null | undefined,
    handler: ToolHandler,
  ): this {
    if (this.client) throw new Error("ToolHost: add tools before serve()");
    required(name, "name");
    description ??= "";
    schema ??= "";
    if (typeof name !== "string" || name === "") {
      throw new TypeError(`name: expected a tool name, got ${name === "" ? '""' : typeOf(name)}`);
    }
    if (typeof description !== "string") {
      throw new TypeError(`description: expected a string, got ${typeOf(description)}`);
    }
    if (typeof schema !== "string" && (typeof schema !== "object" || schema === null)) {
      throw new TypeError(`schema: expected a JSON Schema object or its JSON text, got ${typeOf(schema)}`);
    }
    if (typeof handler !== "function") throw new TypeError(`handler: expected a function, got ${typeOf(handler)}`);
    checkTexts({ name, description, schema: typeof schema === "string" ? schema : undefined });
    const full = name === this.namespace || name.startsWith(this.namespace + ".") ? name : `${this.namespace}.${name}`;
    if (this.tools.has(full)) throw new Error(`ToolHost: a tool named ${full} is already added`);
    const parametersJsonSchema = typeof schema === "string" ? schema : JSON.stringify(schema);
    this.tools.set(full, { spec: { name: full, description, parametersJsonSchema }, handler });
    return this;
  }

  /** Names of the tools added so far. */
  get toolNames(): string[] {
    return [...this.tools.keys()];
  }

  /**
   * Open ServeTools on `client`, register the tools, and resolve with the
   * registered names once the sidecar confirms (ToolsRegistered). While the
   * sidecar is out of reach (not up yet) it waits and retries with backoff, as
   * the Python and Go hosts do; it rejects with the typed error when the sidecar
   * refuses the registration (an error with a reason) or on a TLS failure (a
   * wrong CA: {@link isTlsFailure}). Each failed
   * attempt goes to `onRetry` (default: a warning, the 1st and every 12th). Later, if
   * the stream drops (a sidecar restart), the host re-opens it and registers
   * again with backoff, unless `reconnect: false`. After {@link close} it opens
   * nothing and resolves with `[]` (no tool registered).
   */
  serve(client: SidecarClient, opts?: ServeOptions | null): Promise<string[]> {
    if (this.client) throw new Error("ToolHost: serve() was already called");
    required(client, "client");
    this.client = client;
    if (this.closing) return Promise.resolve([]);
    this.reconnect = opts?.reconnect ?? true;
    this.maxBackoffMs = opts?.maxBackoffMs ?? 5000;
    this.onRetry = opts?.onRetry;
    return this.firstOpen();
  }

  /**
   * The first registration: while the sidecar is out of reach (not up yet, a
   * transport error), wait for it with backoff, as later registrations do; a
   * refusal with a reason, a local error or close() ends it.
   */
  private async firstOpen(): Promise<string[]> {
    let delay = 100;
    for (;;) {
      try {
        const names = await this.open();
        this.attempts = 0;
        return names;
      } catch (err) {
        const e = fromGrpcError(err);
        if (!this.reconnect || !this.retryable(e)) throw e;
        this.retrying(e);
      }
      await this.pause(delay);
      delay = Math.min(delay * 2, this.maxBackoffMs);
      if (this.closing) return [];
      await this.pause(this.maxBackoffMs, this.client!.ready(this.maxBackoffMs));
      if (this.closing) return [];
    }
  }

  private retryable(e: SidecarError): boolean {
    return (
      e.reason === "" && RETRY_CODES.has(e.code) && !isSerializationError(e) && !isTlsFailure(e) && !this.client!.closed
    );
  }

  /** Report a failed attempt before the next one. */
  private retrying(e: SidecarError): void {
    this.attempts += 1;
    if (this.onRetry) return this.onRetry(e, this.attempts);
    if (this.attempts === 1 || this.attempts % RETRY_LOG_EVERY === 0) {
      console.warn(`agent-sidecar: ToolHost ${JSON.stringify(this.namespace)}: ServeTools failed (attempt ${this.attempts}), retrying: ${e.message}`);
    }
  }

  /**
   * Resolve when hosting has ended: after {@link close}, or when the stream
   * ended for good (reconnect off, or a permanent error while re-registering);
   * rejects with that error in the latter case.
   */
  wait(): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      const settle = () => (this.endError ? reject(this.endError) : resolve());
      if (this.ended) settle();
      else this.waiters.push(settle);
    });
  }

  /**
   * Stop hosting: end the stream and abort the handlers still running. A wait
   * between attempts ends at once (serve() resolves with `[]`), leaving no
   * timer to keep the process alive.
   */
  close(): void {
    if (this.closing) return;
    this.closing = true;
    for (const wake of [...this.wakers]) wake();
    this.abortInFlight();
    const call = this.call;
    if (call) {
      call.end();
      call.cancel();
    } else {
      this.finish();
    }
  }

  /** Open one ServeTools stream and register; resolves on ToolsRegistered. */
  private open(): Promise<string[]> {
    let call: ToolStream;
    try {
      call = this.client!.serveTools();
    } catch (err) {
      return Promise.reject(fromGrpcError(err)); // e.g. the client was closed
    }
    this.call = call;
    return new Promise<string[]>((resolve, reject) => {
      let registered = false;
      let over = false;
      const ended = (err?: SidecarError) => {
        if (over) return;
        over = true;
        if (this.call === call) this.call = undefined;
        this.abortInFlight();
        const e = err ?? new SidecarError({ code: GrpcCode.UNAVAILABLE, reason: "", message: "ServeTools stream ended" });
        if (!registered) reject(e);
        else if (this.closing) this.finish();
        else if (this.client!.closed) this.finish(closedError());
        else if (!this.reconnect) this.finish(e);
        else void this.reopen();
      };
      call.on("data", (msg: ServeToolsResponse) => {
        const m = msg.message;
        if (m?.$case === "registered") {
          registered = true;
          resolve(m.value.toolNames);
        } else if (m?.$case === "invocation") {
          void this.invoke(m.value, call);
        }
      });
      call.on("error", (err) => ended(fromGrpcError(err)));
      call.on("end", () => ended());
      const tools = [...this.tools.values()].map((t) => t.spec);
      const register = { namespace: this.namespace, tools };
      call.write(ServeToolsRequest.fromPartial({ message: { $case: "register", value: register } }));
    });
  }

  /** Re-open after a drop, with backoff, until registered, closed, or refused for good. */
  private async reopen(): Promise<void> {
    let delay = 100;
    while (!this.closing) {
      await this.pause(delay);
      if (this.closing) break;
      try {
        await this.open();
        this.reconnects += 1;
        this.attempts = 0;
        return;
      } catch (err) {
        const e = fromGrpcError(err);
        if (!this.retryable(e)) return this.finish(e);
        this.retrying(e);
        delay = Math.min(delay * 2, this.maxBackoffMs);
      }
    }
    this.finish();
  }

  /**
   * Wait `ms`, or until `until` settles when given, whichever comes first; or
   * until close(), which ends every such wait at once, its timer cleared.
   */
  private pause(ms: number, until?: Promise<unknown>): Promise<void> {
    if (this.closing) return Promise.resolve();
    return new Promise<void>((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.wakers.delete(done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.wakers.add(done);
      until?.then(done, done);
    });
  }

  private abortInFlight(): void {
    for (const c of this.inFlight.values()) c.abort();
  }

  private finish(err?: SidecarError): void {
    if (this.ended) return;
    this.ended = true;
    this.endError = this.closing ? undefined : err;
    this.abortInFlight();
    for (const w of this.waiters.splice(0)) w();
  }

  private async invoke(inv: ToolInvocation, call: ToolStream): Promise<void> {
    const ac = new AbortController();
    this.inFlight.set(inv.invocationId, ac);
    const timer = inv.timeoutMs > 0 ? setTimeout(() => ac.abort(), inv.timeoutMs) : undefined;
    let result: ToolInvocationResult;
    try {
      const tool = this.tools.get(inv.toolName);
      if (!tool) throw new Error(`unknown tool: ${inv.toolName}`);
      const args: unknown = inv.argumentsJson ? JSON.parse(inv.argumentsJson) : {};
      const ctx: ToolContext = {
        invocationId: inv.invocationId,
        toolName: inv.toolName,
        sessionKey: inv.sessionKey,
        sessionId: inv.sessionId,
        requestId: inv.requestId,
        timeoutMs: inv.timeoutMs,
        traceContext: inv.traceContext,
        signal: ac.signal,
      };
      const value = await tool.handler(args, ctx);
      result = { invocationId: inv.invocationId, ok: true, resultJson: JSON.stringify(value) ?? "null", error: "" };
    } catch (err) {
      result = { invocationId: inv.invocationId, ok: false, resultJson: "", error: errorText(err) || "tool failed" };
    } finally {
      clearTimeout(timer);
      this.inFlight.delete(inv.invocationId);
    }
    if (this.call === call && !this.closing) {
      // Nobody could be told of a refused result: lone surrogates become U+FFFD, it is always sent.
      result = { ...result, resultJson: toValidText(result.resultJson), error: toValidText(result.error) };
      call.write({ message: { $case: "result", value: result } });
    }
  }
}

/** The text of whatever a tool threw; never throws itself (a value's toString may). */
function errorText(err: unknown): string {
  try {
    const message = err instanceof Error ? err.message : String(err);
    return typeof message === "string" ? message : String(message);
  } catch {
    return "tool failed (its error could not be turned into text)";
  }
}

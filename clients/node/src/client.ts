/**
 * SidecarClient: the idiomatic layer over the generated stubs. Promises for
 * unary calls, {@link FrameStream} async iterables for activity, typed errors.
 */
import {
  Metadata,
  status as GrpcCode,
  type Channel,
  type ChannelCredentials,
  type ChannelOptions,
  type ClientDuplexStream,
} from "@grpc/grpc-js";
import {
  bearerInterceptor,
  channelCredentials,
  checkCleartext,
  checkTarget,
  checkToken,
  openChannel,
  timeoutMsOf,
  type InFlight,
  typeOf,
  unary,
  type UnaryMethod,
} from "./connection";
import { SidecarError } from "./errors";
import { toMessages } from "./messages";
import { type Message, type Session, SessionSource, type Usage } from "./gen/agent_sidecar/v1/common";
import {
  type GetQueueResponse,
  PromptServiceClient,
} from "./gen/agent_sidecar/v1/prompt_service";
import {
  type AppendMessagesResponse,
  type GetSessionContextResponse,
  type GetTranscriptResponse,
  type ListSessionsResponse,
  type RewindSessionResponse,
  type SearchHit,
  SessionServiceClient,
} from "./gen/agent_sidecar/v1/session_service";
import { type ServeToolsRequest, type ServeToolsResponse, ToolServiceClient } from "./gen/agent_sidecar/v1/tool_service";
import { type FrameStream, resumePolicy, type ResumeOptions } from "./stream";
import { checkSource, checkTexts } from "./text";
import { promptStream, type StreamHost, watchStream } from "./turns";

import {
  type ConnectOptions,
  type Delivery,
  int32,
  int64,
  parseDelivery,
  type PromptOptions,
  type SourceInput,
  type WatchOptions,
} from "./options";

export { type ConnectOptions, type Delivery, parseDelivery, type PromptOptions, type SourceInput, type WatchOptions };

/**
 * Connect to a sidecar at `unix:/path/sidecar.sock`, a bare socket path, or `host:port`.
 * A token is never sent in cleartext to another machine by accident: over a plain
 * channel to a host that is not loopback this throws unless `insecure: true`.
 */
export function connect(target: string, options: ConnectOptions = {}): SidecarClient {
  return new SidecarClient(target, options);
}

/**
 * A connection to one sidecar. Cheap to keep for the life of the process; the
 * three services share one channel, which reconnects by itself.
 *
 * Every string a call sends is checked first (text.ts): one that is not a
 * string or holds a lone surrogate is an InvalidArgument naming it (`sessionKey`,
 * `source.chatId`), raised the way the call raises its other argument errors
 * (rejected by the promise calls, thrown by `prompt` and `watch`); nothing is sent.
 */
export class SidecarClient {
  /** Raw generated stubs, for anything the idiomatic layer does not cover. */
  readonly raw: { sessions: SessionServiceClient; prompts: PromptServiceClient; tools: ToolServiceClient };
  private readonly channel: Channel;
  private readonly timeoutMs: number;
  private readonly resume: ResumeOptions | false;
  /** Streams being iterated, unary calls in flight, and ServeTools calls open; `close()` ends them. */
  private readonly streams = new Set<FrameStream>();
  private readonly unaryCalls = new Set<InFlight>();
  private readonly toolCalls = new Set<{ cancel(): void }>();
  private shut = false;

  constructor(readonly target: string, options: ConnectOptions = {}) {
    // Bad arguments fail here, naming the option, not later as UNAVAILABLE or a hang.
    checkTarget(target);
    if (options.token != null) checkToken(options.token);
    this.timeoutMs = options.callTimeoutMs === undefined ? 30_000 : timeoutMsOf(options.callTimeoutMs, "callTimeoutMs");
    this.resume = resumePolicy(options.resume);
    const creds = channelCredentials(options);
    // _isSecure() is grpc-js's own answer for any credentials (public in its typings).
    checkCleartext(target, options.token, creds._isSecure(), options.insecure ?? false);
    const channelOptions: ChannelOptions = { ...(options.channelOptions ?? {}) };
    if (options.serverName) {
      channelOptions["grpc.ssl_target_name_override"] = options.serverName;
      channelOptions["grpc.default_authority"] = options.serverName;
    }
    this.channel = openChannel(target, creds, channelOptions);
    const clientOptions = {
      channelOverride: this.channel,
      interceptors: options.token ? [bearerInterceptor(options.token)] : [],
    };
    // With channelOverride the stubs share this.channel; their credentials argument is unused.
    const mk = <T>(C: new (a: string, c: ChannelCredentials, o: object) => T): T => new C(target, creds, clientOptions);
    this.raw = { sessions: mk(SessionServiceClient), prompts: mk(PromptServiceClient), tools: mk(ToolServiceClient) };
  }

  /**
   * Wait until the channel is connected (the sidecar is up), or reject after
   * `timeoutMs` (>= 0; `Infinity` waits without limit, and so does anything
   * above setTimeout's ~24.8 days). Calls do not need it; it only turns "not up
   * yet" into a clear wait.
   */
  ready(timeoutMs = 10_000): Promise<void> {
    if (typeof timeoutMs !== "number") {
      return Promise.reject(new TypeError(`timeoutMs: expected ms (a number), got ${typeOf(timeoutMs)}`));
    }
    if (!(timeoutMs >= 0)) return Promise.reject(new RangeError(`timeoutMs: ${timeoutMs} is not a wait; ms >= 0`));
    // grpc-js arms a setTimeout with the rest: past 2^31-1 ms that would fire at once.
    const deadline = timeoutMs > 2 ** 31 - 1 ? Infinity : Date.now() + timeoutMs;
    return new Promise<void>((resolve, reject) =>
      this.raw.sessions.waitForReady(deadline, (err) =>
        err ? reject(new Error(`sidecar at ${this.target} not ready: ${err.message}`)) : resolve(),
      ),
    );
  }

  /**
   * Close the channel. Calls in flight (unary calls and the prompt and watch
   * streams) end at once, cancelled, with a SidecarError with code CANCELLED,
   * and so do later calls.
   */
  close(): void {
    this.shut = true;
    for (const s of this.streams) s.fail(closedError());
    for (const c of [...this.unaryCalls]) c.fail(closedError());
    for (const c of this.toolCalls) c.cancel();
    this.raw.sessions.close();
    this.raw.prompts.close();
    this.raw.tools.close();
    this.channel.close();
  }

  /** True once {@link close} was called. */
  get closed(): boolean {
    return this.shut;
  }

  /** Open ToolService.ServeTools (for {@link ToolHost}); `close()` cancels it. @internal */
  serveTools(): ClientDuplexStream<ServeToolsRequest, ServeToolsResponse> {
    if (this.shut) throw closedError();
    const call = this.raw.tools.serveTools(new Metadata());
    this.toolCalls.add(call);
    call.on("status", () => this.toolCalls.delete(call));
    return call;
  }

  private streamHost(): StreamHost {
    const checkOpen = () => {
      if (this.shut) throw closedError();
    };
    return { prompts: this.raw.prompts, resume: this.resume, live: this.streams, checkOpen };
  }

  private call<Req, Res>(method: UnaryMethod<Req, Res>, request: Req): Promise<Res> {
    if (this.shut) return Promise.reject(closedError());
    return unary(method, request, this.timeoutMs, this.unaryCalls);
  }
  private get s(): SessionServiceClient {
    return this.raw.sessions;
  }

  // ---- SessionService -------------------------------------------------------------

  /** Get the session of a source, creating it if needed (idempotent under concurrency). */
  async getOrCreateSession(source: SourceInput, opts: { profile?: string; forceNew?: boolean } = {}): Promise<Session> {
    checkSource(source);
    checkTexts({ profile: opts.profile });
    const req = { source: SessionSource.fromPartial(source), forceNew: opts.forceNew ?? false, profile: opts.profile ?? "" };
    const res = await this.call(this.s.getOrCreateSession.bind(this.s), req);
    return res.session!;
  }

  /** One session by key or id; throws SessionNotFound when absent. */
  async getSession(ref: { sessionKey?: string; sessionId?: string }): Promise<Session> {
    checkTexts({ sessionKey: ref.sessionKey, sessionId: ref.sessionId });
    const req = { sessionKey: ref.sessionKey ?? "", sessionId: ref.sessionId ?? "" };
    return (await this.call(this.s.getSession.bind(this.s), req)).session!;
  }

  /** One page of sessions, newest `updated_at` first. */
  async listSessions(
    opts: { platform?: string; activeWithinSeconds?: number; pageSize?: number; pageToken?: string } = {},
  ): Promise<ListSessionsResponse> {
    checkTexts({ platform: opts.platform, pageToken: opts.pageToken });
    const req = {
      platform: opts.platform ?? "",
      activeWithinSeconds: int64("activeWithinSeconds", opts.activeWithinSeconds ?? 0),
      pageSize: int32("pageSize", opts.pageSize ?? 0),
      pageToken: opts.pageToken ?? "",
    };
    return this.call(this.s.listSessions.bind(this.s), req);
  }

  /** `/new`, `/reset`: a new session id; queued prompts of the key are dropped. */
  async resetSession(sessionKey: string, opts: { displayName?: string } = {}): Promise<Session> {
    checkTexts({ sessionKey, displayName: opts.displayName });
    const req = { sessionKey, displayName: opts.displayName ?? "" };
    return (await this.call(this.s.resetSession.bind(this.s), req)).session!;
  }

  /** `/resume`: point the key at an earlier incarnation. */
  async switchSession(sessionKey: string, targetSessionId: string): Promise<Session> {
    checkTexts({ sessionKey, targetSessionId });
    return (await this.call(this.s.switchSession.bind(this.s), { sessionKey, targetSessionId })).session!;
  }

  /** `/stop`: cancel the in-flight turn; the next access gets a new session id. */
  async suspendSession(sessionKey: string): Promise<Session> {
    checkTexts({ sessionKey });
    return (await this.call(this.s.suspendSession.bind(this.s), { sessionKey })).session!;
  }

  /** Mark the session resume_pending with a reason (never overrides suspended). */
  async markResumePending(sessionKey: string, reason: string): Promise<Session> {
    checkTexts({ sessionKey, reason });
    return (await this.call(this.s.markResumePending.bind(this.s), { sessionKey, reason })).session!;
  }

  /** Delete a key and everything of it; false when it did not exist. */
  async deleteSession(sessionKey: string): Promise<boolean> {
    checkTexts({ sessionKey });
    return (await this.call(this.s.deleteSession.bind(this.s), { sessionKey })).deleted;
  }

  /** Drop every session; `confirm` must be the literal "DELETE ALL SESSIONS". */
  async clearAllSessions(confirm: string): Promise<number> {
    checkTexts({ confirm });
    return (await this.call(this.s.clearAllSessions.bind(this.s), { confirm })).sessionsDeleted;
  }

  /**
   * Write a synthetic transcript into a session (tests, tooling). Messages are
   * checked first: a bad field rejects with InvalidArgument naming it
   * (`messages[3].content`), sending nothing; likewise for the calls below.
   */
  async seedSession(opts: {
    source?: SourceInput;
    sessionKey?: string;
    messages: Partial<Message>[];
    profile?: string;
  }): Promise<Session> {
    checkSource(opts.source);
    checkTexts({ sessionKey: opts.sessionKey, profile: opts.profile });
    const req = {
      source: opts.source ? SessionSource.fromPartial(opts.source) : undefined,
      sessionKey: opts.sessionKey ?? "",
      messages: toMessages(opts.messages),
      profile: opts.profile ?? "",
    };
    return (await this.call(this.s.seedSession.bind(this.s), req)).session!;
  }

  /** One page of an incarnation's transcript, in order. */
  async getTranscript(
    sessionId: string,
    opts: { includeRewound?: boolean; pageSize?: number; pageToken?: string } = {},
  ): Promise<GetTranscriptResponse> {
    checkTexts({ sessionId, pageToken: opts.pageToken });
    const req = {
      sessionId,
      includeRewound: opts.includeRewound ?? false,
      pageSize: int32("pageSize", opts.pageSize ?? 0),
      pageToken: opts.pageToken ?? "",
    };
    return this.call(this.s.getTranscript.bind(this.s), req);
  }

  /** Append messages; durable when the promise resolves. */
  async appendMessages(sessionId: string, messages: Partial<Message>[]): Promise<AppendMessagesResponse> {
    checkTexts({ sessionId });
    return this.call(this.s.appendMessages.bind(this.s), { sessionId, messages: toMessages(messages) });
  }

  /** Replace the transcript (the replaced rows stay as a hidden audit trail). */
  async rewriteTranscript(sessionId: string, messages: Partial<Message>[]): Promise<void> {
    checkTexts({ sessionId });
    await this.call(this.s.rewriteTranscript.bind(this.s), { sessionId, messages: toMessages(messages) });
  }

  /** `/undo`: back up `n` user turns (default 1) by soft delete. */
  async rewindSession(sessionId: string, n = 1): Promise<RewindSessionResponse> {
    checkTexts({ sessionId });
    return this.call(this.s.rewindSession.bind(this.s), { sessionId, n: int32("n", n) });
  }

  /** Full-text search over live messages. */
  async searchMessages(query: string, opts: { sessionKey?: string; limit?: number } = {}): Promise<SearchHit[]> {
    checkTexts({ query, sessionKey: opts.sessionKey });
    const req = { query, sessionKey: opts.sessionKey ?? "", limit: int32("limit", opts.limit ?? 0) };
    return (await this.call(this.s.searchMessages.bind(this.s), req)).hits;
  }

  /** Add a usage delta to the session's token and cost accounting. */
  async updateUsage(
    sessionKey: string,
    delta: Partial<Usage>,
    opts: { lastPromptTokens?: number; costStatus?: string } = {},
  ): Promise<Session> {
    checkTexts({ sessionKey, costStatus: opts.costStatus });
    const req = {
      sessionKey,
      delta: { inputTokens: 0, outputTokens: 0, cacheReadTokens: 0, cacheWriteTokens: 0, costUsd: 0, ...delta },
      lastPromptTokens: int64("lastPromptTokens", opts.lastPromptTokens ?? 0),
      costStatus: opts.costStatus ?? "",
    };
    return (await this.call(this.s.updateUsage.bind(this.s), req)).session!;
  }

  /** Prune idle routing entries older than `maxAgeDays`; returns how many. */
  async pruneSessions(maxAgeDays: number): Promise<number> {
    return (await this.call(this.s.pruneSessions.bind(this.s), { maxAgeDays: int32("maxAgeDays", maxAgeDays) })).pruned;
  }

  /** The `## Current Session Context` prompt section for a source. */
  async getSessionContext(source: SourceInput, opts: { profile?: string } = {}): Promise<GetSessionContextResponse> {
    checkSource(source);
    checkTexts({ profile: opts.profile });
    const req = { source: SessionSource.fromPartial(source), profile: opts.profile ?? "" };
    return this.call(this.s.getSessionContext.bind(this.s), req);
  }

  // ---- PromptService --------------------------------------------------------------

  /**
   * Run one agent turn and stream its frames. The returned stream survives a
   * dropped connection (it resumes with WatchActivity after the last seq seen),
   * skips keepalives, and after yielding a `failed` frame throws the typed error.
   */
  prompt(opts: PromptOptions): FrameStream {
    return promptStream(this.streamHost(), opts);
  }

  /**
   * Replay persisted frames, then follow live ones. By request id it follows one
   * turn to its terminal frame (and throws after `failed`, like `prompt`); by
   * session key or platform it is an endless feed of every turn's frames.
   */
  watch(opts: WatchOptions): FrameStream {
    return watchStream(this.streamHost(), opts);
  }

  /** Stop the in-flight turn of a session (or one request); it ends with failed{CANCELLED}. */
  async cancel(ref: { sessionKey?: string; requestId?: string }): Promise<boolean> {
    checkTexts({ sessionKey: ref.sessionKey, requestId: ref.requestId });
    const req = { sessionKey: ref.sessionKey ?? "", requestId: ref.requestId ?? "" };
    return (await this.call(this.raw.prompts.cancel.bind(this.raw.prompts), req)).cancelled;
  }

  /** The session's pending follow-up slot and FIFO overflow. */
  async getQueue(sessionKey: string): Promise<GetQueueResponse> {
    checkTexts({ sessionKey });
    return this.call(this.raw.prompts.getQueue.bind(this.raw.prompts), { sessionKey });
  }
}

/** What streams in flight and later calls fail with after `close()`. */
export function closedError(): SidecarError {
  return new SidecarError({ code: GrpcCode.CANCELLED, reason: "", message: "the client was closed" });
}

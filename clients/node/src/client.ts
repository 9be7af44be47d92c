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
  checkTarget,
  checkToken,
  connectFailure,
  openChannel,
  timeoutMsOf,
  type InFlight,
  typeOf,
  unary,
  type UnaryMethod,
} from "./connection";
import { fromGrpcError, SidecarError } from "./errors";
import { channelCredentials, checkCleartext } from "./tls";
import { toMessages } from "./messages";
import type { Message, Session, Usage } from "./gen/agent_sidecar/v1/common";
import * as pv from "./gen/agent_sidecar/v1/prompt_service";
import * as sv from "./gen/agent_sidecar/v1/session_service";
import { type ServeToolsRequest, type ServeToolsResponse, ToolServiceClient } from "./gen/agent_sidecar/v1/tool_service";
import { type FrameStream, resumePolicy, type ResumeOptions } from "./stream";
import { checkFlag, checkSource, checkTexts, required, requireOne, requireSource, requireTexts } from "./text";
import { promptStream, type StreamHost, watchStream } from "./turns";
import {
  type ConnectOptions,
  type Delivery,
  int32,
  int64,
  parseDelivery,
  type PromptOptions,
  type SourceInput,
  usageDelta,
  type WatchOptions,
} from "./options";

export { type ConnectOptions, type Delivery, parseDelivery, type PromptOptions, type SourceInput, type WatchOptions };

/**
 * Connect to a sidecar at `unix:/path/sidecar.sock`, a bare socket path, or `host:port`.
 * A token is never sent in cleartext to another machine by accident: over a plain
 * channel to a host that is not loopback this throws unless `insecure: true`.
 */
export function connect(target: string, options: ConnectOptions | null = {}): SidecarClient {
  return new SidecarClient(target, options);
}

/**
 * A connection to one sidecar. Cheap to keep for the life of the process; the
 * three services share one channel, which reconnects by itself.
 *
 * Every argument a call sends is checked first (text.ts): a bad string, or a
 * required one given as undefined or null, is an InvalidArgument naming it
 * (`sessionKey`, `source.chatId`), rejected by the promise calls, thrown by
 * `prompt` and `watch`; nothing is sent. An optional one given as undefined
 * or null goes out as the proto default (requests are built with `fromPartial`).
 */
export class SidecarClient {
  /** Raw generated stubs, for anything the idiomatic layer does not cover. */
  raw: { sessions: sv.SessionServiceClient; prompts: pv.PromptServiceClient; tools: ToolServiceClient };
  private channel: Channel;
  private readonly openStubs: () => void;
  private readonly idleTimeoutMs: number;
  private readonly timeoutMs: number;
  private readonly resume: ResumeOptions | false;
  /** Streams being iterated, unary calls in flight, and ServeTools calls open; `close()` ends them. */
  private readonly streams = new Set<FrameStream>();
  private readonly unaryCalls = new Set<InFlight>();
  private readonly toolCalls = new Set<{ cancel(): void }>();
  private shut = false;

  constructor(readonly target: string, options: ConnectOptions | null = {}) {
    options ??= {}; // null is no options
    // Bad arguments fail here, naming the option, not later as UNAVAILABLE or a hang.
    checkTarget(target);
    if (options.token != null) checkToken(options.token);
    this.timeoutMs = options.callTimeoutMs === undefined ? 30_000 : timeoutMsOf(options.callTimeoutMs, "callTimeoutMs");
    this.resume = resumePolicy(options.resume);
    const creds = channelCredentials(options);
    // _isSecure() is grpc-js's own answer for any credentials (public in its typings).
    checkCleartext(target, options.token, creds._isSecure(), options.insecure);
    const channelOptions: ChannelOptions = { ...(options.channelOptions ?? {}) };
    if (options.serverName) {
      channelOptions["grpc.ssl_target_name_override"] = options.serverName;
      channelOptions["grpc.default_authority"] = options.serverName;
    }
    this.idleTimeoutMs =
      options.streamIdleTimeoutMs === undefined ? 45_000 : timeoutMsOf(options.streamIdleTimeoutMs, "streamIdleTimeoutMs");
    const interceptors = options.token ? [bearerInterceptor(options.token)] : [];
    this.openStubs = () => {
      this.channel = openChannel(target, creds, channelOptions);
      const clientOptions = { channelOverride: this.channel, interceptors };
      // With channelOverride the stubs share this.channel; their credentials argument is unused.
      const mk = <T>(C: new (a: string, c: ChannelCredentials, o: object) => T): T => new C(target, creds, clientOptions);
      const [sessions, prompts, tools] = [mk(sv.SessionServiceClient), mk(pv.PromptServiceClient), mk(ToolServiceClient)];
      this.raw = { sessions, prompts, tools };
    };
    this.channel = undefined as unknown as Channel;
    this.raw = undefined as unknown as SidecarClient["raw"];
    this.openStubs();
  }

  /**
   * A stream got nothing, not even a keepalive frame, for streamIdleTimeoutMs:
   * its connection stopped answering (keepalive pings have not closed it yet)
   * and every new call would go onto it. Open a new channel and close the old
   * one (its calls end: streams resume, a ToolHost re-registers). Once per
   * silent channel: the streams that notice it together replace it once.
   */
  private replaceSilentChannel(seen: Channel): void {
    if (this.shut || seen !== this.channel) return;
    const old = this.raw;
    this.openStubs();
    for (const c of this.toolCalls) c.cancel();
    old.sessions.close();
    old.prompts.close();
    old.tools.close();
    seen.close();
  }

  /**
   * Wait until the channel is connected (the sidecar is up), or reject after
   * `timeoutMs` (>= 0; `Infinity` waits without limit, and so does anything
   * above setTimeout's ~24.8 days), with a SidecarError UNAVAILABLE without a
   * reason, as every failure of the client is typed (the closed error once
   * {@link close} was called), saying why: the last connection attempt's
   * failure as grpc-js gives it (no such socket, connection refused, a
   * certificate that failed verification...; the grpc-js error is its
   * `cause`), fetched by one health check of at most half a second more.
   * Calls do not need it; it only turns "not up yet" into a clear wait.
   */
  ready(timeoutMs = 10_000): Promise<void> {
    if (typeof timeoutMs !== "number") {
      return Promise.reject(new TypeError(`timeoutMs: expected ms (a number), got ${typeOf(timeoutMs)}`));
    }
    if (!(timeoutMs >= 0)) return Promise.reject(new RangeError(`timeoutMs: ${timeoutMs} is not a wait; ms >= 0`));
    if (this.shut) return Promise.reject(closedError());
    // grpc-js arms a setTimeout with the rest: past 2^31-1 ms that would fire at once.
    const deadline = timeoutMs > 2 ** 31 - 1 ? Infinity : Date.now() + timeoutMs;
    return new Promise<void>((resolve, reject) =>
      this.raw.sessions.waitForReady(deadline, (err) => {
        if (!err) return resolve();
        if (this.shut) return reject(closedError());
        void connectFailure(this.raw.sessions).then((failure) => {
          if (this.shut) return reject(closedError());
          reject(new SidecarError({
            code: GrpcCode.UNAVAILABLE,
            reason: "",
            message: `sidecar at ${this.target} not ready within ${timeoutMs} ms: ${failure ? fromGrpcError(failure).message : err.message}`,
            cause: failure,
          }));
        });
      }),
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
    const self = this;
    let opened = this.channel; // the channel the stream's current call went on
    return {
      get prompts() {
        opened = self.channel;
        return self.raw.prompts;
      },
      resume: this.resume,
      live: this.streams,
      checkOpen,
      idleTimeoutMs: this.idleTimeoutMs,
      onIdle: () => this.replaceSilentChannel(opened),
      waitReady: (ms: number) => this.ready(ms).catch(() => {}),
    };
  }

  private call<Req, Res>(method: UnaryMethod<Req, Res>, request: Req): Promise<Res> {
    if (this.shut) return Promise.reject(closedError());
    return unary(method, request, this.timeoutMs, this.unaryCalls);
  }
  private get s(): sv.SessionServiceClient {
    return this.raw.sessions;
  }

  // ---- SessionService -------------------------------------------------------------

  /** Get the session of a source, creating it if needed (idempotent under concurrency). */
  async getOrCreateSession(
    source: SourceInput,
    opts?: { profile?: string; forceNew?: boolean } | null,
  ): Promise<Session> {
    const o = opts ?? {};
    requireSource(source);
    checkTexts({ profile: o.profile });
    checkFlag(o.forceNew, "forceNew");
    const req = sv.GetOrCreateSessionRequest.fromPartial({ source, forceNew: o.forceNew, profile: o.profile });
    return (await this.call(this.s.getOrCreateSession.bind(this.s), req)).session!;
  }

  /** One session by key or id (give one); throws SessionNotFound when absent. */
  async getSession(ref: { sessionKey?: string; sessionId?: string }): Promise<Session> {
    const { sessionKey, sessionId } = ref ?? {};
    requireOne({ sessionKey, sessionId });
    checkTexts({ sessionKey, sessionId });
    const req = sv.GetSessionRequest.fromPartial({ sessionKey, sessionId });
    return (await this.call(this.s.getSession.bind(this.s), req)).session!;
  }

  /** One page of sessions, newest `updated_at` first. */
  async listSessions(
    opts?: { platform?: string; activeWithinSeconds?: number; pageSize?: number; pageToken?: string } | null,
  ): Promise<sv.ListSessionsResponse> {
    const o = opts ?? {};
    checkTexts({ platform: o.platform, pageToken: o.pageToken });
    const req = sv.ListSessionsRequest.fromPartial({
      platform: o.platform,
      activeWithinSeconds: int64("activeWithinSeconds", o.activeWithinSeconds ?? 0),
      pageSize: int32("pageSize", o.pageSize ?? 0),
      pageToken: o.pageToken,
    });
    return this.call(this.s.listSessions.bind(this.s), req);
  }

  /** `/new`, `/reset`: a new session id; queued prompts of the key are dropped. */
  async resetSession(sessionKey: string, opts?: { displayName?: string } | null): Promise<Session> {
    const displayName = opts?.displayName;
    requireTexts({ sessionKey });
    checkTexts({ displayName });
    const req = sv.ResetSessionRequest.fromPartial({ sessionKey, displayName });
    return (await this.call(this.s.resetSession.bind(this.s), req)).session!;
  }

  /** `/resume`: point the key at an earlier incarnation. */
  async switchSession(sessionKey: string, targetSessionId: string): Promise<Session> {
    requireTexts({ sessionKey, targetSessionId });
    const req = sv.SwitchSessionRequest.fromPartial({ sessionKey, targetSessionId });
    return (await this.call(this.s.switchSession.bind(this.s), req)).session!;
  }

  /** `/stop`: cancel the in-flight turn; the next access gets a new session id. */
  async suspendSession(sessionKey: string): Promise<Session> {
    requireTexts({ sessionKey });
    const req = sv.SuspendSessionRequest.fromPartial({ sessionKey });
    return (await this.call(this.s.suspendSession.bind(this.s), req)).session!;
  }

  /** Mark the session resume_pending with a reason (never overrides suspended). */
  async markResumePending(sessionKey: string, reason: string): Promise<Session> {
    requireTexts({ sessionKey, reason });
    const req = sv.MarkResumePendingRequest.fromPartial({ sessionKey, reason });
    return (await this.call(this.s.markResumePending.bind(this.s), req)).session!;
  }

  /** Delete a key and everything of it; false when it did not exist. */
  async deleteSession(sessionKey: string): Promise<boolean> {
    requireTexts({ sessionKey });
    const req = sv.DeleteSessionRequest.fromPartial({ sessionKey });
    return (await this.call(this.s.deleteSession.bind(this.s), req)).deleted;
  }

  /** Drop every session; `confirm` must be the literal "DELETE ALL SESSIONS". */
  async clearAllSessions(confirm: string): Promise<number> {
    requireTexts({ confirm });
    const req = sv.ClearAllSessionsRequest.fromPartial({ confirm });
    return (await this.call(this.s.clearAllSessions.bind(this.s), req)).sessionsDeleted;
  }

  /**
   * Write a synthetic transcript into a session (tests, tooling): give `source`
   * or `sessionKey`, and `messages`. Messages are checked first: a bad field
   * rejects with InvalidArgument naming it (`messages[3].content`), sending
   * nothing; likewise for the calls below.
   */
  async seedSession(opts: {
    source?: SourceInput;
    sessionKey?: string;
    messages: Partial<Message>[];
    profile?: string;
  }): Promise<Session> {
    const { source, sessionKey, messages, profile } = opts ?? ({} as Partial<typeof opts>);
    requireOne({ source, sessionKey });
    checkSource(source);
    checkTexts({ sessionKey, profile });
    const req = sv.SeedSessionRequest.fromPartial({ source, sessionKey, messages: toMessages(messages), profile });
    return (await this.call(this.s.seedSession.bind(this.s), req)).session!;
  }

  /** One page of an incarnation's transcript, in order. */
  async getTranscript(
    sessionId: string,
    opts?: { includeRewound?: boolean; pageSize?: number; pageToken?: string } | null,
  ): Promise<sv.GetTranscriptResponse> {
    const o = opts ?? {};
    requireTexts({ sessionId });
    checkTexts({ pageToken: o.pageToken });
    checkFlag(o.includeRewound, "includeRewound");
    const req = sv.GetTranscriptRequest.fromPartial({
      sessionId,
      includeRewound: o.includeRewound,
      pageSize: int32("pageSize", o.pageSize ?? 0),
      pageToken: o.pageToken,
    });
    return this.call(this.s.getTranscript.bind(this.s), req);
  }

  /** Append messages; durable when the promise resolves. */
  async appendMessages(sessionId: string, messages: Partial<Message>[]): Promise<sv.AppendMessagesResponse> {
    requireTexts({ sessionId });
    const req = sv.AppendMessagesRequest.fromPartial({ sessionId, messages: toMessages(messages) });
    return this.call(this.s.appendMessages.bind(this.s), req);
  }

  /** Replace the transcript (the replaced rows stay as a hidden audit trail); `[]` empties it. */
  async rewriteTranscript(sessionId: string, messages: Partial<Message>[]): Promise<void> {
    requireTexts({ sessionId });
    const req = sv.RewriteTranscriptRequest.fromPartial({ sessionId, messages: toMessages(messages) });
    await this.call(this.s.rewriteTranscript.bind(this.s), req);
  }

  /** `/undo`: back up `n` user turns (default 1, also for null) by soft delete. */
  async rewindSession(sessionId: string, n?: number | null): Promise<sv.RewindSessionResponse> {
    requireTexts({ sessionId });
    const req = sv.RewindSessionRequest.fromPartial({ sessionId, n: int32("n", n ?? 1) });
    return this.call(this.s.rewindSession.bind(this.s), req);
  }

  /** Full-text search over live messages. */
  async searchMessages(query: string, opts?: { sessionKey?: string; limit?: number } | null): Promise<sv.SearchHit[]> {
    const o = opts ?? {};
    requireTexts({ query });
    checkTexts({ sessionKey: o.sessionKey });
    const limit = int32("limit", o.limit ?? 0);
    const req = sv.SearchMessagesRequest.fromPartial({ query, sessionKey: o.sessionKey, limit });
    return (await this.call(this.s.searchMessages.bind(this.s), req)).hits;
  }

  /** Add a usage delta (absent counts are 0) to the session's token and cost accounting. */
  async updateUsage(
    sessionKey: string,
    delta?: Partial<Usage> | null,
    opts?: { lastPromptTokens?: number; costStatus?: string } | null,
  ): Promise<Session> {
    const o = opts ?? {};
    requireTexts({ sessionKey });
    checkTexts({ costStatus: o.costStatus });
    const req = sv.UpdateUsageRequest.fromPartial({
      sessionKey,
      delta: usageDelta(delta),
      lastPromptTokens: int64("lastPromptTokens", o.lastPromptTokens ?? 0),
      costStatus: o.costStatus,
    });
    return (await this.call(this.s.updateUsage.bind(this.s), req)).session!;
  }

  /** Prune idle routing entries older than `maxAgeDays` (required, at least 1); returns how many. */
  async pruneSessions(maxAgeDays: number): Promise<number> {
    required(maxAgeDays, "maxAgeDays");
    const req = sv.PruneSessionsRequest.fromPartial({ maxAgeDays: int32("maxAgeDays", maxAgeDays) });
    return (await this.call(this.s.pruneSessions.bind(this.s), req)).pruned;
  }

  /** The `## Current Session Context` prompt section for a source. */
  async getSessionContext(
    source: SourceInput,
    opts?: { profile?: string } | null,
  ): Promise<sv.GetSessionContextResponse> {
    const profile = opts?.profile;
    requireSource(source);
    checkTexts({ profile });
    const req = sv.GetSessionContextRequest.fromPartial({ source, profile });
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

  /** Stop the in-flight turn of a session, or one request (give one); it ends with failed{CANCELLED}. */
  async cancel(ref: { sessionKey?: string; requestId?: string }): Promise<boolean> {
    const { sessionKey, requestId } = ref ?? {};
    requireOne({ sessionKey, requestId });
    checkTexts({ sessionKey, requestId });
    const req = pv.CancelRequest.fromPartial({ sessionKey, requestId });
    return (await this.call(this.raw.prompts.cancel.bind(this.raw.prompts), req)).cancelled;
  }

  /** The session's pending follow-up slot and FIFO overflow. */
  async getQueue(sessionKey: string): Promise<pv.GetQueueResponse> {
    requireTexts({ sessionKey });
    return this.call(this.raw.prompts.getQueue.bind(this.raw.prompts), pv.GetQueueRequest.fromPartial({ sessionKey }));
  }
}

/** What streams in flight and later calls fail with after `close()`. */
export function closedError(): SidecarError {
  return new SidecarError({ code: GrpcCode.CANCELLED, reason: "", message: "the client was closed" });
}

/**
 * SidecarClient: the idiomatic layer over the generated stubs. Promises for
 * unary calls, {@link FrameStream} async iterables for activity, typed errors.
 */
import { randomUUID } from "node:crypto";
import {
  credentials as grpcCredentials,
  Metadata,
  type CallOptions,
  type Channel,
  type ChannelCredentials,
  type ChannelOptions,
} from "@grpc/grpc-js";
import { bearerInterceptor, checkCleartext, openChannel, tlsCredentials, unary, type UnaryMethod } from "./connection";
import { FrameSequencer } from "./frames";
import { type Message, type Session, SessionSource, type Usage } from "./gen/agent_sidecar/v1/common";
import {
  type Attachment,
  DeliveryMode,
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
import { ToolServiceClient } from "./gen/agent_sidecar/v1/tool_service";
import { FrameStream, type ResumeOptions } from "./stream";

/** A SessionSource given partially; unset fields are empty (seed 001 §1). */
export type SourceInput = Partial<SessionSource>;

/** A delivery mode as the enum or its name, any case (`"queue"`, `"REJECT_IF_BUSY"`). */
export type Delivery =
  | DeliveryMode
  | "reject_if_busy"
  | "follow_up"
  | "queue"
  | "interrupt"
  | "rollback"
  | "steer"
  | Uppercase<"reject_if_busy" | "follow_up" | "queue" | "interrupt" | "rollback" | "steer">;

/** Options of {@link connect}. */
export interface ConnectOptions {
  /** Bearer token sent as `authorization: Bearer <token>` on every call (needed over TCP). */
  token?: string;
  /**
   * TLS to a TCP listener with a certificate (`[[listen]] cert/key`): verify it
   * with the system's roots, or with `caFile`. Implied by `caFile`, `certFile`, `keyFile`.
   */
  tls?: boolean;
  /** PEM file of the CA certificates that verify the sidecar's certificate (a private CA). */
  caFile?: string;
  /** PEM client certificate, which a listener with a `client_ca` requires (mTLS); with `keyFile`. */
  certFile?: string;
  /** PEM private key of `certFile`. */
  keyFile?: string;
  /** The name to expect in the sidecar's certificate when it is not the target's host. */
  serverName?: string;
  /**
   * Send `token` over a plain channel to a host that is not loopback (cleartext:
   * anyone on the path can read it). Without it that connect throws.
   */
  insecure?: boolean;
  /** Channel credentials, replacing the TLS options; insecure by default (Unix socket, or TCP on localhost). */
  credentials?: ChannelCredentials;
  /** Extra @grpc/grpc-js channel options. */
  channelOptions?: ChannelOptions;
  /** Deadline for unary calls in ms (default 30000; 0 for none). */
  callTimeoutMs?: number;
  /** Default reconnect-and-resume policy of prompt and watch streams; `false` disables it. */
  resume?: ResumeOptions | false;
}

/** Arguments of {@link SidecarClient.prompt}. Give `source` or `sessionKey`. */
export interface PromptOptions {
  /** Idempotency key; a random UUID when omitted. Reuse it to retry blindly. */
  requestId?: string;
  source?: SourceInput;
  sessionKey?: string;
  text: string;
  attachments?: Attachment[];
  /** What to do when the session is busy (default FOLLOW_UP). */
  delivery?: Delivery;
  /** Profile used when the session is created from `source` (default "main"). */
  profile?: string;
  /** gRPC deadline of the turn: a Date or ms from now. */
  deadline?: Date | number;
  /** Aborting stops reading (the turn goes on; use `cancel` to stop it). */
  signal?: AbortSignal;
  /** Override the client's resume policy for this stream. */
  resume?: ResumeOptions | false;
}

/** Arguments of {@link SidecarClient.watch}: exactly one of requestId, sessionKey, platform. */
export interface WatchOptions {
  requestId?: string;
  sessionKey?: string;
  platform?: string;
  /** With requestId: replay frames whose seq is greater than this. */
  afterSeq?: number;
  /** With sessionKey/platform: replay frames whose cursor is greater; 0 = live only. */
  afterCursor?: number;
  signal?: AbortSignal;
  resume?: ResumeOptions | false;
}

/** Parse a {@link Delivery} into the enum. */
export function parseDelivery(d: Delivery | undefined): DeliveryMode {
  if (d === undefined) return DeliveryMode.UNSPECIFIED;
  if (typeof d === "number") return d;
  const v = DeliveryMode[d.toUpperCase() as keyof typeof DeliveryMode];
  if (v === undefined) throw new TypeError(`unknown delivery mode: ${d}`);
  return v;
}

/** The channel credentials {@link ConnectOptions} ask for: theirs, TLS from files, or plain. */
function channelCredentials(options: ConnectOptions): ChannelCredentials {
  if (options.credentials) return options.credentials;
  if (options.tls || options.caFile || options.certFile || options.keyFile) {
    return tlsCredentials({ caFile: options.caFile, certFile: options.certFile, keyFile: options.keyFile });
  }
  return grpcCredentials.createInsecure();
}

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
 */
export class SidecarClient {
  /** Raw generated stubs, for anything the idiomatic layer does not cover. */
  readonly raw: { sessions: SessionServiceClient; prompts: PromptServiceClient; tools: ToolServiceClient };
  private readonly channel: Channel;
  private readonly timeoutMs: number;
  private readonly resume: ResumeOptions | false | undefined;

  constructor(readonly target: string, options: ConnectOptions = {}) {
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
    this.timeoutMs = options.callTimeoutMs ?? 30_000;
    this.resume = options.resume;
  }

  /**
   * Wait until the channel is connected (the sidecar is up), or reject after
   * `timeoutMs`. Calls do not need it; it only turns "not up yet" into a clear wait.
   */
  ready(timeoutMs = 10_000): Promise<void> {
    return new Promise<void>((resolve, reject) =>
      this.raw.sessions.waitForReady(Date.now() + timeoutMs, (err) =>
        err ? reject(new Error(`sidecar at ${this.target} not ready: ${err.message}`)) : resolve(),
      ),
    );
  }

  /** Close the channel; streams in flight end with CANCELLED. */
  close(): void {
    this.raw.sessions.close();
    this.raw.prompts.close();
    this.raw.tools.close();
    this.channel.close();
  }

  private call<Req, Res>(method: UnaryMethod<Req, Res>, request: Req): Promise<Res> {
    return unary(method, request, this.timeoutMs);
  }
  private get s(): SessionServiceClient {
    return this.raw.sessions;
  }

  // ---- SessionService -------------------------------------------------------------

  /** Get the session of a source, creating it if needed (idempotent under concurrency). */
  async getOrCreateSession(source: SourceInput, opts: { profile?: string; forceNew?: boolean } = {}): Promise<Session> {
    const req = { source: SessionSource.fromPartial(source), forceNew: opts.forceNew ?? false, profile: opts.profile ?? "" };
    const res = await this.call(this.s.getOrCreateSession.bind(this.s), req);
    return res.session!;
  }

  /** One session by key or id; throws SessionNotFound when absent. */
  async getSession(ref: { sessionKey?: string; sessionId?: string }): Promise<Session> {
    const req = { sessionKey: ref.sessionKey ?? "", sessionId: ref.sessionId ?? "" };
    return (await this.call(this.s.getSession.bind(this.s), req)).session!;
  }

  /** One page of sessions, newest `updated_at` first. */
  listSessions(
    opts: { platform?: string; activeWithinSeconds?: number; pageSize?: number; pageToken?: string } = {},
  ): Promise<ListSessionsResponse> {
    const req = {
      platform: opts.platform ?? "",
      activeWithinSeconds: opts.activeWithinSeconds ?? 0,
      pageSize: opts.pageSize ?? 0,
      pageToken: opts.pageToken ?? "",
    };
    return this.call(this.s.listSessions.bind(this.s), req);
  }

  /** `/new`, `/reset`: a new session id; queued prompts of the key are dropped. */
  async resetSession(sessionKey: string, opts: { displayName?: string } = {}): Promise<Session> {
    const req = { sessionKey, displayName: opts.displayName ?? "" };
    return (await this.call(this.s.resetSession.bind(this.s), req)).session!;
  }

  /** `/resume`: point the key at an earlier incarnation. */
  async switchSession(sessionKey: string, targetSessionId: string): Promise<Session> {
    return (await this.call(this.s.switchSession.bind(this.s), { sessionKey, targetSessionId })).session!;
  }

  /** `/stop`: cancel the in-flight turn; the next access gets a new session id. */
  async suspendSession(sessionKey: string): Promise<Session> {
    return (await this.call(this.s.suspendSession.bind(this.s), { sessionKey })).session!;
  }

  /** Mark the session resume_pending with a reason (never overrides suspended). */
  async markResumePending(sessionKey: string, reason: string): Promise<Session> {
    return (await this.call(this.s.markResumePending.bind(this.s), { sessionKey, reason })).session!;
  }

  /** Delete a key and everything of it; false when it did not exist. */
  async deleteSession(sessionKey: string): Promise<boolean> {
    return (await this.call(this.s.deleteSession.bind(this.s), { sessionKey })).deleted;
  }

  /** Drop every session; `confirm` must be the literal "DELETE ALL SESSIONS". */
  async clearAllSessions(confirm: string): Promise<number> {
    return (await this.call(this.s.clearAllSessions.bind(this.s), { confirm })).sessionsDeleted;
  }

  /** Write a synthetic transcript into a session (tests, tooling). */
  async seedSession(opts: {
    source?: SourceInput;
    sessionKey?: string;
    messages: Partial<Message>[];
    profile?: string;
  }): Promise<Session> {
    const req = {
      source: opts.source ? SessionSource.fromPartial(opts.source) : undefined,
      sessionKey: opts.sessionKey ?? "",
      messages: opts.messages.map(toMessage),
      profile: opts.profile ?? "",
    };
    return (await this.call(this.s.seedSession.bind(this.s), req)).session!;
  }

  /** One page of an incarnation's transcript, in order. */
  getTranscript(
    sessionId: string,
    opts: { includeRewound?: boolean; pageSize?: number; pageToken?: string } = {},
  ): Promise<GetTranscriptResponse> {
    const req = {
      sessionId,
      includeRewound: opts.includeRewound ?? false,
      pageSize: opts.pageSize ?? 0,
      pageToken: opts.pageToken ?? "",
    };
    return this.call(this.s.getTranscript.bind(this.s), req);
  }

  /** Append messages; durable when the promise resolves. */
  appendMessages(sessionId: string, messages: Partial<Message>[]): Promise<AppendMessagesResponse> {
    return this.call(this.s.appendMessages.bind(this.s), { sessionId, messages: messages.map(toMessage) });
  }

  /** Replace the transcript (the replaced rows stay as a hidden audit trail). */
  async rewriteTranscript(sessionId: string, messages: Partial<Message>[]): Promise<void> {
    await this.call(this.s.rewriteTranscript.bind(this.s), { sessionId, messages: messages.map(toMessage) });
  }

  /** `/undo`: back up `n` user turns (default 1) by soft delete. */
  rewindSession(sessionId: string, n = 1): Promise<RewindSessionResponse> {
    return this.call(this.s.rewindSession.bind(this.s), { sessionId, n });
  }

  /** Full-text search over live messages. */
  async searchMessages(query: string, opts: { sessionKey?: string; limit?: number } = {}): Promise<SearchHit[]> {
    const req = { query, sessionKey: opts.sessionKey ?? "", limit: opts.limit ?? 0 };
    return (await this.call(this.s.searchMessages.bind(this.s), req)).hits;
  }

  /** Add a usage delta to the session's token and cost accounting. */
  async updateUsage(
    sessionKey: string,
    delta: Partial<Usage>,
    opts: { lastPromptTokens?: number; costStatus?: string } = {},
  ): Promise<Session> {
    const req = {
      sessionKey,
      delta: { inputTokens: 0, outputTokens: 0, cacheReadTokens: 0, cacheWriteTokens: 0, costUsd: 0, ...delta },
      lastPromptTokens: opts.lastPromptTokens ?? 0,
      costStatus: opts.costStatus ?? "",
    };
    return (await this.call(this.s.updateUsage.bind(this.s), req)).session!;
  }

  /** Prune idle routing entries older than `maxAgeDays`; returns how many. */
  async pruneSessions(maxAgeDays: number): Promise<number> {
    return (await this.call(this.s.pruneSessions.bind(this.s), { maxAgeDays })).pruned;
  }

  /** The `## Current Session Context` prompt section for a source. */
  getSessionContext(source: SourceInput, opts: { profile?: string } = {}): Promise<GetSessionContextResponse> {
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
    const requestId = opts.requestId || randomUUID();
    const request = {
      requestId,
      source: opts.source ? SessionSource.fromPartial(opts.source) : undefined,
      sessionKey: opts.sessionKey ?? "",
      text: opts.text,
      attachments: opts.attachments ?? [],
      delivery: parseDelivery(opts.delivery),
      profile: opts.profile ?? "",
    };
    const deadline = typeof opts.deadline === "number" ? Date.now() + opts.deadline : opts.deadline;
    const callOpts: Partial<CallOptions> = deadline ? { deadline } : {};
    const p = this.raw.prompts;
    return new FrameStream(
      (resume, started) =>
        // Before any frame the Prompt itself is retried (it is idempotent by request id).
        resume === null || !started
          ? p.prompt(request, new Metadata(), callOpts)
          : p.watchActivity(
              { requestId, sessionKey: "", platform: "", afterSeq: resume.afterSeq, afterCursor: 0 },
              new Metadata(),
              callOpts,
            ),
      new FrameSequencer("request"),
      { throwOnFailed: true, resume: opts.resume ?? this.resume, signal: opts.signal, requestId },
    );
  }

  /**
   * Replay persisted frames, then follow live ones. By request id it follows one
   * turn to its terminal frame (and throws after `failed`, like `prompt`); by
   * session key or platform it is an endless feed of every turn's frames.
   */
  watch(opts: WatchOptions): FrameStream {
    const byRequest = !!opts.requestId;
    const p = this.raw.prompts;
    const seq = byRequest
      ? new FrameSequencer("request", { afterSeq: opts.afterSeq ?? 0 })
      : new FrameSequencer("feed", { afterCursor: opts.afterCursor ?? 0 });
    return new FrameStream(
      (resume) => {
        const point = resume ?? seq.resumePoint();
        return p.watchActivity(
          {
            requestId: opts.requestId ?? "",
            sessionKey: opts.sessionKey ?? "",
            platform: opts.platform ?? "",
            afterSeq: byRequest ? point.afterSeq : 0,
            afterCursor: byRequest ? 0 : point.afterCursor,
          },
          new Metadata(),
        );
      },
      seq,
      { throwOnFailed: byRequest, resume: opts.resume ?? this.resume, signal: opts.signal, requestId: opts.requestId },
    );
  }

  /** Stop the in-flight turn of a session (or one request); it ends with failed{CANCELLED}. */
  async cancel(ref: { sessionKey?: string; requestId?: string }): Promise<boolean> {
    const req = { sessionKey: ref.sessionKey ?? "", requestId: ref.requestId ?? "" };
    return (await this.call(this.raw.prompts.cancel.bind(this.raw.prompts), req)).cancelled;
  }

  /** The session's pending follow-up slot and FIFO overflow. */
  getQueue(sessionKey: string): Promise<GetQueueResponse> {
    return this.call(this.raw.prompts.getQueue.bind(this.raw.prompts), { sessionKey });
  }
}

function toMessage(m: Partial<Message>): Message {
  return {
    role: m.role ?? "",
    content: m.content ?? "",
    toolCallId: m.toolCallId ?? "",
    toolName: m.toolName ?? "",
    toolCallsJson: m.toolCallsJson ?? "",
    createdAt: m.createdAt,
    seq: m.seq ?? 0,
    active: m.active ?? false,
    synthetic: m.synthetic ?? false,
  };
}

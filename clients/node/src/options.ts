/**
 * What the client's calls take: the option types of connect, prompt and watch,
 * and the checks of their arguments (each error names the argument), shared
 * by SidecarClient's calls.
 */
import type { ChannelCredentials, ChannelOptions } from "@grpc/grpc-js";
import { typeOf } from "./connection";
import type { SessionSource, Usage } from "./gen/agent_sidecar/v1/common";
import { type Attachment, DeliveryMode } from "./gen/agent_sidecar/v1/prompt_service";
import type { ResumeOptions } from "./stream";

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
  /**
   * Deadline for unary calls in ms (default 30000; 0 for none): a finite number
   * >= 0, else connect throws. More than 10^14 ms (~3,000 years) counts as none.
   */
  callTimeoutMs?: number;
  /**
   * A prompt or watch stream that gets no frame at all, keepalive frames
   * included (the sidecar sends one on a silent stream every keepalive_s, 15 s
   * by default), for this long is taken for a dropped connection: the client
   * opens a new channel and resumes (default 45000 ms; 0: never).
   */
  streamIdleTimeoutMs?: number;
  /**
   * Default reconnect-and-resume policy of prompt and watch streams; `false`
   * disables it. Each option must be a finite number >= 0, else connect throws.
   */
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
  /**
   * gRPC deadline of the turn: a valid Date or ms from now (finite, above 0);
   * anything else throws. One more than 10^14 ms (~3,000 years) ahead counts as none.
   */
  deadline?: Date | number;
  /**
   * Aborting stops reading (the turn goes on; use `cancel` to stop it). An
   * already-aborted signal ends the stream at once, before the Prompt is sent.
   */
  signal?: AbortSignal;
  /** Override the client's resume policy for this stream. */
  resume?: ResumeOptions | false;
}

/** Arguments of {@link SidecarClient.watch}: exactly one of requestId, sessionKey, platform. */
export interface WatchOptions {
  requestId?: string;
  sessionKey?: string;
  platform?: string;
  /** With requestId: replay frames whose seq is greater than this (an integer >= 0). */
  afterSeq?: number;
  /** With sessionKey/platform: replay frames whose cursor is greater; 0 = live only (an integer >= 0). */
  afterCursor?: number;
  signal?: AbortSignal;
  resume?: ResumeOptions | false;
}

/**
 * Parse a {@link Delivery} into the enum. A number passes as is when it is an
 * int32 (the sidecar judges unknown ones); absent (undefined, null) is
 * UNSPECIFIED (FOLLOW_UP); anything else throws, naming `delivery`.
 */
export function parseDelivery(d: Delivery | undefined | null): DeliveryMode {
  if (d === undefined || d === null) return DeliveryMode.UNSPECIFIED;
  if (typeof d === "number") return int32("delivery", d);
  if (typeof d !== "string") throw new TypeError(`delivery: expected a DeliveryMode or its name, got ${typeOf(d)}`);
  const v: unknown = (DeliveryMode as Record<string, unknown>)[d.toUpperCase()];
  if (typeof v !== "number") throw new TypeError(`delivery: unknown delivery mode: ${d}`);
  return v;
}

/** `value` if it is an int32, else a TypeError/RangeError naming `name`. */
export function int32(name: string, value: unknown): number {
  if (typeof value !== "number") throw new TypeError(`${name}: expected an integer, got ${typeOf(value)}`);
  if (!(Number.isInteger(value) && value >= -(2 ** 31) && value < 2 ** 31)) {
    throw new RangeError(`${name}: ${value} is not an int32`);
  }
  return value;
}

/** `value` if it is an integer int64 can carry exactly (a safe integer), and >= 0 when `nonNegative`. */
export function int64(name: string, value: unknown, nonNegative = false): number {
  if (typeof value !== "number") throw new TypeError(`${name}: expected an integer, got ${typeOf(value)}`);
  if (!Number.isSafeInteger(value)) throw new RangeError(`${name}: ${value} is not a safe integer`);
  if (nonNegative && value < 0) throw new RangeError(`${name}: ${value} is negative`);
  return value;
}

const USAGE_COUNTS = ["inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens"] as const;

/**
 * A usage delta as protobuf sends it: each count absent (undefined, null) is 0,
 * else an integer ({@link int64}); `costUsd` absent is 0, else a number. The
 * generated encoder would throw on an undefined count and send an undefined
 * cost as NaN. Ranges are the sidecar's to judge.
 */
export function usageDelta(delta: unknown, name = "delta"): Usage {
  if (delta === undefined || delta === null) delta = {};
  if (typeof delta !== "object" || Array.isArray(delta)) {
    throw new TypeError(`${name}: expected a usage object, got ${typeOf(delta)}`);
  }
  const d = delta as Partial<Record<keyof Usage, unknown>>;
  const count = (k: (typeof USAGE_COUNTS)[number]) => (d[k] == null ? 0 : int64(`${name}.${k}`, d[k]));
  const cost = d.costUsd;
  if (cost != null && typeof cost !== "number") {
    throw new TypeError(`${name}.costUsd: expected a number, got ${typeOf(cost)}`);
  }
  return {
    inputTokens: count("inputTokens"),
    outputTokens: count("outputTokens"),
    cacheReadTokens: count("cacheReadTokens"),
    cacheWriteTokens: count("cacheWriteTokens"),
    costUsd: cost ?? 0,
  };
}

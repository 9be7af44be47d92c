/**
 * FrameStream: an async iterable of activity frames over one or more gRPC
 * server streams. When a stream drops mid-turn it reopens (Prompt again with
 * the same request id before any frame was seen, WatchActivity with
 * `after_seq`/`after_cursor` after) and filters with a {@link FrameSequencer},
 * so the caller sees every frame exactly once, in order.
 */
import { status as GrpcCode, type ClientReadableStream } from "@grpc/grpc-js";
import { typeOf } from "./connection";
import {
  errorFromFailedFrame,
  fromGrpcError,
  isSerializationError,
  isServiceError,
  SidecarError,
  TurnFramesGone,
} from "./errors";
import { FrameSequencer, isTerminal } from "./frames";
import type { ActivityFrame, ActivityFrame_Failed } from "./gen/agent_sidecar/v1/prompt_service";

/** How a dropped stream is resumed (each a finite number >= 0). */
export interface ResumeOptions {
  /**
   * How long the stream keeps trying to resume without receiving a frame
   * (default 30000 ms, as in the Python and Go clients); between attempts it
   * waits for the channel to be ready again.
   */
  windowMs?: number;
  /** Also give up after this many consecutive failed reconnects (default: no limit). */
  maxRetries?: number;
  /** First backoff; doubles per consecutive failure (default 100 ms). */
  initialBackoffMs?: number;
  /** Backoff ceiling (default 2000 ms). */
  maxBackoffMs?: number;
}

/** Where to reopen from; `null` for the first open. */
export type ResumePoint = { afterSeq: number; afterCursor: number } | null;

/** Opens one gRPC server stream whose messages carry `frame`. */
export type StreamOpener = (
  resume: ResumePoint,
  started: boolean,
) => ClientReadableStream<{ frame?: ActivityFrame | undefined }>;

/** Options of a {@link FrameStream}. */
export interface FrameStreamOptions {
  /** After yielding a `failed` frame, throw its typed error (turn streams). */
  throwOnFailed: boolean;
  /** `false` disables reconnect-and-resume. */
  resume?: ResumeOptions | false;
  /** Aborting it ends the iteration quietly (the turn itself goes on). */
  signal?: AbortSignal;
  /** The turn's request id, when the stream follows one turn. */
  requestId?: string;
  /** The stream is in this set while it is being iterated (its client ends them on close). */
  live?: Set<FrameStream>;
  /** A watch by request id the caller opened (not a Prompt): ending OK with no frame is its clean end. */
  ownWatch?: boolean;
  /** A stream that gets no frame at all (keepalives included) for this long is a drop (0: never). */
  idleTimeoutMs?: number;
  /** Called when the idle timeout cut a call: the client replaces the channel whose connection went silent. */
  onIdle?: () => void;
  /** Resolves once the channel is ready, or after `ms` (the wait between resume attempts). */
  waitReady?: (ms: number) => Promise<void>;
}

/**
 * Reasons after which the same call may be made again (docs/api.md, docs/cluster.md): a
 * request's stream with the same request id, a session or platform feed from its cursor.
 */
export const RETRY_SAME_REQUEST_REASONS = new Set(["LANE_MOVED", "OVERLOADED", "STORE_UNAVAILABLE", "UNAVAILABLE", "STREAM_TOO_SLOW"]);

const DEFAULT_RESUME: Required<ResumeOptions> = {
  windowMs: 30_000,
  maxRetries: Number.MAX_SAFE_INTEGER,
  initialBackoffMs: 100,
  maxBackoffMs: 2000,
};

/**
 * The resume policy of `resume` (defaults filled in), or `false`. Each option
 * must be a finite number >= 0; anything else throws, naming the option
 * (a NaN backoff or retry count would spin against a dead socket).
 */
export function resumePolicy(resume: unknown, name = "resume"): Required<ResumeOptions> | false {
  if (resume === false) return false;
  if (resume === undefined || resume === null || resume === true) return { ...DEFAULT_RESUME };
  if (typeof resume !== "object") throw new TypeError(`${name}: expected an object or false, got ${typeOf(resume)}`);
  const policy = { ...DEFAULT_RESUME };
  for (const key of Object.keys(DEFAULT_RESUME) as Array<keyof ResumeOptions>) {
    const v = (resume as ResumeOptions)[key];
    if (v === undefined) continue;
    if (typeof v !== "number") throw new TypeError(`${name}.${key}: expected a number, got ${typeOf(v)}`);
    if (!(v >= 0 && Number.isFinite(v))) throw new RangeError(`${name}.${key}: ${v} is not a finite number >= 0`);
    policy[key] = v;
  }
  return policy;
}

/** How long to wait for the status that follows a `failed` frame. */
const FAILED_GRACE_MS = 2000;

/**
 * Codes that mean "the transport broke" when the status carries no agent-sidecar
 * ErrorInfo reason (the same set as the Python client's RESUMABLE_CODES):
 * UNAVAILABLE (no connection, or it dropped), INTERNAL (RST_STREAM and the
 * like), UNKNOWN (a status that says nothing more), and CANCELLED, because a
 * gRPC server shutting down (a sidecar stopped with SIGTERM) cancels the calls
 * in flight with a bare CANCELLED; a Prompt cut that way may never have reached
 * the sidecar, and is repeated (idempotent by request id). Every error the
 * sidecar itself sends carries an ErrorInfo (a turn cancelled on the sidecar is
 * CANCELLED with reason CANCELLED), so none of them is resumed.
 */
const TRANSPORT_CODES = new Set<number>([
  GrpcCode.UNAVAILABLE,
  GrpcCode.INTERNAL,
  GrpcCode.UNKNOWN,
  GrpcCode.CANCELLED,
]);

/** grpc-js's status details for a call this process cancelled (`call.cancel()`). */
const LOCAL_CANCEL_DETAILS = "Cancelled on client";

/**
 * True when an error means the connection dropped (and the stream should be
 * resumed) rather than the sidecar answering with an error: a status without
 * an agent-sidecar ErrorInfo whose code is one of {@link TRANSPORT_CODES}
 * (UNAVAILABLE, INTERNAL, UNKNOWN, CANCELLED), except what this client caused
 * itself, which resuming cannot help or would undo: a local request
 * serialization failure (INTERNAL; a bad argument), and an UNKNOWN or CANCELLED
 * that is not a status received by a gRPC call (the client's own "closed"
 * error, an exception wrapped as UNKNOWN) or that is grpc-js's status for a call
 * this process cancelled ("Cancelled on client"). A FrameStream also never
 * resumes after its own close(), its client's close(), or its AbortSignal, and
 * the caller's deadline ends a turn as DEADLINE_EXCEEDED with no reason (a
 * DeadlineExceeded, never AgentTimeout, which is a turn's server-side timeout).
 */
export function isTransportError(err: SidecarError): boolean {
  if (err.reason !== "" || !TRANSPORT_CODES.has(err.code) || isSerializationError(err)) return false;
  if (err.code !== GrpcCode.UNKNOWN && err.code !== GrpcCode.CANCELLED) return true;
  return isServiceError(err.cause) && err.cause.details !== LOCAL_CANCEL_DETAILS;
}

/** The longest delay setTimeout takes (a longer one fires at once). */
const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * An async iterable of activity frames with transparent reconnect-and-resume.
 * Iterate it once. Keepalive frames are skipped. For a turn stream, after the
 * `failed` frame is yielded the iteration throws the typed error.
 */
export class FrameStream implements AsyncIterable<ActivityFrame> {
  /** The turn's request id (undefined for session_key/platform feeds). */
  readonly requestId?: string;
  /** How many times the stream was reopened after a drop. */
  resumes = 0;
  private call?: ClientReadableStream<{ frame?: ActivityFrame | undefined }>;
  private dropRequested = false;
  private closed = false;
  /** Set by {@link fail}: the iteration throws it. */
  private failure?: Error;
  /** Ends the backoff sleep early (close, fail). */
  private wake?: () => void;
  private readonly onAbort = () => this.close();
  private iterated = false;
  private readonly resume: Required<ResumeOptions> | false;

  constructor(
    private readonly open: StreamOpener,
    /** The gap/duplicate filter; exposes `lastSeq`/`lastCursor`. */
    readonly sequencer: FrameSequencer,
    private readonly opts: FrameStreamOptions,
  ) {
    this.requestId = opts.requestId;
    this.resume = resumePolicy(opts.resume);
    // An already-aborted signal never fires "abort": the stream is closed from the start.
    if (opts.signal?.aborted) this.closed = true;
    else opts.signal?.addEventListener("abort", this.onAbort, { once: true });
  }

  /**
   * Drop the current underlying RPC as if the connection had broken. The
   * iteration resumes transparently via WatchActivity. For tests and demos of
   * resume; adapters never need it.
   */
  disconnect(): void {
    if (!this.call) return;
    this.dropRequested = true;
    this.call.cancel();
  }

  /** Stop reading: the iteration ends quietly. The turn on the sidecar goes on (use `cancel` to stop it). */
  close(): void {
    this.closed = true;
    this.call?.cancel();
    this.wake?.();
  }

  /**
   * End the iteration by throwing `err` (its client calls it on `close()`, with
   * CANCELLED). @internal
   */
  fail(err: Error): void {
    this.failure ??= err;
    this.call?.cancel();
    this.wake?.();
  }

  /** Read the stream to its end and return every frame (throws like iteration does). */
  async collect(): Promise<ActivityFrame[]> {
    const frames: ActivityFrame[] = [];
    for await (const f of this) frames.push(f);
    return frames;
  }

  [Symbol.asyncIterator](): AsyncIterator<ActivityFrame> {
    if (this.iterated) throw new Error("a FrameStream can be iterated only once");
    this.iterated = true;
    return this.run();
  }

  private async *run(): AsyncGenerator<ActivityFrame, void, undefined> {
    this.opts.live?.add(this);
    try {
      yield* this.frames();
    } finally {
      this.opts.live?.delete(this);
      this.opts.signal?.removeEventListener("abort", this.onAbort);
    }
  }

  /** Sleep `ms` unless closed or failed first. */
  private pause(ms: number): Promise<void> {
    return new Promise<void>((resolve) => {
      const timer = setTimeout(() => this.wake?.(), Math.min(ms, MAX_TIMER_MS));
      this.wake = () => {
        clearTimeout(timer);
        this.wake = undefined;
        resolve();
      };
    });
  }

  private async *frames(): AsyncGenerator<ActivityFrame, void, undefined> {
    let failures = 0;
    let first = true;
    let seen = false;
    let stalledSince: number | undefined;
    for (;;) {
      if (this.failure) throw this.failure;
      if (this.closed) return;
      const call = this.open(first ? null : this.sequencer.resumePoint(), this.sequencer.started);
      first = false;
      this.call = call;
      this.dropRequested = false;
      call.on("error", () => {}); // errors are read through the iterator below
      const it = call[Symbol.asyncIterator]() as AsyncIterator<{ frame?: ActivityFrame }>;
      let failed: ActivityFrame_Failed | undefined;
      let endError: unknown;
      let gap = false;
      let ended = false;
      let idle = false;
      const idleMs = this.opts.idleTimeoutMs ?? 0;
      try {
        for (;;) {
          const r = failed
            ? await nextWithin(it, FAILED_GRACE_MS)
            : idleMs > 0 && idleMs <= MAX_TIMER_MS
              ? await nextWithin(it, idleMs)
              : await it.next();
          if (r === undefined && !failed) {
            idle = true; // not a frame, nor a keepalive, for idleTimeoutMs: a half-open connection
            break;
          }
          if (r === undefined || r.done) break;
          const frame = r.value.frame;
          if (!frame) continue;
          const verdict = this.sequencer.offer(frame);
          if (verdict === "skip") continue;
          if (verdict === "gap") {
            gap = true;
            break;
          }
          failures = 0;
          seen = true;
          stalledSince = undefined;
          yield frame;
          if (frame.event?.$case === "failed" && this.opts.throwOnFailed) {
            failed = frame.event.value; // read on for the status, then throw
          } else if (isTerminal(frame) && this.sequencer.mode === "request") {
            ended = true;
            return;
          }
        }
        ended = !gap && !idle;
      } catch (err) {
        endError = err;
      } finally {
        if (!ended || failed) call.cancel();
      }

      if (failed) throw pickFailedError(failed, endError);
      // A call this stream cut itself (fail: its client's close; close: its own,
      // or its AbortSignal) ends here, before its CANCELLED could read as a
      // transport break below and be resumed.
      if (this.failure) throw this.failure;
      if (this.closed) return;
      const dropped = this.dropRequested || idle;
      if (idle) this.opts.onIdle?.();
      let cause: SidecarError | undefined;
      let retryDelayMs = 0;
      if (endError !== undefined) {
        cause = fromGrpcError(endError);
        // A feed reopens from its cursor after them too (the sidecar ends a stalled one STREAM_TOO_SLOW).
        const retry = RETRY_SAME_REQUEST_REASONS.has(cause.reason);
        if (!dropped && !retry && !isTransportError(cause)) throw cause;
        if (retry) retryDelayMs = cause.retryDelayMs ?? 0;
      } else if (!gap && !dropped && this.sequencer.mode === "request") {
        // The sidecar ends a request's stream OK only once the turn is over.
        if (this.opts.ownWatch && !seen) return; // the caller's watch: nothing after its afterSeq
        throw new TurnFramesGone({
          code: GrpcCode.DATA_LOSS,
          reason: "",
          message:
            `the turn of request ${this.requestId ?? "-"} is over but its frames after seq ` +
            `${this.sequencer.resumePoint().afterSeq} are gone (deleted or past retention): the rest of the turn cannot be read`,
        });
      } else if (!gap && !dropped && this.sequencer.mode === "feed") {
        return; // the sidecar closed the feed cleanly
      }
      // Dropped, gapped, silent, or refused with a reason that allows a retry: resume.
      failures += 1;
      stalledSince ??= Date.now();
      const giveUp = () =>
        cause ??
        new SidecarError({
          code: GrpcCode.UNAVAILABLE,
          reason: "",
          message: gap
            ? "activity stream has a gap"
            : idle
              ? `activity stream got no frame for ${idleMs} ms and was not resumed`
              : "activity stream ended before its terminal frame",
        });
      if (this.resume === false || failures > this.resume.maxRetries) throw giveUp();
      const left = () => stalledSince! + (this.resume as Required<ResumeOptions>).windowMs - Date.now();
      if (left() <= 0) throw giveUp();
      const r = this.resume;
      const backoff = dropped && failures === 1 ? 0 : Math.min(r.maxBackoffMs, r.initialBackoffMs * 2 ** Math.min(failures - 1, 30));
      const pause = Math.max(backoff, retryDelayMs);
      if (pause > 0) await this.pause(Math.min(pause, Math.max(0, left())));
      if (this.failure) throw this.failure;
      if (this.closed) return;
      if (this.opts.waitReady && left() > 0) await this.opts.waitReady(left());
      if (left() <= 0) throw giveUp();
      this.resumes += 1;
    }
  }
}

/** Await the next message, or `undefined` after `ms` (the pending read is then abandoned). */
async function nextWithin<T>(it: AsyncIterator<T>, ms: number): Promise<IteratorResult<T> | undefined> {
  const next = it.next();
  next.catch(() => {}); // the caller may abandon it; never leave it unhandled
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<undefined>((r) => (timer = setTimeout(() => r(undefined), ms)));
  try {
    return await Promise.race([next, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** The error to throw after a `failed` frame: the status's, when it carries a reason; else the frame's. */
function pickFailedError(failed: ActivityFrame_Failed, endError: unknown): SidecarError {
  if (endError !== undefined) {
    const e = fromGrpcError(endError);
    if (e.reason !== "") return e;
  }
  return errorFromFailedFrame(failed);
}

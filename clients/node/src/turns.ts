/**
 * The prompt and watch streams of SidecarClient: their arguments checked (a bad
 * one throws at the call, before any stream exists, naming it), their requests,
 * and the openers that resume them after a drop.
 */
import { randomUUID } from "node:crypto";
import { Metadata, type CallOptions } from "@grpc/grpc-js";
import { deadlineOf } from "./connection";
import { FrameSequencer } from "./frames";
import { PromptRequest, type PromptServiceClient, WatchActivityRequest } from "./gen/agent_sidecar/v1/prompt_service";
import { int64, parseDelivery, type PromptOptions, type WatchOptions } from "./options";
import { FrameStream, type ResumeOptions } from "./stream";
import { checkAttachments, checkSource, checkTexts, isAbsent, requireOne, requireTexts } from "./text";
import { invalidArgument } from "./errors";

/** What a prompt or watch stream needs of its client. */
export interface StreamHost {
  prompts: PromptServiceClient;
  /** The client's resume policy (a stream's own `resume` overrides it). */
  resume: ResumeOptions | false;
  /** Streams being iterated (the client ends them on close). */
  live: Set<FrameStream>;
  /** Throws the closed error once the client is closed. */
  checkOpen(): void;
  /** A stream that gets no frame at all (keepalives included) for this long is a drop (0: never). */
  idleTimeoutMs: number;
  /** Replace the channel whose connection went silent (a stream's idle timeout fired). */
  onIdle(): void;
  /** Resolves once the channel is ready, or after `ms`. */
  waitReady(ms: number): Promise<void>;
}

/** The FrameStream options every stream of `host` shares. */
function hostOptions(host: StreamHost) {
  return { live: host.live, idleTimeoutMs: host.idleTimeoutMs, onIdle: () => host.onIdle(), waitReady: (ms: number) => host.waitReady(ms) };
}

/**
 * {@link SidecarClient.prompt}: throws at once on a bad argument, naming it;
 * `text` and one of `source` and `sessionKey` are required.
 */
export function promptStream(host: StreamHost, opts: PromptOptions): FrameStream {
  const o: Partial<PromptOptions> = opts ?? {};
  const { text, requestId: given, source, sessionKey, profile, attachments } = o;
  requireTexts({ text });
  requireOne({ source, sessionKey });
  checkTexts({ requestId: given, sessionKey, profile });
  checkSource(source);
  checkAttachments(attachments);
  const requestId = given || randomUUID();
  const delivery = parseDelivery(o.delivery);
  const request = PromptRequest.fromPartial({ requestId, source, sessionKey, text, attachments, delivery, profile });
  const deadline = deadlineOf(o.deadline);
  const callOpts: Partial<CallOptions> = deadline === undefined ? {} : { deadline };
  return new FrameStream(
    (resume, started) => {
      host.checkOpen();
      const p = host.prompts; // the channel may have been replaced since the last open
      // Before any frame the Prompt itself is retried (it is idempotent by request id).
      return resume === null || !started
        ? p.prompt(request, new Metadata(), callOpts)
        : p.watchActivity(
            WatchActivityRequest.fromPartial({ requestId, afterSeq: resume.afterSeq }),
            new Metadata(),
            callOpts,
          );
    },
    new FrameSequencer("request"),
    { ...hostOptions(host), throwOnFailed: true, resume: o.resume ?? host.resume, signal: o.signal ?? undefined, requestId },
  );
}

/**
 * {@link SidecarClient.watch}: throws at once on a bad argument, naming it;
 * one of `requestId`, `sessionKey` and `platform` is required.
 */
export function watchStream(host: StreamHost, opts: WatchOptions): FrameStream {
  const o: WatchOptions = opts ?? {};
  const { requestId, sessionKey, platform } = o;
  requireOne({ requestId, sessionKey, platform });
  checkTexts({ requestId, sessionKey, platform });
  const byRequest = !!requestId;
  const seq = byRequest
    ? new FrameSequencer("request", { afterSeq: int64("afterSeq", o.afterSeq ?? 0, true) })
    : new FrameSequencer("feed", { afterCursor: int64("afterCursor", o.afterCursor ?? 0, true) });
  // The resume point this watch does not use is refused naming it, as the
  // sidecar refuses it: dropped, a replay asked for would become live frames only.
  const unused = byRequest ? "afterCursor" : "afterSeq";
  if (!isAbsent(o[unused]) && o[unused] !== 0) {
    throw invalidArgument(unused, `applies only with ${byRequest ? "sessionKey or platform" : "requestId"}`);
  }
  return new FrameStream(
    (resume) => {
      host.checkOpen();
      const point = resume ?? seq.resumePoint();
      const at = byRequest ? { afterSeq: point.afterSeq } : { afterCursor: point.afterCursor };
      const request = WatchActivityRequest.fromPartial({ requestId, sessionKey, platform, ...at });
      return host.prompts.watchActivity(request, new Metadata());
    },
    seq,
    {
      ...hostOptions(host),
      throwOnFailed: byRequest,
      resume: o.resume ?? host.resume,
      signal: o.signal ?? undefined,
      requestId: requestId ?? undefined,
      ownWatch: byRequest,
    },
  );
}

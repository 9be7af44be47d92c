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
import { checkAttachments, checkSource, checkTexts, requireOne, requireTexts } from "./text";

/** What a prompt or watch stream needs of its client. */
export interface StreamHost {
  prompts: PromptServiceClient;
  /** The client's resume policy (a stream's own `resume` overrides it). */
  resume: ResumeOptions | false;
  /** Streams being iterated (the client ends them on close). */
  live: Set<FrameStream>;
  /** Throws the closed error once the client is closed. */
  checkOpen(): void;
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
  const p = host.prompts;
  return new FrameStream(
    (resume, started) => {
      host.checkOpen();
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
    { throwOnFailed: true, resume: o.resume ?? host.resume, signal: o.signal ?? undefined, requestId, live: host.live },
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
  const p = host.prompts;
  const seq = byRequest
    ? new FrameSequencer("request", { afterSeq: int64("afterSeq", o.afterSeq ?? 0, true) })
    : new FrameSequencer("feed", { afterCursor: int64("afterCursor", o.afterCursor ?? 0, true) });
  return new FrameStream(
    (resume) => {
      host.checkOpen();
      const point = resume ?? seq.resumePoint();
      const at = byRequest ? { afterSeq: point.afterSeq } : { afterCursor: point.afterCursor };
      const request = WatchActivityRequest.fromPartial({ requestId, sessionKey, platform, ...at });
      return p.watchActivity(request, new Metadata());
    },
    seq,
    {
      throwOnFailed: byRequest,
      resume: o.resume ?? host.resume,
      signal: o.signal ?? undefined,
      requestId: requestId ?? undefined,
      live: host.live,
    },
  );
}

/**
 * The prompt and watch streams of SidecarClient: their arguments checked (a bad
 * one throws at the call, before any stream exists, naming it), their requests,
 * and the openers that resume them after a drop.
 */
import { randomUUID } from "node:crypto";
import { Metadata, type CallOptions } from "@grpc/grpc-js";
import { deadlineOf, typeOf } from "./connection";
import { FrameSequencer } from "./frames";
import { SessionSource } from "./gen/agent_sidecar/v1/common";
import type { PromptServiceClient } from "./gen/agent_sidecar/v1/prompt_service";
import { int64, parseDelivery, type PromptOptions, type WatchOptions } from "./options";
import { FrameStream, type ResumeOptions } from "./stream";
import { checkAttachments, checkSource, checkTexts } from "./text";

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

/** {@link SidecarClient.prompt}: throws at once on a bad argument, naming it. */
export function promptStream(host: StreamHost, opts: PromptOptions): FrameStream {
  if (typeof opts.text !== "string") throw new TypeError(`text: expected a string, got ${typeOf(opts.text)}`);
  const { text, requestId: given, sessionKey, profile } = opts;
  checkTexts({ text, requestId: given, sessionKey, profile });
  checkSource(opts.source);
  checkAttachments(opts.attachments);
  const requestId = given || randomUUID();
  const request = {
    requestId,
    source: opts.source ? SessionSource.fromPartial(opts.source) : undefined,
    sessionKey: sessionKey ?? "",
    text,
    attachments: opts.attachments ?? [],
    delivery: parseDelivery(opts.delivery),
    profile: profile ?? "",
  };
  const deadline = deadlineOf(opts.deadline);
  const callOpts: Partial<CallOptions> = deadline === undefined ? {} : { deadline };
  const p = host.prompts;
  return new FrameStream(
    (resume, started) => {
      host.checkOpen();
      // Before any frame the Prompt itself is retried (it is idempotent by request id).
      return resume === null || !started
        ? p.prompt(request, new Metadata(), callOpts)
        : p.watchActivity(
            { requestId, sessionKey: "", platform: "", afterSeq: resume.afterSeq, afterCursor: 0 },
            new Metadata(),
            callOpts,
          );
    },
    new FrameSequencer("request"),
    { throwOnFailed: true, resume: opts.resume ?? host.resume, signal: opts.signal, requestId, live: host.live },
  );
}

/** {@link SidecarClient.watch}: throws at once on a bad argument, naming it. */
export function watchStream(host: StreamHost, opts: WatchOptions): FrameStream {
  checkTexts({ requestId: opts.requestId, sessionKey: opts.sessionKey, platform: opts.platform });
  const byRequest = !!opts.requestId;
  const p = host.prompts;
  const seq = byRequest
    ? new FrameSequencer("request", { afterSeq: int64("afterSeq", opts.afterSeq ?? 0, true) })
    : new FrameSequencer("feed", { afterCursor: int64("afterCursor", opts.afterCursor ?? 0, true) });
  return new FrameStream(
    (resume) => {
      host.checkOpen();
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
    {
      throwOnFailed: byRequest,
      resume: opts.resume ?? host.resume,
      signal: opts.signal,
      requestId: opts.requestId,
      live: host.live,
    },
  );
}

/**
 * A session or platform watch that the sidecar ends STREAM_TOO_SLOW (its reader
 * stalled while frames piled up) reopens from its last cursor, as the error's
 * message and ErrorInfo metadata say to: the frames are persisted, nothing is
 * lost. Before, only a request's stream carried on after the retryable
 * reasons, and a feed watch, which follows cursors and never ends by itself,
 * threw StreamTooSlow at an adapter that had only been slow for a moment.
 * (Against a real sidecar: a platform watch left unread for 15 s while 24
 * large turns streamed threw StreamTooSlow after 18 frames.)
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { Metadata, status as GrpcCode, type ServerWritableStream } from "@grpc/grpc-js";
import { encodeStatusDetails, STATUS_DETAILS_KEY } from "../src/errors";
import {
  PromptServiceService,
  type WatchActivityRequest,
  type WatchActivityResponse,
} from "../src/gen/agent_sidecar/v1/prompt_service";
import { frame, serveForTests } from "./helpers";

const T = { timeout: 5000 };

/** Every WatchActivity the fake got: [platform, after_cursor]. */
const calls: Array<[string, number]> = [];

/** The status the sidecar ends a stalled feed with: RESOURCE_EXHAUSTED, STREAM_TOO_SLOW, RetryInfo 0.1 s. */
function tooSlow(platform: string, afterCursor: number) {
  const metadata = new Metadata();
  const details = `the stream's client stopped reading ...; resume with WatchActivity(platform='${platform}', after_cursor=${afterCursor})`;
  metadata.set(
    STATUS_DETAILS_KEY,
    encodeStatusDetails({
      code: GrpcCode.RESOURCE_EXHAUSTED,
      message: details,
      reason: "STREAM_TOO_SLOW",
      retryDelayMs: 100,
      metadata: { platform, after_cursor: String(afterCursor) },
    }),
  );
  return { code: GrpcCode.RESOURCE_EXHAUSTED, details, metadata };
}

/** Cursors 101..104 of two turns; the first call sends two, then ends STREAM_TOO_SLOW; the next sends the rest and ends. */
function watchActivity(call: ServerWritableStream<WatchActivityRequest, WatchActivityResponse>): void {
  const { platform, afterCursor } = call.request;
  calls.push([platform, afterCursor]);
  const frames = [frame(1, "accepted", "", "a"), frame(2, "started", "", "a"), frame(3, "text_delta", "x", "a"),
    frame(4, "completed", "x", "a")].filter((f) => f.cursor > afterCursor);
  if (afterCursor === 0) {
    frames.slice(0, 2).forEach((f) => call.write({ frame: f }));
    return void call.emit("error", tooSlow(platform, 102));
  }
  frames.forEach((f) => call.write({ frame: f }));
  call.end();
}

const { client } = serveForTests([[PromptServiceService, { watchActivity } as any]], {
  resume: { initialBackoffMs: 1, maxBackoffMs: 1 },
});

test("a platform watch ended STREAM_TOO_SLOW resumes from its last cursor, with no gap or repeat", T, async () => {
  const stream = client.watch({ platform: "slow" });
  const frames = await stream.collect();
  assert.deepEqual(frames.map((f) => f.cursor), [101, 102, 103, 104]);
  assert.equal(stream.resumes, 1);
  assert.deepEqual(calls, [
    ["slow", 0],
    ["slow", 102],
  ]);
});

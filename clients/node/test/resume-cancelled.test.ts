/**
 * A bare CANCELLED or UNKNOWN status (no agent-sidecar ErrorInfo) is a transport
 * break, as in the Python client: a gRPC server shutting down (a sidecar stopped
 * with SIGTERM) cancels the calls in flight with status CANCELLED, details
 * "CANCELLED" and no ErrorInfo, so a Prompt cut that way is repeated with the
 * same request id (or, after a frame, followed with WatchActivity). Before, the
 * Node client threw a Cancelled-coded SidecarError for a prompt the sidecar may
 * never have received. A CANCELLED the sidecar sends (ErrorInfo reason
 * CANCELLED) is still the typed Cancelled error, and a call this client cut
 * itself (stream close(), an abort, client close()) is never resumed.
 */
import assert from "node:assert/strict";
import { beforeEach, test } from "node:test";
import { Metadata, status as GrpcCode, type ServerWritableStream, type ServiceError } from "@grpc/grpc-js";
import { closedError, connect } from "../src/client";
import { Cancelled, encodeStatusDetails, fromGrpcError, SidecarError, STATUS_DETAILS_KEY } from "../src/errors";
import { frameKind } from "../src/frames";
import {
  type ActivityFrame,
  type PromptRequest,
  type PromptResponse,
  PromptServiceService,
  type WatchActivityRequest,
  type WatchActivityResponse,
} from "../src/gen/agent_sidecar/v1/prompt_service";
import { isTransportError } from "../src/stream";
import { frame, shortTurn, serveForTests, sleep } from "./helpers";

const T = { timeout: 5000 };

/** The status a gRPC server's shutdown gives the calls in flight: no trailer details. */
const bare = (code: GrpcCode) => ({ code, details: GrpcCode[code] });

/** The status the sidecar sends for a turn cancelled on it: CANCELLED with ErrorInfo reason CANCELLED. */
function sidecarCancelled() {
  const metadata = new Metadata();
  const details = "turn cancelled";
  metadata.set(
    STATUS_DETAILS_KEY,
    encodeStatusDetails({ code: GrpcCode.CANCELLED, message: details, reason: "CANCELLED" }),
  );
  return { code: GrpcCode.CANCELLED, details, metadata };
}

/** Every call the server got: [method, request id, after_seq]. */
const calls: Array<[string, string, number]> = [];
const promptsOf = (requestId: string) => calls.filter(([m, r]) => m === "prompt" && r === requestId).length;

/** Prompt behaviours chosen by the request text; "-first" ones fail only a request id's first Prompt. */
function prompt(call: ServerWritableStream<PromptRequest, PromptResponse>): void {
  const { requestId, text } = call.request;
  calls.push(["prompt", requestId, 0]);
  const first = promptsOf(requestId) === 1;
  const frames = shortTurn(requestId);
  const send = (f: ActivityFrame) => call.write({ frame: f });
  switch (text) {
    case "cancelled-first": // the server shut down as the Prompt arrived
      if (first) return void call.emit("error", bare(GrpcCode.CANCELLED));
      break;
    case "unknown-first":
      if (first) return void call.emit("error", bare(GrpcCode.UNKNOWN));
      break;
    case "cancelled-mid": // two frames, then the server shut down
      if (first) {
        frames.slice(0, 2).forEach(send);
        return void call.emit("error", bare(GrpcCode.CANCELLED));
      }
      break;
    case "cancelled-by-sidecar":
      return void call.emit("error", sidecarCancelled());
    case "hang": // two frames, then silence until the client cuts the call
      frames.slice(0, 2).forEach(send);
      call.on("cancelled", () => {});
      return;
  }
  frames.forEach(send);
  call.end();
}

function watchActivity(call: ServerWritableStream<WatchActivityRequest, WatchActivityResponse>): void {
  const { requestId, afterSeq } = call.request;
  calls.push(["watchActivity", requestId, afterSeq]);
  shortTurn(requestId)
    .filter((f) => f.seq > afterSeq)
    .forEach((f) => call.write({ frame: f }));
  call.end();
}

const { client, target } = serveForTests([[PromptServiceService, { prompt, watchActivity } as any]], {
  resume: { initialBackoffMs: 1, maxBackoffMs: 1 },
});

beforeEach(() => {
  calls.length = 0;
});

const seqs = (fs: ActivityFrame[]) => fs.map((f) => f.seq);

test("a Prompt answered with a bare CANCELLED (a server shutting down) is repeated with the same request id", T, async () => {
  const stream = client.prompt({ sessionKey: "k", text: "cancelled-first", requestId: "shutdown-1" });
  const frames = await stream.collect();
  assert.deepEqual(seqs(frames), [1, 2, 3, 4]);
  assert.equal(frameKind(frames[3]), "completed");
  assert.equal(stream.resumes, 1);
  assert.deepEqual(calls, [
    ["prompt", "shutdown-1", 0],
    ["prompt", "shutdown-1", 0],
  ]);
});

test("a bare UNKNOWN is a transport break too: the Prompt is repeated", T, async () => {
  const stream = client.prompt({ sessionKey: "k", text: "unknown-first", requestId: "unknown-1" });
  assert.deepEqual(seqs(await stream.collect()), [1, 2, 3, 4]);
  assert.equal(stream.resumes, 1);
  assert.equal(promptsOf("unknown-1"), 2);
});

test("a bare CANCELLED after frames resumes with WatchActivity(after_seq)", T, async () => {
  const stream = client.prompt({ sessionKey: "k", text: "cancelled-mid", requestId: "mid-1" });
  assert.deepEqual(seqs(await stream.collect()), [1, 2, 3, 4]);
  assert.equal(stream.resumes, 1);
  assert.deepEqual(calls, [
    ["prompt", "mid-1", 0],
    ["watchActivity", "mid-1", 2],
  ]);
});

test("CANCELLED with the sidecar's ErrorInfo (reason CANCELLED) is the typed Cancelled error, not resumed", T, async () => {
  const stream = client.prompt({ sessionKey: "k", text: "cancelled-by-sidecar", requestId: "sc-1" });
  await assert.rejects(stream.collect(), (e: unknown) => {
    assert.ok(e instanceof Cancelled, String(e));
    assert.equal(e.code, GrpcCode.CANCELLED);
    assert.equal(e.reason, "CANCELLED");
    assert.equal(e.message, "turn cancelled");
    return true;
  });
  assert.equal(stream.resumes, 0);
  assert.deepEqual(calls, [["prompt", "sc-1", 0]]);
});

test("a call the client cut itself is never resumed: stream close(), an abort, client close()", T, async () => {
  // close(): the iteration ends quietly after the two frames, with no second Prompt.
  const closing = client.prompt({ sessionKey: "k", text: "hang", requestId: "close-1" });
  const seen: number[] = [];
  for await (const f of closing) {
    seen.push(f.seq);
    if (seen.length === 2) closing.close();
  }
  assert.deepEqual(seen, [1, 2]);

  // An abort of the caller's signal: likewise.
  const ac = new AbortController();
  const aborting = client.prompt({ sessionKey: "k", text: "hang", requestId: "abort-1", signal: ac.signal });
  const got: number[] = [];
  for await (const f of aborting) {
    got.push(f.seq);
    if (got.length === 2) ac.abort();
  }
  assert.deepEqual(got, [1, 2]);

  // client.close(): the client's closed error (CANCELLED), not a resume.
  const c = connect(target, { resume: { initialBackoffMs: 1, maxBackoffMs: 1 } });
  const ending = c.prompt({ sessionKey: "k", text: "hang", requestId: "client-close-1" });
  const mine: number[] = [];
  await assert.rejects(
    (async () => {
      for await (const f of ending) {
        mine.push(f.seq);
        if (mine.length === 2) c.close();
      }
    })(),
    (e: unknown) => e instanceof SidecarError && e.code === GrpcCode.CANCELLED && e.message === "the client was closed",
  );
  assert.deepEqual(mine, [1, 2]);

  await sleep(100); // a wrongly resumed stream would have sent its Prompt again by now
  for (const s of [closing, aborting, ending]) assert.equal(s.resumes, 0, s.requestId);
  assert.deepEqual(calls, [
    ["prompt", "close-1", 0],
    ["prompt", "abort-1", 0],
    ["prompt", "client-close-1", 0],
  ]);
});

test("isTransportError: a bare CANCELLED or UNKNOWN status is; the sidecar's, or one this client made, is not", () => {
  const status = (code: GrpcCode, details: string, bin?: Buffer): ServiceError => {
    const metadata = new Metadata();
    if (bin) metadata.set(STATUS_DETAILS_KEY, bin);
    return Object.assign(new Error(`${code} ${GrpcCode[code]}: ${details}`), { code, details, metadata });
  };
  for (const code of [GrpcCode.CANCELLED, GrpcCode.UNKNOWN, GrpcCode.UNAVAILABLE, GrpcCode.INTERNAL]) {
    assert.equal(isTransportError(fromGrpcError(status(code, GrpcCode[code]))), true, GrpcCode[code]);
  }
  const reasoned = encodeStatusDetails({ code: GrpcCode.CANCELLED, message: "m", reason: "CANCELLED" });
  assert.equal(isTransportError(fromGrpcError(status(GrpcCode.CANCELLED, "m", reasoned))), false, "the sidecar's");
  // grpc-js's status for a call this process cancelled (call.cancel()).
  assert.equal(isTransportError(fromGrpcError(status(GrpcCode.CANCELLED, "Cancelled on client"))), false, "cancel()");
  assert.equal(isTransportError(closedError()), false, "the client's closed error");
  assert.equal(isTransportError(fromGrpcError(new TypeError("a local bug"))), false, "a local exception as UNKNOWN");
  for (const code of [GrpcCode.DEADLINE_EXCEEDED, GrpcCode.NOT_FOUND, GrpcCode.ABORTED]) {
    assert.equal(isTransportError(fromGrpcError(status(code, GrpcCode[code]))), false, GrpcCode[code]);
  }
});

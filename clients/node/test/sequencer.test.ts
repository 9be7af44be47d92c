/** The resume gap/duplicate filter, without a server. */
import assert from "node:assert/strict";
import { test } from "node:test";
import { FrameSequencer, frameKind } from "../src/frames";
import type { ActivityFrame } from "../src/gen/agent_sidecar/v1/prompt_service";
import { frame } from "./helpers";

test("request mode yields seq 1..n once, skipping duplicates and keepalives", () => {
  const s = new FrameSequencer("request");
  const got: number[] = [];
  const offer = (f: ActivityFrame) => {
    const v = s.offer(f);
    if (v === "yield") got.push(f.seq);
    return v;
  };
  assert.equal(offer(frame(1, "accepted")), "yield");
  assert.equal(offer(frame(2, "started")), "yield");
  assert.equal(offer(frame(2, "keepalive")), "skip");
  assert.equal(offer(frame(3, "text_delta", "a")), "yield");
  // A resumed stream replays from an earlier point: duplicates are dropped.
  assert.equal(offer(frame(2, "started")), "skip");
  assert.equal(offer(frame(3, "text_delta", "a")), "skip");
  assert.equal(offer(frame(4, "text_delta", "b")), "yield");
  assert.deepEqual(s.resumePoint(), { afterSeq: 4, afterCursor: 104 });
  assert.equal(offer(frame(5, "completed", "a b")), "yield");
  assert.equal(s.terminal?.seq, 5);
  assert.equal(offer(frame(6, "text_delta", "late")), "skip");
  assert.deepEqual(got, [1, 2, 3, 4, 5]);
});

test("request mode reports a gap and does not advance past it", () => {
  const s = new FrameSequencer("request");
  assert.equal(s.offer(frame(1, "accepted")), "yield");
  assert.equal(s.offer(frame(3, "text_delta", "x")), "gap");
  assert.equal(s.lastSeq, 1);
  assert.deepEqual(s.resumePoint().afterSeq, 1);
  assert.equal(s.offer(frame(2, "started")), "yield");
  assert.equal(s.offer(frame(3, "text_delta", "x")), "yield");
});

test("a watch that starts after_seq=k expects k+1 first", () => {
  const s = new FrameSequencer("request", { afterSeq: 3 });
  assert.equal(s.started, true);
  assert.equal(s.offer(frame(3, "text_delta")), "skip");
  assert.equal(s.offer(frame(4, "text_delta")), "yield");
});

test("feed mode orders by cursor across requests", () => {
  const s = new FrameSequencer("feed");
  assert.equal(s.started, false);
  assert.equal(s.offer(frame(1, "accepted", undefined, "r1", 101)), "yield");
  assert.equal(s.offer(frame(1, "accepted", undefined, "r2", 102)), "yield");
  assert.equal(s.offer(frame(1, "accepted", undefined, "r1", 101)), "skip");
  assert.equal(s.offer(frame(1, "keepalive", undefined, "r2", 0)), "skip");
  assert.equal(s.offer(frame(2, "started", undefined, "r1", 103)), "yield");
  assert.equal(s.resumePoint().afterCursor, 103);
});

test("feed mode resumes from a keepalive's cursor (a live watch's starting point)", () => {
  const s = new FrameSequencer("feed");
  assert.equal(s.offer(frame(0, "keepalive", undefined, "", 40)), "skip");
  assert.equal(s.resumePoint().afterCursor, 40);
  assert.equal(s.offer(frame(0, "keepalive", undefined, "", 30)), "skip");
  assert.equal(s.resumePoint().afterCursor, 40);
  assert.equal(s.offer(frame(1, "accepted", undefined, "r1", 41)), "yield");
  assert.equal(s.resumePoint().afterCursor, 41);
});

test("frameKind names kinds as docs/api.md does", () => {
  assert.equal(frameKind(frame(1, "text_delta", "x")), "text_delta");
  assert.equal(frameKind(frame(1, "tool_result")), "tool_result");
  assert.equal(frameKind({ ...frame(1, "started"), event: undefined }), undefined);
});

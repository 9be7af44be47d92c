/**
 * Activity-frame helpers: kind names and the gap/duplicate filter that makes a
 * resumed stream look like one unbroken stream. Pure code, no I/O, so it is
 * testable without a server.
 */
import type { ActivityFrame } from "./gen/agent_sidecar/v1/prompt_service";

/** A frame's kind, named as in docs/api.md and the proto's `oneof event` fields. */
export type FrameKind =
  | "accepted"
  | "started"
  | "text_delta"
  | "tool_call"
  | "tool_result"
  | "usage"
  | "completed"
  | "failed"
  | "superseded"
  | "keepalive";

const KIND_BY_CASE: Record<string, FrameKind> = {
  accepted: "accepted",
  started: "started",
  textDelta: "text_delta",
  toolCall: "tool_call",
  toolResult: "tool_result",
  usage: "usage",
  completed: "completed",
  failed: "failed",
  superseded: "superseded",
  keepalive: "keepalive",
};

/** The kind of a frame (`"text_delta"`, `"completed"`, …), or `undefined` for an empty frame. */
export function frameKind(frame: ActivityFrame): FrameKind | undefined {
  const c = frame.event?.$case;
  return c === undefined ? undefined : KIND_BY_CASE[c];
}

/** True for the kinds that end a turn: `completed`, `failed`, `superseded`. */
export function isTerminal(frame: ActivityFrame): boolean {
  const c = frame.event?.$case;
  return c === "completed" || c === "failed" || c === "superseded";
}

/** What {@link FrameSequencer.offer} decided about one frame. */
export type Verdict =
  /** New and in order: hand it to the caller. */
  | "yield"
  /** A keepalive or a frame already yielded: drop it. */
  | "skip"
  /** Frames are missing before this one: resume from {@link FrameSequencer.resumePoint}. */
  | "gap";

/**
 * Tracks what has been yielded so a stream can be resumed after a drop with
 * neither gap nor duplicate.
 *
 * - `"request"` mode (Prompt, WatchActivity by request_id): frames of one turn,
 *   `seq` gapless from 1. Duplicates (seq ≤ last) are skipped; a jump
 *   (seq > last + 1) is a gap. Resume with `after_seq = lastSeq`.
 * - `"feed"` mode (WatchActivity by session_key or platform): frames of many
 *   turns; the store's global `cursor` orders them. Frames at or below the last
 *   cursor are skipped. Resume with `after_cursor = lastCursor`.
 *
 * Keepalive frames are never yielded: they are not persisted and repeat the
 * last seq.
 */
export class FrameSequencer {
  /** Highest seq yielded (request mode). */
  lastSeq: number;
  /** Highest cursor yielded. */
  lastCursor: number;
  /** The terminal frame once one was yielded (request mode). */
  terminal?: ActivityFrame;

  constructor(
    readonly mode: "request" | "feed",
    start: { afterSeq?: number; afterCursor?: number } = {},
  ) {
    this.lastSeq = start.afterSeq ?? 0;
    this.lastCursor = start.afterCursor ?? 0;
  }

  /** Decide about the next received frame; on `"yield"` the frame is recorded as seen. */
  offer(frame: ActivityFrame): Verdict {
    if (frame.event?.$case === "keepalive") {
      // A watch's keepalive carries the cursor it has reached (a live watch's
      // first, the head it starts after): resume from there.
      if (this.mode === "feed" && frame.cursor > this.lastCursor) this.lastCursor = frame.cursor;
      return "skip";
    }
    if (this.mode === "feed") {
      if (frame.cursor > 0 && frame.cursor <= this.lastCursor) return "skip";
      if (frame.cursor > this.lastCursor) this.lastCursor = frame.cursor;
      return "yield";
    }
    if (this.terminal) return "skip";
    if (frame.seq <= this.lastSeq) return "skip";
    if (frame.seq > this.lastSeq + 1) return "gap";
    this.lastSeq = frame.seq;
    if (frame.cursor > this.lastCursor) this.lastCursor = frame.cursor;
    if (isTerminal(frame)) this.terminal = frame;
    return "yield";
  }

  /** Where to resume after a drop: `after_seq` (request mode) or `after_cursor` (feed mode). */
  resumePoint(): { afterSeq: number; afterCursor: number } {
    return { afterSeq: this.lastSeq, afterCursor: this.lastCursor };
  }

  /** True once any non-keepalive frame was yielded. */
  get started(): boolean {
    return this.mode === "request" ? this.lastSeq > 0 : this.lastCursor > 0;
  }
}

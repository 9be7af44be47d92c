/**
 * Transcript messages as callers give them (`Partial<Message>`), checked field
 * by field before anything is sent, for the calls that take them (seedSession,
 * appendMessages, rewriteTranscript). Without the checks grpc-js would turn a
 * number into text ("42"), a lone surrogate into U+FFFD, crash on a null
 * message, or fail with its own serialization message naming no field.
 *
 * The rules are the ones that cannot change with the sidecar's config: the
 * proto's roles, the field types, text protobuf can carry (UTF-8, so no lone
 * surrogate: text.ts's one check, as for every string a call sends). Sizes are
 * the sidecar's `limits` (configurable), so it judges them.
 */
import { typeOf } from "./connection";
import { invalidArgument } from "./errors";
import { checkText, required } from "./text";
import type { Message } from "./gen/agent_sidecar/v1/common";

/** The roles a message may have (proto `Message.role`). */
export const ROLES: readonly string[] = ["system", "user", "assistant", "tool"];

const TEXT_FIELDS = ["content", "toolCallId", "toolName", "toolCallsJson"] as const;

/**
 * `messages` as protobuf Messages (absent fields empty), or an InvalidArgument
 * naming the first bad field: `messages`, `messages[2]`, `messages[2].role`.
 * The list itself is required (undefined or null is refused): an empty one is
 * `[]`, never a missing argument that would, say, rewrite a transcript to nothing.
 */
export function toMessages(messages: unknown, name = "messages"): Message[] {
  required(messages, name);
  if (!Array.isArray(messages)) throw invalidArgument(name, `expected an array of messages, got ${typeOf(messages)}`);
  const out: Message[] = [];
  for (let i = 0; i < messages.length; i++) out.push(toMessage(messages[i], `${name}[${i}]`)); // holes too
  return out;
}

function toMessage(m: unknown, at: string): Message {
  if (typeof m !== "object" || m === null || Array.isArray(m) || m instanceof Date) {
    throw invalidArgument(at, `expected a message object, got ${typeOf(m)}`);
  }
  const p = m as Partial<Record<keyof Message, unknown>>;
  if (p.role !== undefined && typeof p.role !== "string") {
    throw invalidArgument(`${at}.role`, `expected a string, got ${typeOf(p.role)}`);
  }
  if (!ROLES.includes(p.role ?? "")) {
    const given = p.role === undefined ? "it is missing" : `not ${JSON.stringify(p.role.slice(0, 40))}`;
    throw invalidArgument(`${at}.role`, `must be one of ${ROLES.join(", ")}; ${given}`);
  }
  for (const k of TEXT_FIELDS) checkText(p[k], `${at}.${k}`);
  return {
    role: p.role as string,
    content: (p.content as string | undefined) ?? "",
    toolCallId: (p.toolCallId as string | undefined) ?? "",
    toolName: (p.toolName as string | undefined) ?? "",
    toolCallsJson: (p.toolCallsJson as string | undefined) ?? "",
    createdAt: date(p.createdAt, `${at}.createdAt`),
    seq: seq(p.seq, `${at}.seq`),
    active: flag(p.active, `${at}.active`),
    synthetic: flag(p.synthetic, `${at}.synthetic`),
  };
}

function date(v: unknown, field: string): Date | undefined {
  if (v === undefined || v === null) return undefined;
  if (!(v instanceof Date)) throw invalidArgument(field, `expected a Date, got ${typeOf(v)}`);
  if (Number.isNaN(v.getTime())) throw invalidArgument(field, "is an Invalid Date");
  return v;
}

function seq(v: unknown, field: string): number {
  if (v === undefined || v === null) return 0;
  if (typeof v !== "number") throw invalidArgument(field, `expected an integer, got ${typeOf(v)}`);
  if (!Number.isSafeInteger(v)) throw invalidArgument(field, `${v} is not a safe integer`);
  return v;
}

function flag(v: unknown, field: string): boolean {
  if (v === undefined || v === null) return false;
  if (typeof v !== "boolean") throw invalidArgument(field, `expected a boolean, got ${typeOf(v)}`);
  return v;
}

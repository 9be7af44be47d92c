/**
 * The one check of what a call sends, before it is sent. Every public call
 * refuses a bad argument up front with an InvalidArgument naming the field in
 * the caller's spelling (`sessionKey`, `source.chatId`, `attachments[0].name`,
 * `messages[1].content`), and sends nothing:
 *
 * - a string field must be absent or a string protobuf can encode as UTF-8. A
 *   lone surrogate (half of a pair, e.g. what `.slice()` leaves when it cuts an
 *   emoji in two) is no Unicode text; grpc-js would send U+FFFD in its place,
 *   and the sidecar would store text that differs from what was given.
 * - a required field (the proto's "Required") given as undefined or null is
 *   `is required (got undefined)`. Unchecked, the generated encoder sends
 *   undefined as the TEXT "undefined" and null as "null".
 * - an optional field given as undefined or null is absent: the calls build
 *   their requests with the generated `fromPartial`, which sends the proto
 *   default ("", 0, false, no message) in its place.
 *
 * The one exception is what cannot be refused: a ToolHost's result goes back to
 * the sidecar whatever it holds, lone surrogates replaced ({@link toValidText}).
 */
import { typeOf } from "./connection";
import { invalidArgument } from "./errors";
import { SessionSource } from "./gen/agent_sidecar/v1/common";
import { Attachment } from "./gen/agent_sidecar/v1/prompt_service";

/** Lone surrogates (in `u` mode a well-formed pair is one code point, outside this class). */
const LONE_SURROGATE = /[\uD800-\uDFFF]/u;

/** True for what JavaScript passes for "not given": undefined and null. */
export function isAbsent(v: unknown): v is undefined | null {
  return v === undefined || v === null;
}

/** A required argument: undefined or null is an InvalidArgument naming `field`. */
export function required(v: unknown, field: string): void {
  if (isAbsent(v)) throw invalidArgument(field, `is required (got ${typeOf(v)})`);
}

/**
 * A string field: absent (undefined, null), or a string protobuf can encode as
 * UTF-8; anything else is an InvalidArgument naming `field`.
 */
export function checkText(v: unknown, field: string): void {
  if (isAbsent(v)) return;
  if (typeof v !== "string") throw invalidArgument(field, `expected a string, got ${typeOf(v)}`);
  const bad = LONE_SURROGATE.exec(v);
  if (bad) {
    throw invalidArgument(field, `has a lone surrogate at index ${bad.index} (not Unicode text; UTF-8 cannot carry it)`);
  }
}

/** {@link checkText} of each optional field, named by its key: `checkTexts({ profile, pageToken })`. */
export function checkTexts(fields: Record<string, unknown>): void {
  for (const [field, v] of Object.entries(fields)) checkText(v, field);
}

/** Each field {@link required} and {@link checkText}ed: `requireTexts({ sessionKey, reason })`. */
export function requireTexts(fields: Record<string, unknown>): void {
  for (const [field, v] of Object.entries(fields)) {
    required(v, field);
    checkText(v, field);
  }
}

/**
 * The proto's "one of a and b": when every field is absent the call means
 * nothing, an InvalidArgument naming the first (`sessionKey: one of sessionKey
 * and sessionId is required (got neither)`). Which one, and whether more than
 * one is given, the sidecar judges.
 */
export function requireOne(fields: Record<string, unknown>): void {
  const names = Object.keys(fields);
  if (!names.every((k) => isAbsent(fields[k]))) return;
  const list = names.length === 2 ? names.join(" and ") : `${names.slice(0, -1).join(", ")} and ${names.at(-1)}`;
  throw invalidArgument(names[0], `one of ${list} is required (got ${names.length === 2 ? "neither" : "none"})`);
}

/** A bool field: absent or a boolean (protobuf would send any truthy value, "false" too, as true). */
export function checkFlag(v: unknown, field: string): void {
  if (!isAbsent(v) && typeof v !== "boolean") throw invalidArgument(field, `expected a boolean, got ${typeOf(v)}`);
}

/** The fields of a generated message type whose default is of kind `kind`. */
function fieldsOf(empty: object, kind: string): readonly string[] {
  return Object.entries(empty)
    .filter(([, v]) => typeof v === kind)
    .map(([k]) => k);
}

const SOURCE_FIELDS = fieldsOf(SessionSource.fromPartial({}), "string");
const SOURCE_FLAGS = fieldsOf(SessionSource.fromPartial({}), "boolean");
const ATTACHMENT_FIELDS = fieldsOf(Attachment.fromPartial({}), "string");

/**
 * A source, where one may be left out: absent, or an object whose `platform`
 * is given (the proto's "Required") and whose fields are of their kinds
 * (`source.chatId`, `source.isBot`). Something else that is no object is left
 * as before (SessionSource.fromPartial judges it).
 */
export function checkSource(source: unknown, name = "source"): void {
  if (typeof source !== "object" || source === null) return;
  const s = source as Record<string, unknown>;
  required(s.platform, `${name}.platform`);
  for (const k of SOURCE_FIELDS) checkText(s[k], `${name}.${k}`);
  for (const k of SOURCE_FLAGS) checkFlag(s[k], `${name}.${k}`);
}

/** A source the call needs (GetOrCreateSession, GetSessionContext): given, and {@link checkSource}d. */
export function requireSource(source: unknown, name = "source"): void {
  required(source, name);
  checkSource(source, name);
}

/**
 * Attachments: absent (none), or an array of attachment objects whose string
 * fields are text (`attachments[0].mimeType`) and whose `data` is absent or bytes.
 */
export function checkAttachments(attachments: unknown, name = "attachments"): void {
  if (isAbsent(attachments)) return;
  if (!Array.isArray(attachments)) {
    throw invalidArgument(name, `expected an array of attachments, got ${typeOf(attachments)}`);
  }
  for (let i = 0; i < attachments.length; i++) {
    const a: unknown = attachments[i]; // holes too
    if (typeof a !== "object" || a === null || Array.isArray(a)) {
      throw invalidArgument(`${name}[${i}]`, `expected an attachment object, got ${typeOf(a)}`);
    }
    const at = a as Record<string, unknown>;
    for (const k of ATTACHMENT_FIELDS) checkText(at[k], `${name}[${i}].${k}`);
    if (!isAbsent(at.data) && !(at.data instanceof Uint8Array)) {
      throw invalidArgument(`${name}[${i}].data`, `expected bytes (a Uint8Array or Buffer), got ${typeOf(at.data)}`);
    }
  }
}

/**
 * `s` with each lone surrogate replaced by U+FFFD (as Go's strings.ToValidUTF8
 * does), for text that must be sent whatever it holds: a tool's result.
 */
export function toValidText(s: string): string {
  return s.replace(new RegExp(LONE_SURROGATE.source, "gu"), "\uFFFD");
}

/**
 * The one check of the strings a call sends: absent, or a string protobuf can
 * encode as UTF-8. A lone surrogate (half of a pair, e.g. what `.slice()` leaves
 * when it cuts an emoji in two) is no Unicode text; grpc-js would send U+FFFD in
 * its place, and the sidecar would store text that differs from what was given.
 * So every public call refuses one up front with an InvalidArgument naming the
 * field in the caller's spelling (`sessionKey`, `source.chatId`,
 * `attachments[0].name`, `messages[1].content`), and sends nothing.
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

/**
 * A string field: absent (undefined, null), or a string protobuf can encode as
 * UTF-8; anything else is an InvalidArgument naming `field`.
 */
export function checkText(v: unknown, field: string): void {
  if (v === undefined || v === null) return;
  if (typeof v !== "string") throw invalidArgument(field, `expected a string, got ${typeOf(v)}`);
  const bad = LONE_SURROGATE.exec(v);
  if (bad) {
    throw invalidArgument(field, `has a lone surrogate at index ${bad.index} (not Unicode text; UTF-8 cannot carry it)`);
  }
}

/** {@link checkText} of each field, named by its key: `checkTexts({ sessionKey, reason })`. */
export function checkTexts(fields: Record<string, unknown>): void {
  for (const [field, v] of Object.entries(fields)) checkText(v, field);
}

/** The string fields of a generated message type (those whose default is ""). */
function stringFields(empty: object): readonly string[] {
  return Object.entries(empty)
    .filter(([, v]) => typeof v === "string")
    .map(([k]) => k);
}

const SOURCE_FIELDS = stringFields(SessionSource.fromPartial({}));
const ATTACHMENT_FIELDS = stringFields(Attachment.fromPartial({}));

/**
 * The string fields of a source (`source.chatId`, ...). Something that is no
 * object is left as before (SessionSource.fromPartial judges it).
 */
export function checkSource(source: unknown, name = "source"): void {
  if (typeof source !== "object" || source === null) return;
  const s = source as Record<string, unknown>;
  for (const k of SOURCE_FIELDS) checkText(s[k], `${name}.${k}`);
}

/** The string fields of each attachment (`attachments[0].mimeType`, ...); other shapes are left as before. */
export function checkAttachments(attachments: unknown, name = "attachments"): void {
  if (!Array.isArray(attachments)) return;
  attachments.forEach((a: unknown, i) => {
    if (typeof a !== "object" || a === null) return;
    const at = a as Record<string, unknown>;
    for (const k of ATTACHMENT_FIELDS) checkText(at[k], `${name}[${i}].${k}`);
  });
}

/**
 * `s` with each lone surrogate replaced by U+FFFD (as Go's strings.ToValidUTF8
 * does), for text that must be sent whatever it holds: a tool's result.
 */
export function toValidText(s: string): string {
  return s.replace(new RegExp(LONE_SURROGATE.source, "gu"), "\uFFFD");
}

/**
 * The transcript calls (seedSession, appendMessages, rewriteTranscript) check
 * every message field before sending: a bad one is an InvalidArgument naming
 * it (`messages[1].content`), raised here, with nothing sent. Before, grpc-js
 * coerced a number to text ("42"), replaced a lone surrogate with U+FFFD,
 * crashed on a null message, or failed with its own serialization message.
 * A recording grpc-js server shows what arrives.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { type Message, Session } from "../src/gen/agent_sidecar/v1/common";
import { SessionServiceService } from "../src/gen/agent_sidecar/v1/session_service";
import { namesField, serveForTests } from "./helpers";

const T = { timeout: 5000 };
const received: Message[][] = [];

/** Records the messages of each call that takes them. */
const record = (answer: object) => (call: { request: { messages: Message[] } }, cb: Function) => {
  received.push(call.request.messages);
  cb(null, answer);
};
const { client } = serveForTests([
  [SessionServiceService, {
    seedSession: record({ session: Session.fromPartial({ sessionId: "s1" }) }),
    appendMessages: record({ firstSeq: 1, lastSeq: 2 }),
    rewriteTranscript: record({}),
  } as any],
]);

/** The three calls that take messages, each sending `messages`. */
const calls: Array<[string, (messages: any) => Promise<unknown>]> = [
  ["seedSession", (messages) => client.seedSession({ sessionKey: "k", messages })],
  ["appendMessages", (messages) => client.appendMessages("s1", messages)],
  ["rewriteTranscript", (messages) => client.rewriteTranscript("s1", messages)],
];

const ok = { role: "user", content: "fine" };

/** A bad second message, and the field its error must name. */
const bad: Array<[unknown, string, RegExp]> = [
  [{ role: "user", content: 42 }, "messages[1].content", /expected a string, got number/],
  [{ role: "user", content: {} }, "messages[1].content", /expected a string, got object/],
  [{ role: "user", content: "a\ud800b" }, "messages[1].content", /lone surrogate at index 1/],
  [{ role: "tool", content: "x", toolCallId: "c\udc00" }, "messages[1].toolCallId", /lone surrogate/],
  [{ role: "tool", content: "x", toolName: 7 }, "messages[1].toolName", /expected a string/],
  [{ role: "assistant", toolCallsJson: "[\"\udfff\"]" }, "messages[1].toolCallsJson", /lone surrogate/],
  [{ role: "bogus", content: "x" }, "messages[1].role", /must be one of system, user, assistant, tool/],
  [{ content: "no role" }, "messages[1].role", /must be one of/],
  [{ role: 1, content: "x" }, "messages[1].role", /expected a string, got number/],
  [{ role: "user", seq: 1.5 }, "messages[1].seq", /not a safe integer/],
  [{ role: "user", seq: "3" }, "messages[1].seq", /expected an integer/],
  [{ role: "user", createdAt: new Date(NaN) }, "messages[1].createdAt", /Invalid Date/],
  [{ role: "user", createdAt: "2024-01-01" }, "messages[1].createdAt", /expected a Date, got string/],
  [{ role: "user", synthetic: "yes" }, "messages[1].synthetic", /expected a boolean/],
  [null, "messages[1]", /expected a message object, got null/],
  ["hi", "messages[1]", /expected a message object, got string/],
];

test("a bad message field is an InvalidArgument naming it, and nothing is sent", T, async () => {
  for (const [name, send] of calls) {
    for (const [message, field, why] of bad) {
      await assert.rejects(send([ok, message]), namesField(field, why, `${name} ${field}`));
    }
  }
  assert.deepEqual(received, []);
});

test("messages that are not an array, or have a hole, are refused naming them", T, async () => {
  for (const [, send] of calls) {
    for (const [messages, field] of [[undefined, "messages"], [{ 0: ok }, "messages"], [[ok, , ok], "messages[1]"]] as const) {
      await assert.rejects(send(messages), namesField(field));
    }
  }
  assert.deepEqual(received, []);
});

test("good messages are sent as given: every role, pairs of surrogates, absent fields as empty", T, async () => {
  const at = new Date("2024-05-01T00:00:00Z");
  const messages = [
    { role: "system", content: "be brief" },
    { role: "user", content: "emoji 😀 ok", createdAt: at },
    { role: "assistant", content: "", toolCallsJson: "[]", toolCallId: undefined },
    { role: "tool", content: "1", toolCallId: "c1", toolName: "t.x", seq: 0, active: false, synthetic: true },
  ];
  for (const [, send] of calls) await send(messages);
  assert.equal(received.length, 3);
  for (const got of received) {
    assert.deepEqual(got.map((m) => m.role), ["system", "user", "assistant", "tool"]);
    assert.equal(got[1].content, "emoji 😀 ok");
    assert.equal(got[1].createdAt?.getTime(), at.getTime());
    assert.equal(got[2].toolCallId, "");
    assert.equal(got[3].synthetic, true);
  }
});

/**
 * Every string a public call sends is checked before sending: one holding a
 * lone surrogate (half of a pair, e.g. an emoji cut by `.slice()`; UTF-8 cannot
 * carry it) is an InvalidArgument naming the field in the caller's spelling,
 * and nothing is sent. Before, only the messages were checked: grpc-js sent
 * every other string with U+FFFD in place of the surrogate, so the sidecar
 * stored text that differed from what was given. Real Unicode passes as is.
 * A recording grpc-js server shows what arrives.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { connect, type SidecarClient } from "../src/client";
import type { ServeToolsRequest, ToolInvocationResult } from "../src/gen/agent_sidecar/v1/tool_service";
import { ToolHost } from "../src/tools";
import { namesField, recordingSidecar, SESSION_ARGS, toolStandIn } from "./helpers";

const T = { timeout: 10_000 };
const BAD = "a\ud800b";
/** ServeTools: confirms the registration, then invokes each tool once (invocation id: its name); records the results. */
const tools = toolStandIn((toolNames) => toolNames.map((name) => [name, name]));
/** `received`: what the sidecar received, [method, request]. */
const { client, target, received } = recordingSidecar(tools);

type Send = (s: string, c: SidecarClient) => unknown;

/** Promise calls: [field named, call sending `s` in that field]. */
const UNARY: Array<[string, Send]> = [
  ["source.platform", (s, c) => c.getOrCreateSession({ platform: s })],
  ["profile", (s, c) => c.getOrCreateSession({ platform: "p" }, { profile: s })],
  ["sessionKey", (s, c) => c.getSession({ sessionKey: s })],
  ["sessionId", (s, c) => c.getSession({ sessionId: s })],
  ["platform", (s, c) => c.listSessions({ platform: s })],
  ["pageToken", (s, c) => c.listSessions({ pageToken: s })],
  ["displayName", (s, c) => c.resetSession("k", { displayName: s })],
  ...SESSION_ARGS,
  ["source.userName", (s, c) => c.seedSession({ source: { platform: "p", userName: s }, messages: [] })],
  ["sessionKey", (s, c) => c.seedSession({ sessionKey: s, messages: [] })],
  ["profile", (s, c) => c.seedSession({ sessionKey: "k", messages: [], profile: s })],
  ["messages[0].content", (s, c) => c.seedSession({ sessionKey: "k", messages: [{ role: "user", content: s }] })],
  ["sessionId", (s, c) => c.getTranscript(s)],
  ["pageToken", (s, c) => c.getTranscript("i", { pageToken: s })],
  ["sessionId", (s, c) => c.appendMessages(s, [])],
  ["messages[0].toolName", (s, c) => c.appendMessages("i", [{ role: "tool", toolName: s }])],
  ["sessionId", (s, c) => c.rewriteTranscript(s, [])],
  ["sessionId", (s, c) => c.rewindSession(s)],
  ["query", (s, c) => c.searchMessages(s)],
  ["sessionKey", (s, c) => c.searchMessages("q", { sessionKey: s })],
  ["sessionKey", (s, c) => c.updateUsage(s, {})],
  ["costStatus", (s, c) => c.updateUsage("k", {}, { costStatus: s })],
  ["source.chatId", (s, c) => c.getSessionContext({ platform: "p", chatId: s })],
  ["profile", (s, c) => c.getSessionContext({ platform: "p" }, { profile: s })],
  ["sessionKey", (s, c) => c.cancel({ sessionKey: s })],
  ["requestId", (s, c) => c.cancel({ requestId: s })],
  ["sessionKey", (s, c) => c.getQueue(s)],
];

/** Every string field of a source, through getOrCreateSession. */
const SOURCE_FIELDS = ["platform", "chatId", "chatName", "chatType", "userId", "userName", "threadId", "chatTopic",
  "userIdAlt", "chatIdAlt", "guildId", "parentChatId", "messageId"];
for (const k of SOURCE_FIELDS.slice(1)) {
  UNARY.push([`source.${k}`, (s, c) => c.getOrCreateSession({ platform: "p", [k]: s })]);
}

/** The streams, which throw at the call like their other argument errors. */
const STREAMS: Array<[string, Send]> = [
  ["text", (s, c) => c.prompt({ sessionKey: "k", text: s })],
  ["sessionKey", (s, c) => c.prompt({ sessionKey: s, text: "t" })],
  ["requestId", (s, c) => c.prompt({ sessionKey: "k", text: "t", requestId: s })],
  ["profile", (s, c) => c.prompt({ source: { platform: "p" }, text: "t", profile: s })],
  ["source.chatId", (s, c) => c.prompt({ source: { platform: "p", chatId: s }, text: "t" })],
  ["source.messageId", (s, c) => c.prompt({ source: { platform: "p", messageId: s }, text: "t" })],
  ["attachments[1].name", (s, c) => c.prompt({ sessionKey: "k", text: "t", attachments: [att(), att({ name: s })] })],
  ["attachments[1].mimeType", (s, c) =>
    c.prompt({ sessionKey: "k", text: "t", attachments: [att(), att({ mimeType: s })] })],
  ["attachments[0].url", (s, c) => c.prompt({ sessionKey: "k", text: "t", attachments: [att({ url: s })] })],
  ["requestId", (s, c) => c.watch({ requestId: s })],
  ["sessionKey", (s, c) => c.watch({ sessionKey: s })],
  ["platform", (s, c) => c.watch({ platform: s })],
];

function att(o: object = {}) {
  return { name: "n", mimeType: "text/plain", data: Buffer.from("x"), url: "", ...o };
}

const LONE = /^[^:]+: has a lone surrogate at index 1 \(not Unicode text; UTF-8 cannot carry it\)$/;

test("a promise call rejects a lone surrogate in any string field, naming it, and sends nothing", T, async () => {
  for (const [i, [field, send]] of UNARY.entries()) {
    let p: unknown;
    assert.doesNotThrow(() => (p = send(BAD, client)), `${i} ${field}: rejects, does not throw`);
    await assert.rejects(p as Promise<unknown>, namesField(field, LONE, `${i} ${field}`));
  }
  assert.deepEqual(received, []);
});

test("prompt and watch throw on a lone surrogate in any string field, naming it, and send nothing", T, async () => {
  for (const [i, [field, send]] of STREAMS.entries()) {
    assert.throws(() => send(BAD, client), namesField(field, LONE, `${i} ${field}`));
  }
  assert.deepEqual(received, []);
});

test("an emoji cut in half by .slice(), a lone low surrogate, or a number is refused too", T, async () => {
  const cut = "ok 😀".slice(0, 4); // "ok \ud83d"
  await assert.rejects(client.resetSession(cut), namesField("sessionKey", /lone surrogate at index 3/, "cut"));
  assert.throws(() => client.prompt({ sessionKey: "k", text: "\udc00x" }), namesField("text", /at index 0/, "low"));
  const notString = (field: string, type: string) => namesField(field, new RegExp(`expected a string, got ${type}$`), type);
  await assert.rejects(client.getSession({ sessionKey: 42 as any }), notString("sessionKey", "number"));
  assert.throws(() => client.watch({ platform: {} as any }), notString("platform", "object"));
  assert.deepEqual(received, []);
});

const UNICODE = "é 日本語 😀 \u{10FFFF} \uFFFD";

/** Every string in `request`, nested ones included, as received. */
function strings(request: unknown): string[] {
  if (typeof request === "string") return [request];
  if (!request || typeof request !== "object" || Buffer.isBuffer(request) || request instanceof Date) return [];
  return Object.values(request).flatMap(strings);
}

test("real Unicode (accents, CJK, emoji, U+10FFFF, U+FFFD) in every field is sent untouched", T, async () => {
  for (const [i, [field, send]] of UNARY.entries()) {
    received.length = 0;
    await Promise.resolve(send(UNICODE, client)).catch(() => {}); // an empty answer may lack a session
    assert.equal(received.length, 1, `${i} ${field} was not sent`);
    assert.ok(strings(received[0][1]).includes(UNICODE), `${i} ${field}: ${JSON.stringify(received[0][1])}`);
  }
  for (const [i, [field, send]] of STREAMS.entries()) {
    received.length = 0;
    await (send(UNICODE, client) as { collect(): Promise<unknown> }).collect();
    assert.equal(received.length, 1, `${i} ${field} was not sent`);
    assert.ok(strings(received[0][1]).includes(UNICODE), `${i} ${field}: ${JSON.stringify(received[0][1])}`);
  }
});

test("ToolHost refuses a lone surrogate in its namespace, a tool's name, description or schema text", T, () => {
  assert.throws(() => new ToolHost(BAD), namesField("namespace", LONE, "namespace"));
  const host = new ToolHost("ns");
  assert.throws(() => host.tool(BAD, "d", {}, () => 1), namesField("name", LONE, "name"));
  assert.throws(() => host.tool("x", BAD, {}, () => 1), namesField("description", LONE, "description"));
  const schema = `{"description":"${BAD}"}`;
  assert.throws(() => host.tool("x", "d", schema, () => 1), namesField("schema", /lone surrogate at index 17/, "schema"));
  assert.deepEqual(host.toolNames, []);
  host.tool("ns.ok", "日本語 😀 \u{10FFFF}", { description: BAD }, () => 1); // an object goes as JSON, escaped
  assert.deepEqual(host.toolNames, ["ns.ok"]);
});

test("ToolHost: a result with a lone surrogate is not refused but sent, with U+FFFD in its place", T, async () => {
  const c = connect(target);
  const written: ToolInvocationResult[] = [];
  const open = c.serveTools.bind(c);
  c.serveTools = () => {
    const call = open();
    const write = call.write.bind(call);
    call.write = ((msg: ServeToolsRequest, ...rest: any[]) => {
      if (msg.message?.$case === "result") written.push(msg.message.value);
      return (write as Function)(msg, ...rest);
    }) as typeof call.write;
    return call;
  };
  const host = new ToolHost("t");
  host.tool("t.fails", "d", {}, () => {
    throw new Error("cannot open " + "ok 😀".slice(0, 4));
  });
  host.tool("t.text", "d", {}, () => "日本語 😀 \u{10FFFF} " + BAD);
  try {
    await host.serve(c);
    for (let i = 0; i < 400 && tools.results.length < 2; i++) await new Promise((r) => setTimeout(r, 5));
  } finally {
    host.close();
    c.close();
  }
  const byId = (rs: ToolInvocationResult[], id: string) => rs.find((r) => r.invocationId === id);
  for (const rs of [written, tools.results]) {
    assert.equal(byId(rs, "t.fails")?.ok, false);
    assert.equal(byId(rs, "t.fails")?.error, "cannot open ok \uFFFD"); // what is handed to grpc-js, and what arrives
    assert.equal(byId(rs, "t.text")?.ok, true);
    assert.equal(JSON.parse(byId(rs, "t.text")!.resultJson), "日本語 😀 \u{10FFFF} " + BAD); // JSON escapes it
  }
});

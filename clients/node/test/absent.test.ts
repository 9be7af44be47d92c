/**
 * undefined and null, what JavaScript passes for "not given" (a photo message's
 * `msg.text`, a missing option), never go out as text. The generated encoder
 * writes any string field that is not "": before, undefined went out as the
 * TEXT "undefined" and null as "null" (`resetSession(undefined)` acted on a
 * session key "undefined", a prompt's missing text became the user's words
 * "undefined"), an undefined usage count failed serialization, an undefined
 * cost went out as NaN, and a null options object crashed the call.
 *
 * Now a required argument (the proto's "Required") given as undefined or null
 * is an InvalidArgument naming it, raised the way the call raises its other
 * argument errors, and nothing is sent; an optional one arrives as the proto
 * default ("", 0, false, no message). A recording grpc-js server shows what arrives.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { connect } from "../src/client";
import { DeliveryMode } from "../src/gen/agent_sidecar/v1/prompt_service";
import { ToolHost } from "../src/tools";
import { namesField, recordingSidecar, SESSION_ARGS, type Send, toolStandIn } from "./helpers";

const T = { timeout: 10_000 };
const ABSENT = [undefined, null] as const;
/** ServeTools: records each registration and confirms it. */
const tools = toolStandIn();
/** `received`: what the sidecar received, [method, request]. */
const { client, target, received } = recordingSidecar(tools);

/** `field: is required (got undefined)` (or null). */
const isRequired = (field: string, v: unknown, label: string) =>
  namesField(field, new RegExp(`^${field.replace(/[.[\]]/g, "\\$&")}: is required \\(got ${v}\\)$`), label);

/** Promise calls: [field named, call giving `v` for a required argument]. */
const REQUIRED: Array<[string, Send]> = [
  ["source", (v, c) => c.getOrCreateSession(v)],
  ["source.platform", (v, c) => c.getOrCreateSession({ platform: v, chatId: "c" })],
  ...SESSION_ARGS,
  ["source.platform", (v, c) => c.seedSession({ source: { platform: v }, messages: [] })],
  ["messages", (v, c) => c.seedSession({ sessionKey: "k", messages: v })],
  ["sessionId", (v, c) => c.getTranscript(v)],
  ["sessionId", (v, c) => c.appendMessages(v, [])],
  ["messages", (v, c) => c.appendMessages("i", v)],
  ["sessionId", (v, c) => c.rewriteTranscript(v, [])],
  ["messages", (v, c) => c.rewriteTranscript("i", v)],
  ["sessionId", (v, c) => c.rewindSession(v)],
  ["query", (v, c) => c.searchMessages(v)],
  ["sessionKey", (v, c) => c.updateUsage(v, {})],
  ["maxAgeDays", (v, c) => c.pruneSessions(v)],
  ["source", (v, c) => c.getSessionContext(v)],
  ["source.platform", (v, c) => c.getSessionContext({ platform: v })],
  ["sessionKey", (v, c) => c.getQueue(v)],
];

test("a promise call rejects a required argument given as undefined or null, naming it, and sends nothing", T,
  async () => {
    for (const v of ABSENT) {
      for (const [i, [field, send]] of REQUIRED.entries()) {
        let p: unknown;
        assert.doesNotThrow(() => (p = send(v, client)), `${i} ${field} ${v}: rejects, does not throw`);
        await assert.rejects(p as Promise<unknown>, isRequired(field, v, `${i} ${field} ${v}`));
      }
    }
    assert.deepEqual(received, []);
  });

/** Calls that need one of some fields: [first field, the rule's text, call giving `v` for each]. */
const ONE_OF: Array<[string, string, Send]> = [
  ["sessionKey", "one of sessionKey and sessionId is required \\(got neither\\)",
    (v, c) => c.getSession({ sessionKey: v, sessionId: v })],
  ["sessionKey", "one of sessionKey and sessionId", (v, c) => c.getSession(v)],
  ["source", "one of source and sessionKey is required \\(got neither\\)",
    (v, c) => c.seedSession({ source: v, sessionKey: v, messages: [] })],
  ["sessionKey", "one of sessionKey and requestId is required \\(got neither\\)",
    (v, c) => c.cancel({ sessionKey: v, requestId: v })],
  ["sessionKey", "one of sessionKey and requestId", (v, c) => c.cancel(v)],
];

test("a promise call that needs one of some fields rejects when none is given, naming the first", T, async () => {
  for (const v of ABSENT) {
    for (const [i, [field, rule, send]] of ONE_OF.entries()) {
      await assert.rejects(send(v, client) as Promise<unknown>, namesField(field, new RegExp(`^${field}: ${rule}`), `${i} ${v}`));
    }
  }
  assert.deepEqual(received, []);
});

test("prompt and watch throw on a required argument given as undefined or null, naming it, sending nothing", T, () => {
  for (const v of ABSENT) {
    const at = (field: string) => isRequired(field, v, `${field} ${v}`);
    assert.throws(() => client.prompt({ sessionKey: "k", text: v as any }), at("text"));
    assert.throws(() => client.prompt(v as any), isRequired("text", undefined, `no options ${v}`)); // none given
    assert.throws(() => client.prompt({ source: { platform: v as any }, text: "t" }), at("source.platform"));
    const neither = namesField("source", /^source: one of source and sessionKey is required \(got neither\)$/, `${v}`);
    assert.throws(() => client.prompt({ source: v as any, sessionKey: v as any, text: "t" }), neither);
    const none = namesField("requestId", /^requestId: one of requestId, sessionKey and platform is required \(got none\)$/, "w");
    assert.throws(() => client.watch({ requestId: v as any, sessionKey: v as any, platform: v as any }), none);
    assert.throws(() => client.watch(v as any), none);
  }
  assert.deepEqual(received, []);
});

test("ToolHost refuses a namespace, tool name or client given as undefined or null, naming it", T, async () => {
  for (const v of ABSENT) {
    assert.throws(() => new ToolHost(v as any), isRequired("namespace", v, `namespace ${v}`));
    const host = new ToolHost("ns");
    assert.throws(() => host.tool(v as any, "d", {}, () => 1), isRequired("name", v, `name ${v}`));
    assert.throws(() => host.serve(v as any), isRequired("client", v, `client ${v}`));
    assert.deepEqual(host.toolNames, []);
  }
  await new Promise((r) => setTimeout(r, 20));
  assert.deepEqual(tools.registrations, []);
});

/** The one request a call sent (after it settled). */
async function sent(call: unknown, label: string): Promise<any> {
  received.length = 0;
  if (call && typeof (call as { collect?: unknown }).collect === "function") {
    await (call as { collect(): Promise<unknown> }).collect();
  } else {
    await Promise.resolve(call).catch(() => {}); // an empty answer may lack a session
  }
  assert.equal(received.length, 1, `${label}: was not sent`);
  return received[0][1];
}

/** Optional arguments given `v`: [label, call, what must have arrived]. */
const OPTIONAL: Array<[string, Send, (r: any) => void]> = [
  ["getOrCreateSession opts", (v, c) => c.getOrCreateSession({ platform: "p" }, v), (r) => {
    assert.equal(r.profile, "");
    assert.equal(r.forceNew, false);
  }],
  ["getOrCreateSession source fields", (v, c) => c.getOrCreateSession({ platform: "p", chatId: v, isBot: v }, {
    profile: v, forceNew: v }), (r) => {
    assert.deepEqual([r.source.platform, r.source.chatId, r.source.isBot, r.profile, r.forceNew], ["p", "", false, "", false]);
  }],
  ["getSession sessionId", (v, c) => c.getSession({ sessionKey: "k", sessionId: v }), (r) => {
    assert.deepEqual([r.sessionKey, r.sessionId], ["k", ""]);
  }],
  ["listSessions opts", (v, c) => c.listSessions(v), (r) => assert.equal(r.pageToken, "")],
  ["listSessions fields", (v, c) => c.listSessions({ platform: v, activeWithinSeconds: v, pageSize: v, pageToken: v }),
    (r) => assert.deepEqual([r.platform, r.activeWithinSeconds, r.pageSize, r.pageToken], ["", 0, 0, ""])],
  ["resetSession displayName", (v, c) => c.resetSession("k", { displayName: v }), (r) => {
    assert.deepEqual([r.sessionKey, r.displayName], ["k", ""]);
  }],
  ["resetSession opts", (v, c) => c.resetSession("k", v), (r) => assert.equal(r.displayName, "")],
  ["seedSession source, profile, message fields", (v, c) => c.seedSession({ sessionKey: "k", source: v, profile: v,
    messages: [{ role: "user", content: v, toolName: v, createdAt: v, seq: v, active: v }] }), (r) => {
    assert.deepEqual([r.sessionKey, r.source, r.profile], ["k", undefined, ""]);
    assert.deepEqual([r.messages[0].content, r.messages[0].toolName, r.messages[0].seq], ["", "", 0]);
  }],
  ["seedSession sessionKey", (v, c) => c.seedSession({ source: { platform: "p" }, sessionKey: v, messages: [] }),
    (r) => assert.deepEqual([r.source.platform, r.sessionKey], ["p", ""])],
  ["getTranscript opts", (v, c) => c.getTranscript("i", v), (r) => assert.deepEqual([r.sessionId, r.pageToken], ["i", ""])],
  ["getTranscript fields", (v, c) => c.getTranscript("i", { includeRewound: v, pageSize: v, pageToken: v }),
    (r) => assert.deepEqual([r.includeRewound, r.pageSize, r.pageToken], [false, 0, ""])],
  ["rewindSession n (1, the default)", (v, c) => c.rewindSession("i", v), (r) => assert.equal(r.n, 1)],
  ["searchMessages opts", (v, c) => c.searchMessages("q", v), (r) => assert.deepEqual([r.sessionKey, r.limit], ["", 0])],
  ["searchMessages fields", (v, c) => c.searchMessages("q", { sessionKey: v, limit: v }),
    (r) => assert.deepEqual([r.query, r.sessionKey, r.limit], ["q", "", 0])],
  ["updateUsage delta counts and cost", (v, c) => c.updateUsage("k", { inputTokens: v, outputTokens: 3, costUsd: v }),
    (r) => assert.deepEqual([r.delta.inputTokens, r.delta.outputTokens, r.delta.costUsd], [0, 3, 0])],
  ["updateUsage delta and opts", (v, c) => c.updateUsage("k", v, v), (r) => {
    assert.equal(r.costStatus, "");
    assert.equal(r.lastPromptTokens, 0);
    assert.ok(!r.delta || r.delta.costUsd === 0, JSON.stringify(r.delta));
  }],
  ["updateUsage opts fields", (v, c) => c.updateUsage("k", {}, { lastPromptTokens: v, costStatus: v }),
    (r) => assert.deepEqual([r.lastPromptTokens, r.costStatus], [0, ""])],
  ["getSessionContext opts", (v, c) => c.getSessionContext({ platform: "p" }, v), (r) => assert.equal(r.profile, "")],
  ["getSessionContext profile", (v, c) => c.getSessionContext({ platform: "p" }, { profile: v }),
    (r) => assert.equal(r.profile, "")],
  ["cancel requestId", (v, c) => c.cancel({ sessionKey: "k", requestId: v }),
    (r) => assert.deepEqual([r.sessionKey, r.requestId], ["k", ""])],
  ["prompt options", (v, c) => c.prompt({ sessionKey: "k", text: "t", requestId: v, source: v, profile: v,
    attachments: v, delivery: v, deadline: v, signal: v, resume: v }), (r) => {
    assert.match(r.requestId, /^[0-9a-f-]{36}$/);
    assert.deepEqual([r.source, r.profile, r.attachments, r.delivery], [undefined, "", [], DeliveryMode.UNSPECIFIED]);
  }],
  ["prompt sessionKey and source fields", (v, c) => c.prompt({ source: { platform: "p", chatId: v, isBot: v },
    sessionKey: v, text: "t" }), (r) => {
    assert.deepEqual([r.sessionKey, r.source.platform, r.source.chatId, r.source.isBot], ["", "p", "", false]);
  }],
  ["prompt attachment fields", (v, c) => c.prompt({ sessionKey: "k", text: "t",
    attachments: [{ name: v, mimeType: v, data: v, url: v }] }), (r) => {
    const a = r.attachments[0];
    assert.deepEqual([a.name, a.mimeType, a.data.length, a.url], ["", "", 0, ""]);
  }],
  ["watch fields", (v, c) => c.watch({ sessionKey: "k", requestId: v, platform: v, afterSeq: v, afterCursor: v }),
    (r) => assert.deepEqual([r.requestId, r.sessionKey, r.platform, r.afterSeq, r.afterCursor], ["", "k", "", 0, 0])],
  ["watch by request", (v, c) => c.watch({ requestId: "r", sessionKey: v, platform: v }),
    (r) => assert.deepEqual([r.requestId, r.sessionKey, r.platform], ["r", "", ""])],
];

test("optional arguments given as undefined or null arrive as the proto default, not 'undefined', 'null' or NaN", T,
  async () => {
    for (const v of ABSENT) {
      for (const [label, send, check] of OPTIONAL) {
        const r = await sent(send(v, client), `${label} ${v}`);
        assert.ok(!JSON.stringify(r).match(/"(undefined|null)"|NaN/), `${label} ${v}: ${JSON.stringify(r)}`);
        check(r);
      }
    }
  });

test("ToolHost: a tool's description and schema given as undefined or null register empty; null options are none", T,
  async () => {
    for (const v of ABSENT) {
      const host = new ToolHost("ns");
      host.tool("ns.x", v as any, v as any, () => 1);
      try {
        assert.deepEqual(await host.serve(client, v as any), ["ns.x"]);
      } finally {
        host.close();
      }
      const spec = tools.registrations.at(-1)?.tools[0];
      assert.deepEqual([spec?.name, spec?.description, spec?.parametersJsonSchema], ["ns.x", "", ""], `${v}`);
    }
  });

test("an attachment that is no object, or data that is no bytes, is refused naming it; connect takes null options", T,
  () => {
    const att = (attachments: any) => () => client.prompt({ sessionKey: "k", text: "t", attachments });
    for (const v of ABSENT) {
      assert.throws(att([v]), namesField("attachments[0]", /expected an attachment object, got (undefined|null)$/, `${v}`));
    }
    assert.throws(att("photo.png"), namesField("attachments", /expected an array of attachments, got string$/, "str"));
    assert.throws(att([{ name: "a", data: "aGk=" }]), namesField("attachments[0].data", /expected bytes/, "data"));
    assert.deepEqual(received, []);
    connect(target, null).close();
  });

test("a bool given as a string is refused naming it, not sent as true", T, async () => {
  const bool = (field: string) => namesField(field, /expected a boolean, got string$/, field);
  await assert.rejects(client.getOrCreateSession({ platform: "p" }, { forceNew: "false" as any }), bool("forceNew"));
  await assert.rejects(client.getOrCreateSession({ platform: "p", isBot: "no" as any }), bool("source.isBot"));
  await assert.rejects(client.getTranscript("i", { includeRewound: "false" as any }), bool("includeRewound"));
  assert.deepEqual(received, []);
});

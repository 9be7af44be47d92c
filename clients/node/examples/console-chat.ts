#!/usr/bin/env node
/**
 * Console chat: a tiny agent-sidecar adapter. Reads lines from stdin, sends each
 * as a prompt for a `local` DM session named after the OS user, and streams the
 * reply. Hosts one tool, `local.clock.now`.
 *
 *     node dist/examples/console-chat.js [--target unix:./data/sidecar.sock] [--token T] [--ca CA.pem] [--profile main]
 *
 * Commands: /new and /reset (fresh session), /stop (cancel the turn and suspend),
 * /queue TEXT (run after the current turn, in order), /undo (rewind one user
 * turn), /help, /quit. A plain line while a turn runs is a follow-up.
 */
import { userInfo } from "node:os";
import { createInterface } from "node:readline";
import { parseArgs } from "node:util";
import {
  connect,
  frameKind,
  SidecarError,
  ToolHost,
  type ActivityFrame,
  type Delivery,
  type SidecarClient,
  type SourceInput,
} from "../src/index";

const HELP = `commands: /new, /reset, /stop, /queue TEXT, /undo, /help, /quit`;

function say(line: string): void {
  process.stdout.write(line + "\n");
}

function explain(err: unknown): string {
  if (!(err instanceof SidecarError)) return String(err);
  return `${err.name} (${err.reason || err.codeName}): ${err.message}`;
}

/** Render one frame to stdout. */
function render(f: ActivityFrame): void {
  const e = f.event;
  switch (e?.$case) {
    case "accepted":
      if (e.value.queuePosition > 0) say(`(queued at position ${e.value.queuePosition})`);
      break;
    case "textDelta":
      process.stdout.write(e.value.text);
      break;
    case "toolCall":
      say(`\n[tool ${e.value.name} ${e.value.argumentsJson}]`);
      break;
    case "toolResult":
      say(`[${e.value.ok ? "ok" : "error"} ${e.value.resultJson}]`);
      break;
    case "completed":
      process.stdout.write("\n");
      break;
    case "superseded":
      say(`\n(superseded by a newer message)`);
      break;
    default:
      break; // accepted at once, started, usage, failed (reported by the thrown error)
  }
}

/** Run one turn to its end, printing as it streams. */
async function turn(client: SidecarClient, source: SourceInput, profile: string, text: string, delivery?: Delivery) {
  try {
    for await (const f of client.prompt({ source, profile, text, delivery })) {
      if (frameKind(f) !== "started") render(f);
    }
  } catch (err) {
    say(`\n! ${explain(err)}`);
  }
}

/** Host `local.clock.now`; keep chatting without it when the sidecar has no ToolService. */
async function hostTools(client: SidecarClient): Promise<ToolHost | undefined> {
  const host = new ToolHost("local");
  host.tool(
    "local.clock.now",
    "The current local date and time (ISO 8601) and the time zone of the user's machine.",
    { type: "object", properties: {}, additionalProperties: false },
    () => ({
      now: new Date().toISOString(),
      local: new Date().toString(),
      time_zone: Intl.DateTimeFormat().resolvedOptions().timeZone,
    }),
  );
  try {
    await host.serve(client);
    return host;
  } catch (err) {
    say(`(tool host not available: ${explain(err)})`);
    return undefined;
  }
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      target: { type: "string", default: "unix:./data/sidecar.sock" },
      token: { type: "string" },
      ca: { type: "string" },
      profile: { type: "string", default: "main" },
    },
  });
  const profile = values.profile!;
  const client = connect(values.target!, { token: values.token, caFile: values.ca });
  await client.ready(5000);
  const me = userInfo();
  const source: SourceInput = {
    platform: "local",
    chatType: "dm",
    chatId: me.username,
    userId: String(me.uid),
    userName: me.username,
  };
  const host = await hostTools(client);
  let session = await client.getOrCreateSession(source, { profile });
  say(`session ${session.sessionKey} (${session.sessionId}). ${HELP}`);

  const running = new Set<Promise<void>>();
  const track = (p: Promise<void>) => {
    running.add(p);
    void p.finally(() => running.delete(p));
  };
  const interactive = process.stdin.isTTY === true;
  const rl = createInterface({ input: process.stdin, output: process.stdout, terminal: interactive });
  rl.setPrompt(interactive ? "> " : "");
  rl.prompt();
  for await (const raw of rl) {
    const line = raw.trim();
    try {
      if (line === "") {
        // nothing to send
      } else if (line === "/quit" || line === "/exit") {
        break;
      } else if (line === "/help") {
        say(HELP);
      } else if (line === "/new" || line === "/reset") {
        session = await client.resetSession(session.sessionKey);
        say(`(new session ${session.sessionId})`);
      } else if (line === "/stop") {
        session = await client.suspendSession(session.sessionKey);
        say("(stopped; the next message starts a new session)");
      } else if (line.startsWith("/queue")) {
        const text = line.slice("/queue".length).trim();
        if (!text) say("usage: /queue TEXT");
        else track(turn(client, source, profile, text, "queue"));
      } else if (line === "/undo") {
        session = await client.getSession({ sessionKey: session.sessionKey });
        const r = await client.rewindSession(session.sessionId, 1);
        say(r.turnsUndone > 0 ? `(undid ${r.turnsUndone} turn: "${r.targetText}")` : "(nothing to undo)");
      } else if (line.startsWith("/")) {
        say(`unknown command. ${HELP}`);
      } else if (interactive) {
        track(turn(client, source, profile, line)); // keep reading: /stop or a follow-up may come
      } else {
        await turn(client, source, profile, line); // piped input: one turn after the other
      }
    } catch (err) {
      say(`! ${explain(err)}`);
    }
    rl.prompt();
  }
  rl.close();
  await Promise.all(running);
  host?.close();
  client.close();
}

main().catch((err) => {
  process.stderr.write(`console-chat: ${explain(err)}\n`);
  process.exit(1);
});

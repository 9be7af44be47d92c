/**
 * A ToolHost that cannot reach its sidecar: it keeps retrying a refused
 * connection (an adapter may start before its sidecar), reporting each failed
 * attempt, and stops on a TLS failure (a wrong CA, no client certificate for
 * an mTLS listener), which no wait mends.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { status as GrpcCode } from "@grpc/grpc-js";
import { connect } from "../src/client";
import { SidecarError } from "../src/errors";
import { ToolHost } from "../src/tools";
import { FakeSidecar } from "./fake-sidecar";
import { type Certs, makeCerts } from "./helpers";

const T = { timeout: 20_000 };
const dir = mkdtempSync(join(tmpdir(), "toolhost-retry-"));
const certs: Certs | undefined = makeCerts(dir);
const fake = new FakeSidecar(certs);

before(async () => {
  if (certs) await fake.start();
});
after(async () => {
  if (certs) await fake.stop();
  rmSync(dir, { recursive: true, force: true });
});

test("a host with nobody listening keeps retrying and reports every attempt with its error", T, async () => {
  const client = connect(`unix:${join(dir, "nobody.sock")}`);
  const host = new ToolHost("t").tool("echo", "", {}, () => "ok");
  const seen: Array<[number, SidecarError]> = [];
  let second!: () => void;
  const twice = new Promise<void>((r) => (second = r));
  const serving = host.serve(client, {
    maxBackoffMs: 50,
    onRetry: (err, attempt) => {
      seen.push([attempt, err]);
      if (attempt === 2) second();
    },
  });
  await twice;
  host.close();
  assert.deepEqual(await serving, []);
  client.close();
  assert.deepEqual(seen.slice(0, 2).map(([n]) => n), [1, 2]);
  for (const [, err] of seen) assert.equal(err.code, GrpcCode.UNAVAILABLE);
});

test("close() ends the wait between attempts at once: serve() resolves with []", T, async (t) => {
  // The clock is the test's and never moves: a wait close() did not end would never end.
  t.mock.timers.enable({ apis: ["setTimeout"] });
  const client = connect(`unix:${join(dir, "nobody.sock")}`);
  const host = new ToolHost("t").tool("echo", "", {}, () => "ok");
  try {
    const serving = host.serve(client, { onRetry: (_, attempt) => attempt === 1 && host.close() });
    assert.deepEqual(await serving, []);
    await host.wait();
  } finally {
    client.close();
  }
});

test("without onRetry the host warns of its first failed attempt, with the error", T, async () => {
  const client = connect(`unix:${join(dir, "nobody.sock")}`);
  const host = new ToolHost("quiet").tool("echo", "", {}, () => "ok");
  const warn = console.warn;
  let line!: (s: string) => void;
  const warned = new Promise<string>((r) => (line = r));
  console.warn = (...args: unknown[]) => line(args.join(" "));
  try {
    const serving = host.serve(client, { maxBackoffMs: 50 });
    const text = await warned;
    host.close();
    await serving;
    assert.match(text, /ToolHost "quiet": ServeTools failed \(attempt 1\), retrying: /);
  } finally {
    console.warn = warn;
    client.close();
  }
});

test("a TLS failure ends serve() with the error instead of retrying", { ...T, skip: !certs && "needs openssl" }, async () => {
  for (const [name, target, opts] of [
    ["wrong CA", fake.tlsTarget, { caFile: certs!.otherCa }],
    ["no client certificate", fake.mtlsTarget, { caFile: certs!.ca }],
  ] as const) {
    const client = connect(target, { ...opts, token: fake.token });
    const host = new ToolHost("t").tool("echo", "", {}, () => "ok");
    const retries: string[] = [];
    try {
      await assert.rejects(host.serve(client, { onRetry: (e) => retries.push(e.message) }), (e: unknown) => {
        assert.ok(e instanceof SidecarError && e.code === GrpcCode.UNAVAILABLE, `${name}: ${e}`);
        return true;
      });
      assert.deepEqual(retries, [], name);
    } finally {
      client.close();
    }
  }
  // The right CA: it registers.
  const client = connect(fake.tlsTarget, { caFile: certs!.ca, token: fake.token });
  const host = new ToolHost("conf.node").tool("add", "", {}, () => 5);
  await host.serve(client);
  host.close();
  client.close();
});

test("a connection closed at setup is an outage: the host retries it, with TLS or without", { ...T, skip: !certs && "needs openssl" }, async () => {
  // A proxy whose sidecar is down (Docker's port forwarding, say): it accepts
  // and closes every connection. Over TLS, Node words it "Client network socket
  // disconnected before secure TLS connection was established" (or ECONNRESET),
  // which the host took for a TLS failure and stopped with, for good.
  const closer = createServer((socket) => socket.destroy());
  await new Promise<void>((resolve) => closer.listen(0, "127.0.0.1", resolve));
  const target = `127.0.0.1:${(closer.address() as { port: number }).port}`;
  try {
    for (const opts of [{ caFile: certs!.ca }, {}]) {
      const client = connect(target, opts);
      const host = new ToolHost("t").tool("echo", "", {}, () => "ok");
      let retried!: (e: SidecarError) => void;
      const first = new Promise<SidecarError>((r) => (retried = r));
      const serving = host.serve(client, { maxBackoffMs: 50, onRetry: (e) => retried(e) });
      const outcome = await Promise.race([first, serving.then(() => "resolved", (e: unknown) => `rejected: ${e}`)]);
      host.close();
      await serving.catch(() => {});
      client.close();
      assert.ok(outcome instanceof SidecarError && outcome.code === GrpcCode.UNAVAILABLE, `[${Object.keys(opts)}] ${outcome}`);
    }
  } finally {
    closer.close();
  }
});

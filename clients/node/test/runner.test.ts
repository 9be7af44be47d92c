/**
 * The conformance handlers against the fake sidecar: proves the runner's own
 * logic (concurrency, queue order, cut-and-resume, typed errors) before a real
 * sidecar is at hand. `make test` runs them against the real one.
 */
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { connect, type SidecarClient } from "../src/client";
import { HANDLERS, matchKinds, type Ctx, type Scenario } from "../conformance/scenarios";
import { substitute } from "../conformance/substitute";
import { FakeSidecar } from "./fake-sidecar";
import { makeCerts } from "./helpers";

const SCENARIOS = join(__dirname, "..", "..", "..", "conformance", "scenarios.json");
const certDir = mkdtempSync(join(tmpdir(), "sidecar-node-certs-"));
const certs = makeCerts(certDir);
const fake = new FakeSidecar(certs);
let ctx: Ctx;

before(async () => {
  await fake.start();
  const unix: SidecarClient = connect(fake.unixTarget);
  const tcp = connect(fake.tcpTarget, { token: fake.token });
  const tls = certs && {
    tls: fake.tlsTarget,
    mtls: fake.mtlsTarget,
    ca: certs.ca,
    wrongCa: certs.otherCa,
    clientCert: certs.clientCert,
    clientKey: certs.clientKey,
    foreignCert: certs.foreignCert,
    foreignKey: certs.foreignKey,
  };
  ctx = { lang: "node", unix, tcp, tcpTarget: fake.tcpTarget, token: fake.token, tls, unixTarget: fake.unixTarget };
});

after(async () => {
  ctx.unix.close();
  ctx.tcp?.close();
  await fake.stop();
  rmSync(certDir, { recursive: true, force: true });
});

test("kinds patterns", () => {
  const p = ["accepted", "started", "text_delta+", "usage", "completed"];
  assert.ok(matchKinds(["accepted", "started", "text_delta", "text_delta", "usage", "completed"], p));
  assert.ok(!matchKinds(["accepted", "started", "usage", "completed"], p));
  assert.ok(matchKinds(["a", "c"], ["a", "b?", "c*"]));
});

const doc = JSON.parse(readFileSync(SCENARIOS, "utf8")) as { scenarios: Scenario[] };
for (const sc of substitute(doc.scenarios, "node")) {
  // The TLS scenarios need certificates (python3 and openssl make them); the real run has them.
  const skip =
    ((sc.transport === "tls" || sc.transport === "mtls") && !certs && "no python3/openssl for certificates") ||
    // These break a real connection through the harness's proxy (clients/conformance/run.py).
    ((sc.transport === "proxy" || sc.id === "target_forms") && "needs the conformance harness's proxy and sidecar") ||
    // The sidecar's own slow-reader cut (STREAM_TOO_SLOW) and platform watches: feed-too-slow.test.ts fakes them.
    (sc.id === "watch_too_slow" && "needs a real sidecar's slow-reader cut");
  test(`scenario ${sc.id} passes against the fake sidecar`, { timeout: 20_000, skip }, async () => {
    const handler = HANDLERS[sc.id];
    assert.ok(handler, `no handler for ${sc.id}`);
    await handler(sc, ctx);
  });
}

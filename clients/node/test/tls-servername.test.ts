/**
 * TLS to an IP target: no IP address goes out as the TLS server name, so Node
 * prints no DeprecationWarning (DEP0123) on the process's stderr, and the
 * sidecar's certificate is still checked against that IP. A TLS listener of
 * an in-process grpc-js server with the certificates of tests/helpers/certs.py
 * (names localhost, 127.0.0.1, ::1), on 127.0.0.1 and on 127.0.0.2, an address
 * the certificate does not name. In a file of its own: Node warns once per process.
 */
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { status as GrpcCode, Server, ServerCredentials } from "@grpc/grpc-js";
import { connect } from "../src/client";
import { SidecarError } from "../src/errors";
import { SessionServiceService } from "../src/gen/agent_sidecar/v1/session_service";
import { type Certs, makeCerts, recording } from "./helpers";

const T = { timeout: 20_000 };
const dir = mkdtempSync(join(tmpdir(), "tls-servername-"));
const certs: Certs | undefined = makeCerts(dir);
const skip = !certs && "needs python3 and openssl";
const server = new Server();
const ports: Record<string, number> = {};
const warnings: Error[] = [];
const onWarning = (w: Error) => warnings.push(w);

before(async () => {
  process.on("warning", onWarning);
  if (!certs) return;
  server.addService(SessionServiceService, recording(SessionServiceService, []));
  const creds = ServerCredentials.createSsl(null, [
    { cert_chain: readFileSync(certs.serverCert), private_key: readFileSync(certs.serverKey) },
  ]);
  for (const host of ["127.0.0.1", "127.0.0.2"]) {
    ports[host] = await new Promise<number>((resolve, reject) =>
      server.bindAsync(`${host}:0`, creds, (err, port) => (err ? reject(err) : resolve(port))),
    );
  }
});

after(() => {
  process.off("warning", onWarning);
  server.forceShutdown();
  rmSync(dir, { recursive: true, force: true });
});

test("a call over TLS to an IP target verifies the certificate and warns of nothing", { ...T, skip }, async () => {
  const client = connect(`127.0.0.1:${ports["127.0.0.1"]}`, { caFile: certs!.ca });
  try {
    await client.getOrCreateSession({ platform: "p", chatId: "c" });
  } finally {
    client.close();
  }
  // A process warning is emitted on the next tick: one more turn of the loop lets it in.
  await new Promise<void>((r) => setImmediate(r));
  assert.deepEqual(warnings.map((w) => `${w.name}: ${w.message}`), []);
});

test("an IP the certificate does not name is still refused", { ...T, skip }, async () => {
  const client = connect(`127.0.0.2:${ports["127.0.0.2"]}`, { caFile: certs!.ca });
  try {
    await assert.rejects(client.getOrCreateSession({ platform: "p", chatId: "c" }), (e: unknown) => {
      assert.ok(e instanceof SidecarError && e.code === GrpcCode.UNAVAILABLE, String(e));
      assert.match(e.message, /127\.0\.0\.2 is not in the cert's list/);
      return true;
    });
  } finally {
    client.close();
  }
});

/**
 * The TLS options of connect and the cleartext rule (no server needed: the
 * refusals come before any connection). TLS and mTLS against a real sidecar
 * run in the conformance suite (scenarios tls_custom_ca and mtls_client_cert).
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";
import { type ConnectOptions, connect } from "../src/client";
import { isLocalTarget, tlsCredentials } from "../src/tls";
import { type Certs, makeCerts } from "./helpers";

const dir = mkdtempSync(join(tmpdir(), "tls-options-"));
const certs: Certs | undefined = makeCerts(dir);
after(() => rmSync(dir, { recursive: true, force: true }));

const REMOTE = ["10.1.2.3:50051", "sidecar.internal:50051", "0.0.0.0:50051", "dns:///sidecar.internal:50051", "[2001:db8::1]:50051"];
const LOCAL = ["unix:./data/sidecar.sock", "./data/sidecar.sock", "127.0.0.1:50051", "127.8.9.10:1", "localhost:50051", "[::1]:50051"];

test("a token is refused on a plain channel to another host", () => {
  for (const target of REMOTE) {
    assert.equal(isLocalTarget(target), false, target);
    assert.throws(() => connect(target, { token: "t" }), /refusing to send the bearer token in cleartext/, target);
    connect(target, { token: "t", insecure: true }).close(); // said so: sent plain
    connect(target, { token: "t", tls: true }).close(); // TLS: sent encrypted
    connect(target).close(); // no token: nothing to protect
  }
});

test("a token may go plain where nothing leaves the machine", () => {
  for (const target of LOCAL) {
    assert.equal(isLocalTarget(target), true, target);
    connect(target, { token: "t" }).close();
  }
});

test("a client certificate needs its key, and the files must exist", () => {
  assert.throws(() => tlsCredentials({ certFile: "/x/client.pem" }), /certFile and keyFile go together/);
  assert.throws(() => connect("127.0.0.1:1", { caFile: "/no/such/ca.pem" }), /^Error: caFile: cannot read \/no\/such\/ca.pem: ENOENT/);
});

test("each TLS option is checked at connect, and its error names it", { skip: !certs && "needs python3 and openssl" }, () => {
  const c = certs!;
  const cases: Array<[string, ConnectOptions, RegExp]> = [
    // A number was read as a file descriptor (0: stdin, which waits for input), "" turned TLS off.
    ["a number", { caFile: 0 as any }, /^TypeError: caFile: expected a PEM file's path \(a non-empty string\), got number$/],
    ["an empty path", { caFile: "" }, /^TypeError: caFile: expected a PEM file's path .* got an empty string$/],
    ["a directory", { caFile: dir }, /^Error: caFile: cannot read .*EISDIR/],
    // Files without a certificate failed every call later, UNAVAILABLE.
    ["a key for a CA", { caFile: c.clientKey }, /^Error: caFile: .*client\.key holds no PEM certificate/],
    ["a key for a certificate", { certFile: c.clientKey, keyFile: c.clientKey }, /^Error: certFile: .* holds no PEM certificate/],
    ["a certificate for a key", { certFile: c.clientCert, keyFile: c.clientCert }, /^Error: keyFile: .* holds no unencrypted PEM private key/],
    ["another certificate's key", { certFile: c.clientCert, keyFile: c.serverKey }, /^Error: keyFile: .*server\.key is not the key of certFile's certificate/],
    // A serverName that is no string crashed the process in grpc-js, at the first call.
    ["a number for serverName", { caFile: c.ca, serverName: 5 as any }, /^TypeError: serverName: expected a host name/],
    ["a string for tls", { tls: "yes" as any }, /^TypeError: tls: expected a boolean, got string$/],
    ["other credentials", { credentials: {} as any }, /^TypeError: credentials: expected grpc-js ChannelCredentials, got object$/],
  ];
  for (const [label, options, error] of cases) {
    assert.throws(() => connect("127.0.0.1:1", options), (e: unknown) => {
      assert.match(String(e), error, label);
      return true;
    });
  }
  connect("127.0.0.1:1", { caFile: c.ca, certFile: c.clientCert, keyFile: c.clientKey, serverName: "localhost" }).close();
});

test("insecure must be a boolean: \"false\" does not send the token in cleartext", () => {
  for (const insecure of ["false", 0, 1, "true"]) {
    assert.throws(() => connect("10.1.2.3:50051", { token: "t", insecure: insecure as any }),
      /^TypeError: insecure: expected a boolean/, String(insecure));
  }
  assert.throws(() => connect("10.1.2.3:50051", { token: "t", insecure: false }), /in cleartext/);
});

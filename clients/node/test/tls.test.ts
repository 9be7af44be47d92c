/**
 * The TLS options of connect and the cleartext rule (no server needed: the
 * refusals come before any connection). TLS and mTLS against a real sidecar
 * run in the conformance suite (scenarios tls_custom_ca and mtls_client_cert).
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { connect } from "../src/client";
import { isLocalTarget, tlsCredentials } from "../src/connection";

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
  assert.throws(() => connect("127.0.0.1:1", { caFile: "/no/such/ca.pem" }), /ENOENT/);
});

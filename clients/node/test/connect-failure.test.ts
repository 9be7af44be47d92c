/**
 * A client that cannot reach its sidecar says why, in grpc-js's words. Before,
 * `ready()` said only "Failed to connect before the deadline", whether the
 * socket was missing or the port refused. (A certificate that fails
 * verification: the conformance suite's connect_failure_reason, against a
 * real sidecar's TLS listener.)
 */
import assert from "node:assert/strict";
import { createServer } from "node:net";
import { test } from "node:test";
import { connect } from "../src/client";
import { SidecarError } from "../src/errors";
import { tempSocket } from "./helpers";

const T = { timeout: 10_000 };

async function readyError(target: string): Promise<SidecarError> {
  const client = connect(target);
  try {
    await client.ready(300);
  } catch (err) {
    assert.ok(err instanceof SidecarError, String(err));
    return err;
  } finally {
    client.close();
  }
  assert.fail(`${target} was ready`);
}

test("ready() on a missing socket names it", T, async () => {
  const error = await readyError(tempSocket().target);
  assert.equal(error.codeName, "UNAVAILABLE");
  assert.equal(error.reason, "");
  assert.match(error.message, /not ready within 300 ms: .*ENOENT/);
  assert.ok(error.cause instanceof Error, "the grpc-js error is its cause");
});

test("ready() on a refused port says refused", T, async () => {
  const server = createServer(); // take a free port, then free it: nothing listens there
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as { port: number }).port;
  await new Promise((resolve) => server.close(resolve));
  const error = await readyError(`127.0.0.1:${port}`);
  assert.match(error.message, /ECONNREFUSED/);
});

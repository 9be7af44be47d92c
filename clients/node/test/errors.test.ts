/** Typed-error decoding: build a google.rpc.Status locally, serialize it, decode it. */
import assert from "node:assert/strict";
import { test } from "node:test";
import { Metadata, status as GrpcCode, type ServiceError } from "@grpc/grpc-js";
import {
  AgentBusy,
  Cancelled,
  decodeStatusDetails,
  encodeStatusDetails,
  errorFromFailedFrame,
  fromGrpcError,
  InvalidArgument,
  REASONS,
  SidecarError,
  STATUS_DETAILS_KEY,
  ToolScopeViolation,
  Unauthenticated,
} from "../src/errors";
import { isTransportError } from "../src/stream";

function serviceError(code: GrpcCode, details: string, bin?: Buffer): ServiceError {
  const metadata = new Metadata();
  if (bin) metadata.set(STATUS_DETAILS_KEY, bin);
  return Object.assign(new Error(`${code} ${GrpcCode[code]}: ${details}`), { code, details, metadata });
}

test("AGENT_BUSY with RetryInfo decodes to AgentBusy", () => {
  const bin = encodeStatusDetails({
    code: GrpcCode.ABORTED,
    message: "session is busy",
    reason: "AGENT_BUSY",
    metadata: { session_key: "agent:main:local:dm:me" },
    retryDelayMs: 1500,
  });
  const err = fromGrpcError(serviceError(GrpcCode.ABORTED, "session is busy", bin));
  assert.ok(err instanceof AgentBusy);
  assert.ok(err instanceof SidecarError);
  assert.equal(err.name, "AgentBusy");
  assert.equal(err.code, GrpcCode.ABORTED);
  assert.equal(err.reason, "AGENT_BUSY");
  assert.equal(err.message, "session is busy");
  assert.equal(err.retryDelayMs, 1500);
  assert.deepEqual(err.errorMetadata, { session_key: "agent:main:local:dm:me" });
  assert.equal(isTransportError(err), false);
});

test("every reason of docs/api.md maps to its own subclass", () => {
  const names = new Set<string>();
  for (const [reason, { cls, code }] of Object.entries(REASONS)) {
    const bin = encodeStatusDetails({ code, message: reason.toLowerCase(), reason });
    const err = fromGrpcError(serviceError(code, "x", bin));
    assert.ok(err instanceof cls, reason);
    assert.equal(err.reason, reason);
    assert.equal(err.code, code);
    names.add(err.name);
  }
  assert.equal(names.size, 24); // every reason of docs/semantics.md's table
  // The lower-case reasons have their codes too (restart_interrupted was UNKNOWN).
  assert.equal(errorFromFailedFrame({ reason: "restart_interrupted", message: "m" }).code, GrpcCode.UNAVAILABLE);
});

test("INVALID_ARGUMENT carries its field violations", () => {
  const bin = encodeStatusDetails({
    code: GrpcCode.INVALID_ARGUMENT,
    message: "bad request",
    reason: "INVALID_ARGUMENT",
    fieldViolations: [{ field: "request_id", description: "required" }],
  });
  const err = fromGrpcError(serviceError(GrpcCode.INVALID_ARGUMENT, "bad request", bin));
  assert.ok(err instanceof InvalidArgument);
  assert.deepEqual(err.fieldViolations, [{ field: "request_id", description: "required" }]);
});

test("an ErrorInfo of another domain gives no reason", () => {
  const bin = encodeStatusDetails({ code: GrpcCode.UNAUTHENTICATED, message: "m", reason: "X", domain: "example.com" });
  const err = fromGrpcError(serviceError(GrpcCode.UNAUTHENTICATED, "m", bin));
  assert.equal(err.constructor, SidecarError);
  assert.equal(err.reason, "");
  assert.ok(!(err instanceof Unauthenticated));
});

test("a status without details is a base SidecarError; UNAVAILABLE then counts as a transport drop", () => {
  const err = fromGrpcError(serviceError(GrpcCode.UNAVAILABLE, "Connection dropped"));
  assert.equal(err.constructor, SidecarError);
  assert.equal(err.reason, "");
  assert.equal(err.message, "Connection dropped");
  assert.equal(isTransportError(err), true);
});

test("garbage in the details trailer does not throw", () => {
  const err = fromGrpcError(serviceError(GrpcCode.INTERNAL, "boom", Buffer.from([0xff, 0xff, 0xff])));
  assert.equal(err.code, GrpcCode.INTERNAL);
  assert.equal(err.reason, "");
});

test("decodeStatusDetails reads code, message and ErrorInfo", () => {
  const st = decodeStatusDetails(
    encodeStatusDetails({ code: GrpcCode.NOT_FOUND, message: "no such session", reason: "SESSION_NOT_FOUND" }),
  );
  assert.equal(st.code, GrpcCode.NOT_FOUND);
  assert.equal(st.message, "no such session");
  assert.equal(st.errorInfo?.reason, "SESSION_NOT_FOUND");
  assert.equal(st.errorInfo?.domain, "agent-sidecar");
});

test("a failed frame maps to the same classes", () => {
  const scope = errorFromFailedFrame({ reason: "TOOL_SCOPE_VIOLATION", message: "other.x is outside conf.*" });
  assert.ok(scope instanceof ToolScopeViolation);
  assert.equal(scope.code, GrpcCode.PERMISSION_DENIED);
  const cancelled = errorFromFailedFrame({ reason: "CANCELLED", message: "" });
  assert.ok(cancelled instanceof Cancelled);
  assert.equal(cancelled.message, "CANCELLED");
  const unknown = errorFromFailedFrame({ reason: "SOMETHING_NEW", message: "m" });
  assert.equal(unknown.constructor, SidecarError);
  assert.equal(unknown.reason, "SOMETHING_NEW");
});

/**
 * Typed errors of agent-sidecar (docs/semantics.md, "Errors").
 *
 * Every non-OK status the sidecar sends carries a `google.rpc.Status` in the
 * `grpc-status-details-bin` trailer whose details hold a `google.rpc.ErrorInfo`
 * with domain `agent-sidecar`; its `reason` picks the subclass. The same reason
 * appears in `failed` activity frames, so {@link errorFromFailedFrame} maps a
 * frame onto the same classes.
 */
import { Metadata, status as GrpcCode, type ServiceError } from "@grpc/grpc-js";
import type { ActivityFrame_Failed } from "./gen/agent_sidecar/v1/prompt_service";
import { Any } from "./gen/google/protobuf/any";
import { BadRequest, ErrorInfo, RetryInfo } from "./gen/google/rpc/error_details";
import { Status } from "./gen/google/rpc/status";

/** The ErrorInfo domain the sidecar uses. */
export const ERROR_DOMAIN = "agent-sidecar";
/** The trailer key that carries a serialized google.rpc.Status. */
export const STATUS_DETAILS_KEY = "grpc-status-details-bin";

const TYPE_PREFIX = "type.googleapis.com/";
const ERROR_INFO_URL = TYPE_PREFIX + "google.rpc.ErrorInfo";
const RETRY_INFO_URL = TYPE_PREFIX + "google.rpc.RetryInfo";
const BAD_REQUEST_URL = TYPE_PREFIX + "google.rpc.BadRequest";

/** One field violation of an INVALID_ARGUMENT error (google.rpc.BadRequest). */
export interface FieldViolation {
  field: string;
  description: string;
}

/** What a {@link SidecarError} is built from. */
export interface SidecarErrorInit {
  /** gRPC status code (`@grpc/grpc-js`'s `status` enum). */
  code: GrpcCode;
  /** ErrorInfo reason (`AGENT_BUSY`, …); empty when the status carried none. */
  reason: string;
  message: string;
  /** ErrorInfo metadata. */
  metadata?: Record<string, string>;
  /** From RetryInfo (AGENT_BUSY carries one). */
  retryDelayMs?: number;
  fieldViolations?: FieldViolation[];
  /** The underlying gRPC error, when there was one. */
  cause?: unknown;
}

/**
 * Base class of every error the client raises for a non-OK sidecar status or a
 * `failed` frame. `reason` is empty for statuses without an agent-sidecar
 * ErrorInfo (for example a client-side deadline or an unreachable server).
 */
export class SidecarError extends Error {
  /** gRPC status code. */
  readonly code: GrpcCode;
  /** ErrorInfo reason (ErrorReason in docs/api.md), or "" when the status carried none. */
  readonly reason: string;
  /** ErrorInfo metadata (string map). */
  readonly errorMetadata: Record<string, string>;
  /** Suggested wait before retrying, from RetryInfo, when present. */
  readonly retryDelayMs?: number;
  /** Field violations from BadRequest, when present. */
  readonly fieldViolations: FieldViolation[];

  constructor(init: SidecarErrorInit) {
    super(init.message, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = new.target.name;
    this.code = init.code;
    this.reason = init.reason;
    this.errorMetadata = init.metadata ?? {};
    this.retryDelayMs = init.retryDelayMs;
    this.fieldViolations = init.fieldViolations ?? [];
  }

  /** The gRPC code's name, e.g. `"ABORTED"`. */
  get codeName(): string {
    return GrpcCode[this.code] ?? String(this.code);
  }
}

/** `REJECT_IF_BUSY` and a turn is in flight (ABORTED, with RetryInfo). */
export class AgentBusy extends SidecarError {}
/** The turn exceeded its timeout or the call's deadline (DEADLINE_EXCEEDED). */
export class AgentTimeout extends SidecarError {}
/** The model backend failed after its retries (UNAVAILABLE). */
export class LlmApiFailure extends SidecarError {}
/** The agent loop reached `max_iterations` (RESOURCE_EXHAUSTED). */
export class MaxIterations extends SidecarError {}
/** The model called a tool outside the session's allowed subtrees (PERMISSION_DENIED). */
export class ToolScopeViolation extends SidecarError {}
/** The tool host failed and the turn could not go on (UNAVAILABLE). */
export class ToolInvokeFailed extends SidecarError {}
/** The turn was cancelled: Cancel, SuspendSession, INTERRUPT, ResetSession (CANCELLED). */
export class Cancelled extends SidecarError {}
/** No such session key or id (NOT_FOUND). */
export class SessionNotFound extends SidecarError {}
/** A malformed or oversized request; see `fieldViolations` (INVALID_ARGUMENT). */
export class InvalidArgument extends SidecarError {}
/** Missing or wrong credential (UNAUTHENTICATED). */
export class Unauthenticated extends SidecarError {}
/** A credential used outside its platforms (PERMISSION_DENIED). */
export class PermissionDenied extends SidecarError {}
/** The worker running the turn died; the session is marked resume_pending (UNAVAILABLE). */
export class WorkerCrashed extends SidecarError {}
/** The call's own deadline passed (DEADLINE_EXCEEDED, no reason: a client-side deadline, never AGENT_TIMEOUT). */
export class DeadlineExceeded extends SidecarError {}
/** A resumed stream found its turn over and the frames it had not seen gone (DATA_LOSS, no reason). Not retryable. */
export class TurnFramesGone extends SidecarError {}
/** The state forbids the request (FAILED_PRECONDITION). */
export class FailedPrecondition extends SidecarError {}
/** A limit of the turn was reached (RESOURCE_EXHAUSTED). */
export class ResourceExhausted extends SidecarError {}
/** The sidecar cannot take the call now; safe to retry (UNAVAILABLE). */
export class Unavailable extends SidecarError {}
/** WatchActivity of a request id the sidecar has never seen (NOT_FOUND). */
export class RequestNotFound extends SidecarError {}
/** A bug in the sidecar (INTERNAL). */
export class Internal extends SidecarError {}
/** The turn was in flight when the sidecar crashed (UNAVAILABLE, reason restart_interrupted). */
export class RestartInterrupted extends SidecarError {}
/** Still running when a graceful shutdown's drain ran out (UNAVAILABLE, reason shutdown_timeout). */
export class ShutdownTimeout extends SidecarError {}
/** A stream whose reader stopped reading was ended (RESOURCE_EXHAUSTED); streams resume from it themselves. */
export class StreamTooSlow extends SidecarError {}
/** The sidecar's admission limits are reached (RESOURCE_EXHAUSTED, with RetryInfo). */
export class Overloaded extends SidecarError {}
/** The session's queue is full (RESOURCE_EXHAUSTED). */
export class QueueFull extends SidecarError {}
/** The store cannot write now (UNAVAILABLE, with RetryInfo). */
export class StoreUnavailable extends SidecarError {}
/** Another sidecar of the cluster runs the session now (UNAVAILABLE, with RetryInfo). */
export class LaneMoved extends SidecarError {}

type ErrorClass = new (init: SidecarErrorInit) => SidecarError;

/** Reason → subclass and the gRPC code docs/api.md pairs it with. */
export const REASONS: Readonly<Record<string, { cls: ErrorClass; code: GrpcCode }>> = {
  AGENT_BUSY: { cls: AgentBusy, code: GrpcCode.ABORTED },
  AGENT_TIMEOUT: { cls: AgentTimeout, code: GrpcCode.DEADLINE_EXCEEDED },
  LLM_API_FAILURE: { cls: LlmApiFailure, code: GrpcCode.UNAVAILABLE },
  MAX_ITERATIONS: { cls: MaxIterations, code: GrpcCode.RESOURCE_EXHAUSTED },
  TOOL_SCOPE_VIOLATION: { cls: ToolScopeViolation, code: GrpcCode.PERMISSION_DENIED },
  TOOL_INVOKE_FAILED: { cls: ToolInvokeFailed, code: GrpcCode.UNAVAILABLE },
  CANCELLED: { cls: Cancelled, code: GrpcCode.CANCELLED },
  SESSION_NOT_FOUND: { cls: SessionNotFound, code: GrpcCode.NOT_FOUND },
  INVALID_ARGUMENT: { cls: InvalidArgument, code: GrpcCode.INVALID_ARGUMENT },
  UNAUTHENTICATED: { cls: Unauthenticated, code: GrpcCode.UNAUTHENTICATED },
  PERMISSION_DENIED: { cls: PermissionDenied, code: GrpcCode.PERMISSION_DENIED },
  WORKER_CRASHED: { cls: WorkerCrashed, code: GrpcCode.UNAVAILABLE },
  FAILED_PRECONDITION: { cls: FailedPrecondition, code: GrpcCode.FAILED_PRECONDITION },
  RESOURCE_EXHAUSTED: { cls: ResourceExhausted, code: GrpcCode.RESOURCE_EXHAUSTED },
  UNAVAILABLE: { cls: Unavailable, code: GrpcCode.UNAVAILABLE },
  REQUEST_NOT_FOUND: { cls: RequestNotFound, code: GrpcCode.NOT_FOUND },
  INTERNAL: { cls: Internal, code: GrpcCode.INTERNAL },
  restart_interrupted: { cls: RestartInterrupted, code: GrpcCode.UNAVAILABLE },
  shutdown_timeout: { cls: ShutdownTimeout, code: GrpcCode.UNAVAILABLE },
  STREAM_TOO_SLOW: { cls: StreamTooSlow, code: GrpcCode.RESOURCE_EXHAUSTED },
  OVERLOADED: { cls: Overloaded, code: GrpcCode.RESOURCE_EXHAUSTED },
  QUEUE_FULL: { cls: QueueFull, code: GrpcCode.RESOURCE_EXHAUSTED },
  STORE_UNAVAILABLE: { cls: StoreUnavailable, code: GrpcCode.UNAVAILABLE },
  LANE_MOVED: { cls: LaneMoved, code: GrpcCode.UNAVAILABLE },
};

/**
 * Build the subclass for `init.reason` (the base class for an unknown reason).
 * Without a reason only DEADLINE_EXCEEDED (the call's own deadline) has a class.
 */
export function makeSidecarError(init: SidecarErrorInit): SidecarError {
  const byCode = init.reason === "" && init.code === GrpcCode.DEADLINE_EXCEEDED ? DeadlineExceeded : undefined;
  const cls = (Object.hasOwn(REASONS, init.reason) ? REASONS[init.reason].cls : undefined) ?? byCode ?? SidecarError;
  return new cls(init);
}

/**
 * The error this client raises for a bad field before sending anything: an
 * {@link InvalidArgument}, as the sidecar would answer, whose message starts
 * with the field's name (`messages[3].content: ...`) and whose one field
 * violation names it too. Its reason is set, so nothing resumes or retries it.
 */
export function invalidArgument(field: string, description: string): InvalidArgument {
  return new InvalidArgument({
    code: GrpcCode.INVALID_ARGUMENT,
    reason: "INVALID_ARGUMENT",
    message: `${field}: ${description}`,
    fieldViolations: [{ field, description }],
  });
}

/** The parts of a google.rpc.Status the client understands. */
export interface DecodedStatus {
  code: number;
  message: string;
  errorInfo?: ErrorInfo;
  retryDelayMs?: number;
  fieldViolations: FieldViolation[];
}

/** Decode a serialized google.rpc.Status (the `grpc-status-details-bin` value). */
export function decodeStatusDetails(bytes: Uint8Array): DecodedStatus {
  const st = Status.decode(bytes);
  const out: DecodedStatus = { code: st.code, message: st.message, fieldViolations: [] };
  for (const any of st.details) {
    if (any.typeUrl === ERROR_INFO_URL) {
      const info = ErrorInfo.decode(any.value);
      // Prefer our own domain's ErrorInfo when a status carries several.
      if (!out.errorInfo || info.domain === ERROR_DOMAIN) out.errorInfo = info;
    } else if (any.typeUrl === RETRY_INFO_URL) {
      const d = RetryInfo.decode(any.value).retryDelay;
      if (d) out.retryDelayMs = d.seconds * 1000 + Math.round(d.nanos / 1e6);
    } else if (any.typeUrl === BAD_REQUEST_URL) {
      for (const v of BadRequest.decode(any.value).fieldViolations) {
        out.fieldViolations.push({ field: v.field, description: v.description });
      }
    }
  }
  return out;
}

/** What {@link encodeStatusDetails} packs; the inverse of {@link DecodedStatus}. */
export interface StatusDetailsInit {
  code: number;
  message: string;
  reason?: string;
  domain?: string;
  metadata?: Record<string, string>;
  retryDelayMs?: number;
  fieldViolations?: FieldViolation[];
}

/**
 * Serialize a google.rpc.Status the way the sidecar does. Used by tests and by
 * fake servers; clients only decode.
 */
export function encodeStatusDetails(init: StatusDetailsInit): Buffer {
  const details: Any[] = [];
  if (init.reason !== undefined) {
    const info = ErrorInfo.create({
      reason: init.reason,
      domain: init.domain ?? ERROR_DOMAIN,
      metadata: init.metadata ?? {},
    });
    details.push({ typeUrl: ERROR_INFO_URL, value: Buffer.from(ErrorInfo.encode(info).finish()) });
  }
  if (init.retryDelayMs !== undefined) {
    const ms = init.retryDelayMs;
    const retry = RetryInfo.create({
      retryDelay: { seconds: Math.floor(ms / 1000), nanos: (ms % 1000) * 1e6 },
    });
    details.push({ typeUrl: RETRY_INFO_URL, value: Buffer.from(RetryInfo.encode(retry).finish()) });
  }
  if (init.fieldViolations?.length) {
    const br = BadRequest.create({ fieldViolations: init.fieldViolations });
    details.push({ typeUrl: BAD_REQUEST_URL, value: Buffer.from(BadRequest.encode(br).finish()) });
  }
  const st = Status.create({ code: init.code, message: init.message, details });
  return Buffer.from(Status.encode(st).finish());
}

/** True for a @grpc/grpc-js ServiceError (an Error with a numeric `code`). */
export function isServiceError(err: unknown): err is ServiceError {
  return err instanceof Error && typeof (err as Partial<ServiceError>).code === "number";
}

/**
 * Turn any error from a gRPC call into a {@link SidecarError}: decode the
 * status details trailer when present; anything else keeps its gRPC code with
 * an empty reason. Already-decoded errors pass through unchanged.
 */
export function fromGrpcError(err: unknown): SidecarError {
  if (err instanceof SidecarError) return err;
  if (!isServiceError(err)) {
    const message = err instanceof Error ? err.message : String(err);
    return new SidecarError({ code: GrpcCode.UNKNOWN, reason: "", message, cause: err });
  }
  const message = explainConnectFailure(err.details || err.message);
  const raw = err.metadata instanceof Metadata ? err.metadata.get(STATUS_DETAILS_KEY) : [];
  const bin = raw.find((v): v is Buffer => Buffer.isBuffer(v));
  if (!bin) return makeSidecarError({ code: err.code, reason: "", message, cause: err });
  let st: DecodedStatus;
  try {
    st = decodeStatusDetails(bin);
  } catch {
    return makeSidecarError({ code: err.code, reason: "", message, cause: err });
  }
  const ours = st.errorInfo && st.errorInfo.domain === ERROR_DOMAIN ? st.errorInfo : undefined;
  return makeSidecarError({
    code: err.code,
    reason: ours?.reason ?? "",
    message: st.message || message,
    metadata: ours?.metadata,
    retryDelayMs: st.retryDelayMs,
    fieldViolations: st.fieldViolations,
    cause: err,
  });
}

/**
 * grpc-js's text for a connection closed as it was being set up, after TCP
 * (and TLS) but before HTTP/2 began: it says no more than this.
 */
const CLOSED_AT_SETUP = /Last error: Failed to connect \(\d{4}-\d\d-\d\dT[\d:.]+Z\)/;
export const CLOSED_AT_SETUP_HINT =
  "; the connection was closed as it was set up: so an mTLS listener (one with a client_ca) refuses the TLS " +
  "handshake of a client without a client certificate its client_ca signed (give certFile and keyFile), a TLS " +
  "listener one without TLS (tls: true or caFile), and a proxy one it cannot forward (its sidecar is down)";

/**
 * `message` with the likely causes of a connection closed at setup spelt out.
 * That is all an mTLS listener turning a client away (no client certificate,
 * or one of another CA) shows through grpc-js, whose TLS 1.3 handshake is over
 * on the client's side when the listener refuses it, and all a TLS listener
 * reached without TLS shows. A proxy in front of a sidecar that is down
 * (Docker's port forwarding, say) does the same, so it is no proof of a TLS
 * failure: a ToolHost retries it.
 */
export function explainConnectFailure(message: string): string {
  return CLOSED_AT_SETUP.test(message) && !message.includes(CLOSED_AT_SETUP_HINT) ? message + CLOSED_AT_SETUP_HINT : message;
}

/** The typed error for a `failed` frame (its reason picks the class and code). */
export function errorFromFailedFrame(failed: ActivityFrame_Failed): SidecarError {
  const code = REASONS[failed.reason]?.code ?? GrpcCode.UNKNOWN;
  return makeSidecarError({ code, reason: failed.reason, message: failed.message || failed.reason });
}

/**
 * True for grpc-js's "Request message serialization failure" (status INTERNAL,
 * raised locally before anything is sent: a field out of its type's range, such
 * as 1.5 for an int32). Retrying it can never work, unlike an INTERNAL from the
 * transport (RST_STREAM and the like).
 */
export function isSerializationError(err: SidecarError): boolean {
  const local = err.message.startsWith("Request message serialization failure");
  return local && err.reason === "" && err.code === GrpcCode.INTERNAL;
}

/** True when the error came from the sidecar itself (it carries an agent-sidecar reason). */
export function hasReason(err: unknown): boolean {
  return err instanceof SidecarError && err.reason !== "";
}

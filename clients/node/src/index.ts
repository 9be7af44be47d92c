/**
 * agent-sidecar client for Node.js.
 *
 *     import { connect, frameKind } from "agent-sidecar";
 *     const client = connect("unix:./data/sidecar.sock");
 *     for await (const f of client.prompt({ source: { platform: "local", chatId: "me" }, text: "hi" })) {
 *       if (f.event?.$case === "textDelta") process.stdout.write(f.event.value.text);
 *     }
 *
 * Generated messages and stubs are re-exported under `pb`.
 */
export {
  connect,
  parseDelivery,
  SidecarClient,
  type ConnectOptions,
  type Delivery,
  type PromptOptions,
  type SourceInput,
  type WatchOptions,
} from "./client";
export {
  bearerInterceptor,
  DEFAULT_CHANNEL_OPTIONS,
  normalizeTarget,
  SERVICE_CONFIG,
  TARGET_FORMS,
} from "./connection";
export { isLocalTarget, tlsCredentials, type TlsFiles } from "./tls";
export {
  AgentBusy,
  AgentTimeout,
  Cancelled,
  decodeStatusDetails,
  encodeStatusDetails,
  ERROR_DOMAIN,
  errorFromFailedFrame,
  fromGrpcError,
  InvalidArgument,
  LlmApiFailure,
  makeSidecarError,
  MaxIterations,
  PermissionDenied,
  REASONS,
  SessionNotFound,
  SidecarError,
  STATUS_DETAILS_KEY,
  ToolInvokeFailed,
  ToolScopeViolation,
  Unauthenticated,
  WorkerCrashed,
  DeadlineExceeded,
  TurnFramesGone,
  FailedPrecondition,
  ResourceExhausted,
  Unavailable,
  RequestNotFound,
  Internal,
  RestartInterrupted,
  ShutdownTimeout,
  StreamTooSlow,
  Overloaded,
  QueueFull,
  StoreUnavailable,
  LaneMoved,
  type DecodedStatus,
  type FieldViolation,
  type SidecarErrorInit,
  type StatusDetailsInit,
} from "./errors";
export { frameKind, FrameSequencer, isTerminal, type FrameKind, type Verdict } from "./frames";
export {
  FrameStream,
  isTransportError,
  RETRY_SAME_REQUEST_REASONS,
  type ResumeOptions,
  type StreamOpener,
} from "./stream";
export { isTlsFailure, RETRY_LOG_EVERY, ToolHost, type ServeOptions, type ToolContext, type ToolHandler } from "./tools";

export type { Message, Session, SessionSource, Usage } from "./gen/agent_sidecar/v1/common";
export { SessionState } from "./gen/agent_sidecar/v1/common";
export type { ActivityFrame, GetQueueResponse, QueuedPrompt } from "./gen/agent_sidecar/v1/prompt_service";
export { DeliveryMode } from "./gen/agent_sidecar/v1/prompt_service";
/** Every reason the sidecar sends; the wire string is `ErrorReason[value]` (docs/api.md). */
export { ErrorReason } from "./gen/agent_sidecar/v1/error_reason";

/** The generated protobuf messages and gRPC stubs (ts-proto output). */
export * as pb from "./pb";

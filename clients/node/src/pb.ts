/** The generated code, namespaced per proto file (ts-proto, @grpc/grpc-js services). */
export * as common from "./gen/agent_sidecar/v1/common";
export * as prompt from "./gen/agent_sidecar/v1/prompt_service";
export * as session from "./gen/agent_sidecar/v1/session_service";
export * as tool from "./gen/agent_sidecar/v1/tool_service";
export * as rpcStatus from "./gen/google/rpc/status";
export * as rpcErrorDetails from "./gen/google/rpc/error_details";
export * as errorReason from "./gen/agent_sidecar/v1/error_reason";

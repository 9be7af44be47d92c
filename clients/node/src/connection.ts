/**
 * Channel plumbing: target parsing, bearer-token interceptor, one shared
 * channel for the three service stubs, and a promise wrapper for unary calls.
 */
import {
  Channel,
  credentials as grpcCredentials,
  InterceptingCall,
  type CallOptions,
  type ChannelCredentials,
  type ChannelOptions,
  type ClientUnaryCall,
  type Interceptor,
  type Metadata,
  type ServiceError,
} from "@grpc/grpc-js";
import { Metadata as GrpcMetadata } from "@grpc/grpc-js";
import { fromGrpcError } from "./errors";
import serviceConfig from "./service_config.json";

/**
 * Normalize a target: `unix:/abs/sock`, `unix:./rel/sock` and `host:port` pass
 * through; a bare path (`/x/sidecar.sock`, `./data/sidecar.sock`) gets `unix:`.
 */
export function normalizeTarget(target: string): string {
  if (target.startsWith("/") || target.startsWith("./") || target.startsWith("../")) {
    return "unix:" + target;
  }
  return target;
}

/** An interceptor that sends `authorization: Bearer <token>` on every call. */
export function bearerInterceptor(token: string): Interceptor {
  return (options, nextCall) =>
    new InterceptingCall(nextCall(options), {
      start(metadata, listener, next) {
        metadata.set("authorization", `Bearer ${token}`);
        next(metadata, listener);
      },
    });
}

/**
 * The gRPC service config every client of agent-sidecar ships
 * (clients/service_config.json in the repository): the idempotent reads
 * (GetSession, ListSessions, GetTranscript, SearchMessages, GetSessionContext,
 * GetQueue) are retried on UNAVAILABLE; writes and streams never are.
 */
export const SERVICE_CONFIG: string = JSON.stringify(serviceConfig);

/**
 * Channel defaults: reconnect fast, so resuming a dropped stream is quick, and
 * the shipped service config (a `grpc.service_config` in `channelOptions`
 * replaces it).
 */
export const DEFAULT_CHANNEL_OPTIONS: ChannelOptions = {
  "grpc.initial_reconnect_backoff_ms": 100,
  "grpc.max_reconnect_backoff_ms": 2000,
  "grpc.service_config": SERVICE_CONFIG,
};

/** Open one channel to `target` (insecure unless `creds` is given). */
export function openChannel(target: string, creds?: ChannelCredentials, options?: ChannelOptions): Channel {
  return new Channel(
    normalizeTarget(target),
    creds ?? grpcCredentials.createInsecure(),
    { ...DEFAULT_CHANNEL_OPTIONS, ...(options ?? {}) },
  );
}

/** The shape of a generated unary method with metadata and options. */
export type UnaryMethod<Req, Res> = (
  request: Req,
  metadata: Metadata,
  options: Partial<CallOptions>,
  callback: (error: ServiceError | null, response: Res) => void,
) => ClientUnaryCall;

/** Call a unary method and return a promise; errors become typed SidecarErrors. */
export function unary<Req, Res>(method: UnaryMethod<Req, Res>, request: Req, timeoutMs?: number): Promise<Res> {
  const options: Partial<CallOptions> = {};
  if (timeoutMs !== undefined && timeoutMs > 0) options.deadline = Date.now() + timeoutMs;
  return new Promise<Res>((resolve, reject) => {
    method(request, new GrpcMetadata(), options, (err, res) => {
      if (err) reject(fromGrpcError(err));
      else resolve(res);
    });
  });
}

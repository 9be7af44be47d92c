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
import { readFileSync } from "node:fs";
import { isIP } from "node:net";
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

/** Where the TLS material of {@link tlsCredentials} comes from: PEM file paths. */
export interface TlsFiles {
  /** CA certificates that verify the sidecar's certificate (default: the system's roots). */
  caFile?: string;
  /** A client certificate, for a listener with a `client_ca` (mTLS); with `keyFile`. */
  certFile?: string;
  /** The private key of `certFile`. */
  keyFile?: string;
}

/** Channel credentials for a TLS listener of the sidecar, from PEM files. */
export function tlsCredentials(files: TlsFiles = {}): ChannelCredentials {
  if ((files.certFile === undefined) !== (files.keyFile === undefined)) {
    throw new TypeError("certFile and keyFile go together (the client certificate and its key)");
  }
  const read = (path?: string) => (path === undefined ? null : readFileSync(path));
  return grpcCredentials.createSsl(read(files.caFile), read(files.keyFile), read(files.certFile));
}

/**
 * Whether `target` only reaches this machine: a Unix socket, or a TCP address
 * whose host is `localhost` or a loopback IP (127.0.0.0/8, ::1).
 */
export function isLocalTarget(target: string): boolean {
  let t = normalizeTarget(target);
  if (t.startsWith("unix:") || t.startsWith("unix-abstract:")) return true;
  for (const scheme of ["dns:///", "dns:", "ipv4:", "ipv6:"]) {
    if (t.startsWith(scheme)) {
      t = t.slice(scheme.length);
      break;
    }
  }
  const cut = t.lastIndexOf(":");
  const host = (cut >= 0 ? t.slice(0, cut) : t).replace(/^\[|\]$/g, "").toLowerCase();
  if (host === "localhost" || host.endsWith(".localhost")) return true;
  if (isIP(host) === 4) return host.startsWith("127.");
  if (isIP(host) === 6) return host === "::1" || host === "0:0:0:0:0:0:0:1";
  return false;
}

/**
 * Refuse to send `token` in cleartext to another machine: a token on a plain
 * channel to a host that is not loopback throws unless `insecure` is set.
 */
export function checkCleartext(target: string, token: string | undefined, secure: boolean, insecure: boolean): void {
  if (token && !secure && !insecure && !isLocalTarget(target)) {
    throw new Error(
      `refusing to send the bearer token in cleartext to ${target}: connect with TLS ` +
        "(tls: true, caFile: ...) to a TLS listener, or pass insecure: true to send it anyway",
    );
  }
}

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

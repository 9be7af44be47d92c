/**
 * Channel plumbing: target parsing, bearer-token interceptor, one shared
 * channel for the three service stubs, and a promise wrapper for unary calls.
 */
import {
  Channel,
  type Client,
  credentials as grpcCredentials,
  status as GrpcStatus,
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
import { readFileSync, statSync } from "node:fs";
import { isIP } from "node:net";
import { fromGrpcError } from "./errors";
import serviceConfig from "./service_config.json";

/**
 * Normalize a target: a bare path (`/x/sidecar.sock`, `./data/sidecar.sock`)
 * gets `unix:`, `tcp:` (and `tcp://`) is dropped, and so is the authority of
 * `unix://AUTHORITY/PATH` (grpc-js would dial PATH relative); the rest passes through.
 */
export function normalizeTarget(target: string): string {
  if (target.startsWith("/") || target.startsWith("./") || target.startsWith("../")) {
    return "unix:" + target;
  }
  if (target.startsWith("tcp:")) return target.slice(4).replace(/^\/\//, "");
  const unixAuthority = /^(unix|unix-abstract):\/\/[^/]+(\/.*)$/.exec(target);
  if (unixAuthority) return `${unixAuthority[1]}://${unixAuthority[2]}`;
  return target;
}

/** The targets every client of this repository accepts (anything else throws at connect). */
export const TARGET_FORMS =
  "unix:PATH, unix:///ABS/PATH, a bare socket path (/abs, ./rel, ../rel), HOST:PORT, [IPV6]:PORT, " +
  "tcp:HOST:PORT (or tcp://HOST:PORT), dns:[//AUTHORITY/]HOST:PORT";

/**
 * The longest Unix socket path, in bytes: a sockaddr_un's 108-byte `sun_path`
 * less its NUL. The sidecar refuses to listen on a longer one.
 */
export const UNIX_PATH_MAX = 107;

/**
 * Check `target` at connect time, so a malformed one fails at once instead of
 * as UNAVAILABLE (or a hang) on the first call: a non-empty string, a Unix
 * socket with a path of at most {@link UNIX_PATH_MAX} bytes (of UTF-8) that is
 * no directory (the sidecar's data dir, as the Go and Python clients check), or a
 * host with a port in 1..65535 (`dns:`, `ipv4:`, `ipv6:` prefixes included).
 * The error names `target`.
 */
export function checkTarget(target: unknown): asserts target is string {
  if (typeof target !== "string") {
    throw new TypeError(`target: expected a string ("unix:/path/sidecar.sock" or "host:port"), got ${typeOf(target)}`);
  }
  // The Python client's grammar (clients/python/.../_args.py normalize_target), read the same way.
  const bad = (why: string): never => {
    throw new TypeError(`target: ${JSON.stringify(target)} ${why}; expected one of ${TARGET_FORMS}`);
  };
  if (target.trim() === "") bad("is empty");
  if (target !== target.trim()) bad("has leading or trailing whitespace");
  let t = target;
  if (t.startsWith("/") || t.startsWith("./") || t.startsWith("../")) t = "unix:" + t;
  const colon = t.indexOf(":");
  const [scheme, rest] = colon < 0 ? [t, ""] : [t.slice(0, colon), t.slice(colon + 1)];
  if (colon >= 0 && (scheme === "unix" || scheme === "unix-abstract")) {
    let path = rest;
    if (path.startsWith("//")) {
      // unix://[authority]/path: the path keeps its "/"
      const slash = path.indexOf("/", 2);
      path = slash < 0 ? "" : path.slice(slash);
    }
    path = path.split("?", 1)[0].split("#", 1)[0];
    if (path === "" || path === "/") bad("has no socket path");
    // The path grpc-js dials (no percent-decoding): unix:///abs/path is /abs/path.
    const n = Buffer.byteLength(path, "utf8");
    if (n > UNIX_PATH_MAX) {
      // libuv cuts a longer path to 108 bytes: the channel fails UNAVAILABLE or reaches another socket.
      throw new RangeError(
        `target: ${JSON.stringify(target)}: a Unix socket path may be at most ${UNIX_PATH_MAX} bytes; this one is ${n}`,
      );
    }
    if (scheme === "unix" && isDirectory(path)) {
      // A sidecar's data dir given for its socket: no wait would ever connect.
      throw new TypeError(
        `target: ${JSON.stringify(target)}: ${path} is a directory, not a socket ` +
          "(a sidecar listens on sidecar.sock in its data dir)",
      );
    }
    return;
  }
  if (colon >= 0 && scheme === "tcp") return checkHostPort(target, rest.startsWith("//") ? rest.slice(2) : rest);
  if (colon >= 0 && scheme === "dns") {
    let address = rest;
    if (address.startsWith("//")) {
      const slash = address.indexOf("/", 2);
      address = slash < 0 ? "" : address.slice(slash + 1);
    }
    return checkHostPort(target, address);
  }
  if (colon >= 0 && /^ipv[46]$/i.test(scheme)) {
    // gRPC's own scheme: read as the host "ipv4", it was told of brackets.
    bad(`has gRPC's ${scheme}: scheme, which this client does not dial: give the address alone (host:port, [v6]:port)`);
  }
  if (t.includes("://") || (colon >= 0 && !/^[0-9]/.test(rest) && !t.startsWith("["))) {
    bad("has a scheme this client does not dial");
  }
  checkHostPort(target, t);
}

/** Whether `path` names an existing directory (false when it does not exist or cannot be read). */
function isDirectory(path: string): boolean {
  try {
    return statSync(path).isDirectory();
  } catch {
    return false;
  }
}

/** host:port or [ipv6]:port, as the Python client checks them; throws naming `target`. */
function checkHostPort(target: string, address: string): void {
  const bad = (why: string): never => {
    throw new TypeError(`target: ${JSON.stringify(target)} ${why}; expected one of ${TARGET_FORMS}`);
  };
  let port: string;
  if (address.startsWith("[")) {
    const close = address.indexOf("]");
    if (close < 0 || address[close + 1] !== ":") bad("is not [ipv6]:port");
    const host = address.slice(1, close);
    if (isIP(host.split("%", 1)[0]) !== 6) bad(`has ${JSON.stringify(host)}, which is no IPv6 address`);
    port = address.slice(close + 2);
  } else {
    const cut = address.lastIndexOf(":");
    if (cut < 0) bad("has no port (a port is always given: host:port)");
    const host = address.slice(0, cut);
    port = address.slice(cut + 1);
    if (host.includes(":")) bad("is not host:port (an IPv6 address goes in brackets: [::1]:50051)");
    if (!/^[A-Za-z0-9._-]+$/.test(host) || /^\.*$/.test(host)) bad("has no valid host (host:port)");
  }
  if (!(/^[0-9]+$/.test(port) && +port >= 1 && +port <= 65535)) {
    throw new RangeError(`target: ${JSON.stringify(target)} has port ${JSON.stringify(port)}; a port is 1..65535`);
  }
}

/** `typeof`, with null and arrays told apart (for error messages). */
export function typeOf(v: unknown): string {
  return v === null ? "null" : Array.isArray(v) ? "array" : typeof v;
}

/**
 * Check a bearer token: a string gRPC metadata can carry (printable ASCII).
 * The error names `token` and never shows its value (it is a secret).
 */
export function checkToken(token: unknown): asserts token is string {
  if (typeof token !== "string") throw new TypeError(`token: expected a string, got ${typeOf(token)}`);
  if (!/^[\x20-\x7e]*$/.test(token)) {
    throw new TypeError(
      "token: has a character gRPC metadata cannot carry (only printable ASCII: no newline, " +
        "control or non-ASCII character); the value is not shown",
    );
  }
}

/**
 * Deadlines further ahead than this count as none. grpc-js cannot send a
 * timeout above 10^8 hours and throws, asynchronously, on one; 10^14 ms is
 * about 3,000 years.
 */
export const MAX_DEADLINE_MS = 1e14;

/**
 * The absolute deadline (ms since the epoch) of a `deadline` argument — ms from
 * now (finite, above 0) or a valid Date — or `undefined` for none (absent, or
 * more than {@link MAX_DEADLINE_MS} ahead). Anything else throws, naming `name`.
 * A Date already past is kept: the call then fails with its deadline at once.
 */
export function deadlineOf(deadline: unknown, name = "deadline"): number | undefined {
  if (deadline === undefined || deadline === null) return undefined;
  if (typeof deadline === "number") {
    if (!(deadline > 0 && Number.isFinite(deadline))) {
      throw new RangeError(`${name}: ${deadline} is no deadline; ms above 0 or a Date, or leave it out for none`);
    }
    return deadline > MAX_DEADLINE_MS ? undefined : Date.now() + deadline;
  }
  if (deadline instanceof Date) {
    const at = deadline.getTime();
    if (Number.isNaN(at)) throw new RangeError(`${name}: is an Invalid Date`);
    return at - Date.now() > MAX_DEADLINE_MS ? undefined : at;
  }
  throw new TypeError(`${name}: expected ms (a number) or a Date, got ${typeOf(deadline)}`);
}

/**
 * A timeout in ms where 0 means none (`callTimeoutMs`): a finite number >= 0,
 * else a RangeError naming `name`. More than {@link MAX_DEADLINE_MS} is none (0).
 */
export function timeoutMsOf(ms: unknown, name: string): number {
  if (typeof ms !== "number") throw new TypeError(`${name}: expected ms (a number), got ${typeOf(ms)}`);
  if (!(ms >= 0 && Number.isFinite(ms))) throw new RangeError(`${name}: ${ms} is no timeout; ms >= 0, or 0 for none`);
  return ms > MAX_DEADLINE_MS ? 0 : ms;
}

/** An interceptor that sends `authorization: Bearer <token>` on every call. */
export function bearerInterceptor(token: string): Interceptor {
  checkToken(token);
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
  // Keepalive pings: a connection that stops answering (a half-open connection,
  // a network black hole) is closed within 30 s and its streams resume. The
  // sidecar accepts client pings down to one a second, with or without calls.
  "grpc.keepalive_time_ms": 20_000,
  "grpc.keepalive_timeout_ms": 10_000,
  "grpc.keepalive_permit_without_calls": 1,
  // Connections of the channel's own: the channel that replaces one whose
  // connection went silent must not be handed the same connection.
  "grpc.use_local_subchannel_pool": 1,
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

/** A unary call in flight, as its client tracks it: `fail` ends it with `err` and cancels the RPC. */
export interface InFlight {
  fail(err: Error): void;
}

/**
 * Call a unary method and return a promise; errors become typed SidecarErrors.
 * While the call is in flight it is in `live`, so its client can end it (close()).
 */
export function unary<Req, Res>(
  method: UnaryMethod<Req, Res>,
  request: Req,
  timeoutMs?: number,
  live?: Set<InFlight>,
): Promise<Res> {
  const options: Partial<CallOptions> = {};
  if (timeoutMs !== undefined && timeoutMs > 0 && timeoutMs <= MAX_DEADLINE_MS) options.deadline = Date.now() + timeoutMs;
  return new Promise<Res>((resolve, reject) => {
    let call: ClientUnaryCall | undefined;
    const entry: InFlight = {
      fail(err) {
        live?.delete(entry);
        reject(err); // first: the RPC's own CANCELLED callback comes after and is ignored
        call?.cancel();
      },
    };
    live?.add(entry);
    try {
      call = method(request, new GrpcMetadata(), options, (err, res) => {
        live?.delete(entry);
        if (err) reject(fromGrpcError(err));
        else resolve(res);
      });
    } catch (err) {
      live?.delete(entry);
      throw err;
    }
  });
}

/** How long {@link connectFailure}'s call may take: a channel in TRANSIENT_FAILURE answers at once. */
const PROBE_MS = 500;

/**
 * Why `client`'s channel is not connected, in grpc-js's words: the error of a
 * call that does not wait for the channel (the standard health check, served
 * without a token), which carries the last connection attempt's failure
 * ("connect ENOENT /x.sock", "ECONNREFUSED", "unable to verify the first
 * certificate"...). `waitForReady` only says "Failed to connect before the
 * deadline" whatever the cause. Undefined when the call got through or gave
 * no reason within PROBE_MS (a channel still connecting).
 */
export function connectFailure(client: Client): Promise<ServiceError | undefined> {
  const bytes = (b: Buffer) => b;
  return new Promise((resolve) => {
    client.makeUnaryRequest("/grpc.health.v1.Health/Check", bytes, bytes, Buffer.alloc(0), new GrpcMetadata(),
      { deadline: Date.now() + PROBE_MS }, (err) => {
        resolve(err && err.code === GrpcStatus.UNAVAILABLE && err.details ? err : undefined);
      });
  });
}

/**
 * TLS for the client's channel, and the rule that keeps the bearer token off
 * the network in cleartext. Every TLS option is checked at connect, naming it:
 * a PEM file that cannot be read or holds no certificate (or key), a key that
 * is not the certificate's, a flag that is no boolean. Unchecked, a number was
 * read as a file descriptor (0: stdin, a hang), an empty path turned TLS off,
 * a file without a certificate failed every call later as UNAVAILABLE, a
 * `serverName` that is no string crashed the process inside grpc-js, and
 * `insecure: "false"` sent the token in cleartext.
 */
import { credentials as grpcCredentials, type ChannelCredentials } from "@grpc/grpc-js";
import { createPrivateKey, type KeyObject, X509Certificate } from "node:crypto";
import { readFileSync } from "node:fs";
import { isIP } from "node:net";
import type { ConnectionOptions } from "node:tls";
import { normalizeTarget, typeOf } from "./connection";

/** Where the TLS material of {@link tlsCredentials} comes from: PEM file paths. */
export interface TlsFiles {
  /** CA certificates that verify the sidecar's certificate (default: the system's roots). */
  caFile?: string;
  /** A client certificate, for a listener with a `client_ca` (mTLS); with `keyFile`. */
  certFile?: string;
  /** The private key of `certFile`. */
  keyFile?: string;
}

/** The TLS options of connect that choose the channel's credentials. */
export interface TlsOptions extends TlsFiles {
  tls?: boolean;
  serverName?: string;
  credentials?: ChannelCredentials;
}

/**
 * Channel credentials for a TLS listener of the sidecar, from PEM files, each
 * checked first: the error names the file's option (`caFile: ...`). An IP
 * target's address is not sent as the TLS server name (see {@link withoutIpServerName}).
 */
export function tlsCredentials(files: TlsFiles = {}): ChannelCredentials {
  const { caFile, certFile, keyFile } = files ?? {};
  if ((certFile == null) !== (keyFile == null)) {
    throw new TypeError("certFile and keyFile go together (the client certificate and its key)");
  }
  const ca = caFile == null ? null : pem("caFile", caFile);
  if (ca) certificate("caFile", caFile!, ca);
  const [cert, key] = certFile == null ? [null, null] : [pem("certFile", certFile), pem("keyFile", keyFile)];
  if (cert && key) {
    const x509 = certificate("certFile", certFile!, cert);
    if (!x509.checkPrivateKey(privateKey(keyFile!, key))) {
      throw new Error(`keyFile: ${keyFile} is not the key of certFile's certificate (${certFile})`);
    }
  }
  return withoutIpServerName(grpcCredentials.createSsl(ca, key, cert));
}

/** The bytes of the PEM file at `path`, option `name`; an error naming `name` when it cannot be read. */
function pem(name: string, path: unknown): Buffer {
  if (typeof path !== "string" || path === "") {
    throw new TypeError(`${name}: expected a PEM file's path (a non-empty string), got ${path === "" ? "an empty string" : typeOf(path)}`);
  }
  try {
    return readFileSync(path);
  } catch (err) {
    throw new Error(`${name}: cannot read ${path}: ${(err as Error).message}`, { cause: err });
  }
}

/** The first certificate of a PEM file; an error naming `name` when it holds none. */
function certificate(name: string, path: string, bytes: Buffer): X509Certificate {
  try {
    return new X509Certificate(bytes);
  } catch (err) {
    throw new Error(`${name}: ${path} holds no PEM certificate (${(err as Error).message})`, { cause: err });
  }
}

/** The private key of a PEM file; an error naming keyFile when it holds none (or an encrypted one). */
function privateKey(path: string, bytes: Buffer): KeyObject {
  try {
    return createPrivateKey(bytes);
  } catch (err) {
    throw new Error(`keyFile: ${path} holds no unencrypted PEM private key (${(err as Error).message})`, { cause: err });
  }
}

/**
 * `creds`, whose TLS connections send no IP address as their server name (SNI).
 * grpc-js gives Node's tls.connect the target's host as `servername` whatever it
 * is, and for an IP (127.0.0.1:50051) Node prints a DeprecationWarning (DEP0123:
 * RFC 6066 allows only host names there) on the process's stderr. Verification is
 * unchanged: without a server name Node checks the certificate against `host`,
 * the same IP (and a `serverName` option checks its own name in any case).
 * grpc-js keeps the options in its connector's `connectionOptions`; a grpc-js
 * without them is left as it is (it warns again, nothing else changes).
 */
function withoutIpServerName(creds: ChannelCredentials): ChannelCredentials {
  const create = creds._createSecureConnector.bind(creds);
  creds._createSecureConnector = (target, options, callCredentials) => {
    const connector = create(target, options, callCredentials);
    const tls = (connector as { connectionOptions?: ConnectionOptions }).connectionOptions;
    if (tls?.servername !== undefined && isIP(tls.servername) !== 0) delete tls.servername;
    return connector;
  };
  return creds;
}

/**
 * The channel credentials connect's options ask for: `credentials` as given,
 * TLS when any of `tls: true`, `caFile`, `certFile`, `keyFile` is given, else
 * plain. Each option is checked first (a TypeError naming it): `tls` a
 * boolean, `serverName` a non-empty string, `credentials` grpc-js credentials.
 */
export function channelCredentials(o: TlsOptions): ChannelCredentials {
  checkBoolean(o.tls, "tls");
  if (o.serverName != null && (typeof o.serverName !== "string" || o.serverName === "")) {
    throw new TypeError(`serverName: expected a host name (a non-empty string), got ${typeOf(o.serverName)}`);
  }
  if (o.credentials != null) {
    if (typeof (o.credentials as { _isSecure?: unknown })._isSecure !== "function") {
      throw new TypeError(`credentials: expected grpc-js ChannelCredentials, got ${typeOf(o.credentials)}`);
    }
    return o.credentials;
  }
  if (o.tls || o.caFile != null || o.certFile != null || o.keyFile != null) {
    return tlsCredentials({ caFile: o.caFile, certFile: o.certFile, keyFile: o.keyFile });
  }
  return grpcCredentials.createInsecure();
}

/** `v` absent (undefined, null) or a boolean; else a TypeError naming `name` ("false" is truthy). */
function checkBoolean(v: unknown, name: string): void {
  if (v != null && typeof v !== "boolean") throw new TypeError(`${name}: expected a boolean, got ${typeOf(v)}`);
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
 * channel to a host that is not loopback throws unless `insecure` is true
 * (a boolean: anything else throws, naming it).
 */
export function checkCleartext(target: string, token: string | undefined, secure: boolean, insecure: unknown): void {
  checkBoolean(insecure, "insecure");
  if (token && !secure && insecure !== true && !isLocalTarget(target)) {
    throw new Error(
      `refusing to send the bearer token in cleartext to ${target}: connect with TLS ` +
        "(tls: true, caFile: ...) to a TLS listener, or pass insecure: true to send it anyway",
    );
  }
}

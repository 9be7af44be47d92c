#!/usr/bin/env node
/**
 * Conformance runner for the Node client (protocol: clients/conformance/README.md).
 *
 *     node dist/conformance/runner.js --lang node --unix unix:/p/sidecar.sock \
 *       --tcp 127.0.0.1:PORT --token TOKEN --tls 127.0.0.1:PORT --mtls 127.0.0.1:PORT \
 *       --ca CA.pem --wrong-ca OTHER.pem --client-cert C.pem --client-key C.key \
 *       --foreign-cert F.pem --foreign-key F.key \
 *       --scenarios clients/conformance/scenarios.json
 *
 * Runs every scenario in file order with `{lang}` replaced, and prints one JSON
 * line per scenario: {"scenario": id, "ok": bool, "error"?: text}. Exits 0 when
 * it ran them all, whatever their outcome. Uses the library only.
 */
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { connect } from "../src/client";
import { SidecarError } from "../src/errors";
import { HANDLERS, type Ctx, type Scenario } from "./scenarios";
import { substitute } from "./substitute";

/** Each scenario should finish within this (README: 20 s). */
const SCENARIO_TIMEOUT_MS = 20_000;

function describe(err: unknown): string {
  if (err instanceof SidecarError) {
    return `${err.name} (${err.codeName}${err.reason ? `, reason ${err.reason}` : ""}): ${err.message}`;
  }
  return err instanceof Error ? err.message : String(err);
}

async function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const t = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} did not finish within ${ms / 1000} s`)), ms);
  });
  try {
    return await Promise.race([p, t]);
  } finally {
    clearTimeout(timer);
  }
}

async function main(): Promise<number> {
  const { values } = parseArgs({
    options: {
      lang: { type: "string", default: "node" },
      unix: { type: "string" },
      tcp: { type: "string" },
      token: { type: "string", default: "" },
      proxy: { type: "string" },
      "proxy-control": { type: "string" },
      tls: { type: "string" },
      mtls: { type: "string" },
      ca: { type: "string" },
      "wrong-ca": { type: "string" },
      "client-cert": { type: "string" },
      "client-key": { type: "string" },
      "foreign-cert": { type: "string" },
      "foreign-key": { type: "string" },
      scenarios: { type: "string", default: "clients/conformance/scenarios.json" },
      only: { type: "string", multiple: true },
    },
  });
  if (!values.unix) {
    process.stderr.write("runner: --unix is required\n");
    return 2;
  }
  const lang = values.lang!;
  const doc = JSON.parse(readFileSync(values.scenarios!, "utf8")) as { scenarios: Scenario[] };
  const scenarios = substitute(doc.scenarios, lang);

  const unix = connect(values.unix);
  const tcp = values.tcp ? connect(values.tcp, { token: values.token || undefined }) : undefined;
  const v = values;
  const tls =
    v.tls && v.mtls && v.ca && v["wrong-ca"] && v["client-cert"] && v["client-key"] && v["foreign-cert"] && v["foreign-key"]
      ? {
          tls: v.tls, mtls: v.mtls, ca: v.ca, wrongCa: v["wrong-ca"], clientCert: v["client-cert"],
          clientKey: v["client-key"], foreignCert: v["foreign-cert"], foreignKey: v["foreign-key"],
        }
      : undefined;
  const ctx: Ctx = {
    lang,
    unix,
    tcp,
    tcpTarget: values.tcp,
    token: values.token ?? "",
    tls,
    unixTarget: values.unix,
    proxy: values.proxy,
    proxyControl: values["proxy-control"],
  };

  for (const sc of scenarios) {
    if (values.only && !values.only.includes(sc.id)) continue;
    const handler = HANDLERS[sc.id];
    let line: { scenario: string; ok: boolean; error?: string };
    try {
      if (!handler) throw new Error(`scenario ${sc.id} is not implemented by the node runner`);
      await withTimeout(handler(sc, ctx), SCENARIO_TIMEOUT_MS, sc.id);
      line = { scenario: sc.id, ok: true };
    } catch (err) {
      line = { scenario: sc.id, ok: false, error: describe(err) };
    }
    process.stdout.write(JSON.stringify(line) + "\n");
  }
  unix.close();
  tcp?.close();
  return 0;
}

main().then(
  (code) => process.exit(code),
  (err) => {
    process.stderr.write(`runner: ${describe(err)}\n`);
    process.exit(1);
  },
);

// Run by clients/packaging/check.sh in a scratch project that installed the packed
// tarball: tsc type-checks this file against the package's .d.ts (through its
// "exports"/"types"), then node runs it: one real call to a live sidecar.
import { connect, ErrorReason, frameKind, SERVICE_CONFIG, type Session } from "agent-sidecar";

async function main(target: string): Promise<void> {
  const client = connect(target);
  try {
    const source = { platform: "package-check", chatId: "node" };
    const session: Session = await client.getOrCreateSession(source);
    const frames = await client.prompt({ source, text: "hello from the tarball" }).collect();
    const last = frames[frames.length - 1];
    if (frameKind(last) !== "completed" || last.event?.$case !== "completed") {
      throw new Error(`the turn ended ${frameKind(last)}`);
    }
    if (last.event.value.finalText !== "hello from the tarball") throw new Error(last.event.value.finalText);
    if (ErrorReason[ErrorReason.AGENT_BUSY] !== "AGENT_BUSY") throw new Error("ErrorReason");
    if (!SERVICE_CONFIG.includes("GetSession")) throw new Error("SERVICE_CONFIG");
    console.log(`package-check: node client: ${session.sessionKey} answered ${JSON.stringify(last.event.value.finalText)}`);
  } finally {
    client.close();
  }
}

main(process.argv[2]).catch((err) => {
  console.error(err);
  process.exit(1);
});

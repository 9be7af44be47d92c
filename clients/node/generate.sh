#!/usr/bin/env bash
# Regenerate the TypeScript code in clients/node/src/gen from proto/.
#
# Run from the repository root (this is what `make clients` does):
#   clients/node/generate.sh
#
# protoc itself is the one bundled with grpcio-tools in .venv (the same protoc
# for every language); the plugin is ts-proto, pinned in package.json and
# package-lock.json, installed with `npm ci` when node_modules is missing.
# Besides proto/, it generates the two google.rpc protos vendored under
# proto-vendor/ (status, error_details) that typed-error decoding needs.
# Output is deterministic: rerunning it leaves no diff.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"

PY="${PY:-.venv/bin/python}"
NODE_DIR=clients/node
OUT=$NODE_DIR/src/gen
PLUGIN=$NODE_DIR/node_modules/.bin/protoc-gen-ts_proto

if ! "$PY" -c 'import grpc_tools' 2>/dev/null; then
  echo "generate.sh: $PY has no grpc_tools; run 'make install' first" >&2
  exit 1
fi
if [[ ! -x "$PLUGIN" ]]; then
  (cd "$NODE_DIR" && npm ci --no-fund --no-audit --loglevel=error)
fi
GRPC_TOOLS_PROTO="$("$PY" -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))')"

# Options (see README.md, "Generated code"):
#   outputServices=grpc-js   service clients/definitions for @grpc/grpc-js
#   esModuleInterop=true     matches tsconfig's esModuleInterop
#   useOptionals=messages    message-typed fields are optional (`frame?: ActivityFrame`)
#   oneof=unions-value       oneofs as `{ $case: "completed"; value: Completed }`
#   removeEnumPrefix=true    DeliveryMode.QUEUE rather than DeliveryMode.DELIVERY_MODE_QUEUE
#   unrecognizedEnum=false   no synthetic UNRECOGNIZED = -1 member
#   forceLong=number         int64 as number (counters and seqs stay far below 2^53)
#   useDate=true             Timestamp as Date
OPTS="outputServices=grpc-js,esModuleInterop=true,useOptionals=messages,oneof=unions-value"
OPTS+=",removeEnumPrefix=true,unrecognizedEnum=false,forceLong=number,useDate=true,env=node"

# Start from a clean output dir so a removed .proto leaves no stale file.
rm -rf "$OUT"
mkdir -p "$OUT"

# Sorted file lists: stable input order, stable output.
mapfile -t protos < <(cd proto && LC_ALL=C ls agent_sidecar/v1/*.proto)
mapfile -t vendored < <(cd "$NODE_DIR/proto-vendor" && LC_ALL=C ls google/rpc/*.proto)

"$PY" -m grpc_tools.protoc -Iproto -I"$NODE_DIR/proto-vendor" -I"$GRPC_TOOLS_PROTO" \
  --plugin=protoc-gen-ts_proto="$PLUGIN" \
  --ts_proto_out="$OUT" --ts_proto_opt="$OPTS" \
  "${protos[@]}" "${vendored[@]}"

echo "generate.sh: wrote $(find "$OUT" -name '*.ts' | wc -l) files to $OUT"

#!/usr/bin/env bash
# Regenerate the Go code in clients/go/agentsidecarv1 from proto/.
#
# Run from the repository root (this is what `make clients` does):
#   clients/go/generate.sh
#
# protoc itself is the one bundled with grpcio-tools in .venv (the same protoc
# for every language); the Go plugins are pinned below and installed into
# .tools/bin. Output is deterministic: rerunning it leaves no diff.
set -euo pipefail

PROTOC_GEN_GO_VERSION=v1.36.12      # keep in step with google.golang.org/protobuf in go.mod
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2

root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"

PY="${PY:-.venv/bin/python}"
TOOLS_BIN="$root/.tools/bin"
OUT=clients/go/agentsidecarv1
MODULE=github.com/agent-sidecar/agent-sidecar/clients/go

if ! "$PY" -c 'import grpc_tools' 2>/dev/null; then
  echo "generate.sh: $PY has no grpc_tools; run 'make install' first" >&2
  exit 1
fi

# Install a pinned plugin unless the right version is already there.
ensure_plugin() { # name, package, version, version-as-printed
  local bin="$TOOLS_BIN/$1"
  if [[ -x "$bin" ]] && "$bin" --version 2>/dev/null | grep -qF -- "$4"; then
    return
  fi
  mkdir -p "$TOOLS_BIN"
  GOBIN="$TOOLS_BIN" go install "$2@$3"
}
ensure_plugin protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go \
  "$PROTOC_GEN_GO_VERSION" "$PROTOC_GEN_GO_VERSION"
ensure_plugin protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc \
  "$PROTOC_GEN_GO_GRPC_VERSION" "${PROTOC_GEN_GO_GRPC_VERSION#v}"

# Start from a clean output dir so a removed .proto leaves no stale file.
mkdir -p "$OUT"
rm -f "$OUT"/*.pb.go

# Sorted file list: stable input order, stable output.
mapfile -t protos < <(cd proto && LC_ALL=C ls agent_sidecar/v1/*.proto)

"$PY" -m grpc_tools.protoc -Iproto \
  --plugin=protoc-gen-go="$TOOLS_BIN/protoc-gen-go" \
  --plugin=protoc-gen-go-grpc="$TOOLS_BIN/protoc-gen-go-grpc" \
  --go_out=clients/go --go_opt=module="$MODULE" \
  --go-grpc_out=clients/go --go-grpc_opt=module="$MODULE" \
  "${protos[@]}"

echo "generate.sh: wrote $(ls "$OUT"/*.pb.go | wc -l) files to $OUT"

#!/usr/bin/env bash
# Regenerate the Python client's protobuf/gRPC modules from proto/.
#
# Why not reuse server/agent_sidecar/v1: the server distribution owns the import
# name `agent_sidecar.v1`, and an adapter installs only the client. So the
# client carries its own copy under agent_sidecar_client._proto, and the
# generated `from agent_sidecar.v1 import x_pb2` lines are rewritten to point
# there. Both packages then install side by side in one venv (the descriptors
# are byte-identical, so protobuf's default pool accepts both).
#
# Run from the repository root (`make clients` does). Output is deterministic;
# CI regenerates and checks `git diff --exit-code`.
set -euo pipefail

PY="${PYTHON:-.venv/bin/python}"
OUT=clients/python/src/agent_sidecar_client/_proto
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

"$PY" -m grpc_tools.protoc -Iproto \
  --python_out="$TMP" --pyi_out="$TMP" --grpc_python_out="$TMP" \
  proto/agent_sidecar/v1/*.proto

rm -f "$OUT"/*_pb2.py "$OUT"/*_pb2.pyi "$OUT"/*_pb2_grpc.py
for f in "$TMP"/agent_sidecar/v1/*.py "$TMP"/agent_sidecar/v1/*.pyi; do
  sed -e 's/^from agent_sidecar\.v1 import /from agent_sidecar_client._proto import /' \
    "$f" > "$OUT/$(basename "$f")"
done

cat > "$OUT/__init__.py" <<'PYEOF'
"""Generated protobuf and gRPC modules for agent_sidecar.v1 (see generate.sh).

Do not edit: `make clients` rewrites this folder from proto/.
"""
PYEOF

# Fail loudly if a generated import escaped the rewrite.
if grep -rn '^from agent_sidecar\.v1\|^import agent_sidecar' "$OUT"; then
  echo "generate.sh: unrewritten agent_sidecar.v1 import left in $OUT" >&2
  exit 1
fi

#!/usr/bin/env bash
# Run the Node conformance runner (protocol: clients/conformance/README.md).
#
#   clients/node/run-conformance.sh --lang node --unix unix:/p/sidecar.sock \
#     --tcp 127.0.0.1:PORT --token TOKEN [--tls … --mtls … --ca … (README)] \
#     --scenarios clients/conformance/scenarios.json
#
# Installs dependencies when missing (npm ci) and builds (npm run build) first;
# their output goes to stderr so stdout carries only the runner's JSON lines.
# Relative paths in the arguments are taken from the caller's directory.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
if [[ ! -d "$here/node_modules" ]]; then
  (cd "$here" && npm ci --no-fund --no-audit --loglevel=error) >&2
fi
(cd "$here" && npm run --silent build) >&2
exec node "$here/dist/conformance/runner.js" "$@"

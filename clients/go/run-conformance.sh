#!/usr/bin/env bash
# Build the Go conformance runner into clients/go/bin/ and run it with the
# given arguments (the runner protocol of clients/conformance/README.md):
#   clients/go/run-conformance.sh --lang go --unix unix:/d/sidecar.sock \
#       --tcp 127.0.0.1:PORT --token TOKEN [--tls … --mtls … --ca … (README)] \
#       --scenarios clients/conformance/scenarios.json
# Relative paths in the arguments are taken from the caller's directory.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
go -C "$here" build -o "$here/bin/conformance" ./cmd/conformance
exec "$here/bin/conformance" "$@"

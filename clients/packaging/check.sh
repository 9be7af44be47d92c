#!/usr/bin/env bash
# The pack-and-install check: build every artifact the way a release would, install
# each where a user would (outside this repository), and make one real call from it
# to a live sidecar that runs from the installed server wheel.
#
#   server   python -m build (sdist, then the wheel from it) → fresh venv → agent-sidecar serve
#   python   python -m build clients/python → same venv → connect(), a session and a prompt
#   node     npm ci + npm pack in a copy of the tracked files of clients/node (a clean
#            clone) → the tarball must hold the built JS, the .d.ts and the service config
#            → npm install into a scratch project → tsc type-checks against the package's
#            types → node runs a session and a prompt
#   go       an outside module requiring github.com/agent-sidecar/agent-sidecar/clients/go
#            with a replace → a copy of its tracked files → go build → a session and a prompt
#
# Also: every package declares the one licence, Apache-2.0, and carries the LICENSE file.
# Needs the registries (PyPI, npm, the Go proxy) for the packages' dependencies. Run
# from anywhere: `make package-check` or clients/packaging/check.sh. KEEP=1 keeps the
# scratch directory.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
here="$root/clients/packaging"
PY="${PY:-$root/.venv/bin/python}"
work="$(mktemp -d "${TMPDIR:-/tmp}/sidecar-package-check.XXXXXX")"
sidecar_pid=""
declare -A result=()

cleanup() {
  for pid in ${node_pid:-} ${go_pid:-}; do kill "$pid" 2>/dev/null || true; done
  if [[ -n "$sidecar_pid" ]] && kill -0 "$sidecar_pid" 2>/dev/null; then
    kill -TERM "$sidecar_pid" && wait "$sidecar_pid" || true
  fi
  if [[ "${KEEP:-}" == 1 ]]; then echo "package-check: kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

step() { echo "package-check: [${SECONDS}s] $*"; }
fail() { echo "package-check: FAILED: $*" >&2; [[ -f "$work/sidecar.log" ]] && tail -20 "$work/sidecar.log" >&2; exit 1; }

# A copy of the tracked files of one directory: what a fresh clone holds (working-tree
# contents, so uncommitted edits count, untracked files and build output do not).
clean_copy() { # repo-relative dir, destination
  mkdir -p "$2"
  (cd "$root" && git ls-files -z -- "$1" | xargs -0 cp --parents -t "$2")
}

# -- Node: npm pack from a clean clone, installed into a scratch project ---------------
prepare_node() {
  step "node: npm ci and npm pack in a clean copy of clients/node"
  clean_copy clients/node "$work/node-clone"
  node_src="$work/node-clone/clients/node"
  (cd "$node_src" && npm ci --no-fund --no-audit --loglevel=error) || return 1
  (cd "$node_src" && npm pack --json --pack-destination "$work" > "$work/npm-pack.json") || return 1
  node -e '
    const files = new Set(require(process.argv[1])[0].files.map((f) => f.path));
    const need = ["package.json", "LICENSE", "README.md", "dist/src/index.js", "dist/src/index.d.ts",
                  "dist/src/service_config.json", "dist/src/gen/agent_sidecar/v1/error_reason.js"];
    const missing = need.filter((f) => !files.has(f));
    if (missing.length) { console.error("the tarball lacks", missing); process.exit(1); }
    console.log(`package-check: npm pack holds ${files.size} files`);
  ' "$work/npm-pack.json" || return 1
  local tarball="$work/$(node -e 'console.log(require(process.argv[1])[0].filename)' "$work/npm-pack.json")"
  step "node: install the tarball into a scratch project and type-check against its .d.ts"
  mkdir -p "$work/node-app" && cp "$here/scratch/check_node.ts" "$work/node-app/"
  # The compiler and Node's types come from the clean copy; the package from its tarball.
  sed -e "s|@NODE_TYPES@|$node_src/node_modules/@types|" "$here/scratch/tsconfig.json" > "$work/node-app/tsconfig.json"
  (cd "$work/node-app" && npm init -y > /dev/null && npm install --no-fund --no-audit --loglevel=error "$tarball") || return 1
  (cd "$work/node-app" && "$node_src/node_modules/.bin/tsc" -p tsconfig.json) || return 1
  node -e 'const p = require(process.argv[1]); if (p.license !== "Apache-2.0") { console.error(p.license); process.exit(1) }' \
    "$work/node-app/node_modules/agent-sidecar/package.json" || return 1
}

# -- Go: an outside module with a replace ----------------------------------------------
prepare_go() {
  step "go: build an outside module against a clean copy of clients/go"
  clean_copy clients/go "$work/go-clone"
  local src="$work/go-clone/clients/go" module go_version
  module="$(cd "$src" && go list -m)"
  [[ "$module" == "github.com/agent-sidecar/agent-sidecar/clients/go" ]] || { echo "clients/go is module $module"; return 1; }
  grep -q "Apache License" "$src/LICENSE" || { echo "no Apache LICENSE in the Go module"; return 1; }
  go_version="$(cd "$src" && go mod edit -json | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).Go))')"
  mkdir -p "$work/go-app" && cp "$here/scratch/check_go.go" "$work/go-app/main.go"
  printf 'module example.org/sidecar-package-check\n\ngo %s\n\nrequire %s v0.0.0\n\nreplace %s => %s\n' \
    "$go_version" "$module" "$module" "$src" > "$work/go-app/go.mod"
  (cd "$work/go-app" && go mod tidy && go build -o check-go .) || return 1
}

# Node and Go get ready in the background while the Python packages build and install.
prepare_node > "$work/node.log" 2>&1 &
node_pid=$!
prepare_go > "$work/go.log" 2>&1 &
go_pid=$!

# -- Python: server and client, sdist and wheel -----------------------------------------
step "python -m build: server and client (sdist, wheel from the sdist)"
"$PY" -m build --outdir "$work/dist" "$root" > "$work/build-server.log" 2>&1 \
  || { tail -30 "$work/build-server.log"; fail "building the server"; }
"$PY" -m build --outdir "$work/dist" "$root/clients/python" > "$work/build-client.log" 2>&1 \
  || { tail -30 "$work/build-client.log"; fail "building the Python client"; }
result[server]="built"; result[python]="built"

step "installing both wheels into a fresh venv"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q --disable-pip-version-check \
  "$work"/dist/agent_sidecar-*.whl "$work"/dist/agent_sidecar_client-*.whl > "$work/pip.log" 2>&1 \
  || { tail -30 "$work/pip.log"; fail "pip install of the wheels"; }

step "starting the sidecar from the installed wheel"
cd "$work"  # nothing of the repository on any path from here on
"$work/venv/bin/agent-sidecar" serve --data-dir "$work/data" --workers 1 > "$work/sidecar.log" 2>&1 &
sidecar_pid=$!
target="unix:$work/data/sidecar.sock"
for _ in $(seq 1 300); do
  "$work/venv/bin/agent-sidecar" health --target "$target" --timeout 1 > /dev/null 2>&1 && break
  kill -0 "$sidecar_pid" 2>/dev/null || fail "the installed sidecar exited"
  sleep 0.1
done
"$work/venv/bin/agent-sidecar" health --target "$target" > /dev/null || fail "the installed sidecar is not SERVING"
result[server]="built, installed, serving"

step "python: a call from the installed client"
"$work/venv/bin/python" "$here/scratch/check_python.py" "$target" "$work/venv" || fail "the Python client's call"
result[python]="built, installed, called"

wait "$node_pid" || { cat "$work/node.log"; fail "packing or installing the npm package"; }
grep "^package-check" "$work/node.log" || true
step "node: a call from the installed package"
(cd "$work/node-app" && node check_node.js "$target") || fail "the Node client's call"
result[node]="packed, installed, type-checked, called"

wait "$go_pid" || { cat "$work/go.log"; fail "building the outside Go module"; }
grep '^package-check' "$work/go.log" || true
step "go: a call from the outside module"
(cd "$work/go-app" && ./check-go "$target") || fail "the Go client's call"
result[go]="built, called"

# -- one licence ------------------------------------------------------------------------
step "licences"
for f in "$root/clients/python/LICENSE" "$root/clients/node/LICENSE" "$root/clients/go/LICENSE"; do
  cmp -s "$root/LICENSE" "$f" || fail "$f differs from the root LICENSE"
done

kill -TERM "$sidecar_pid"; wait "$sidecar_pid" || fail "the sidecar did not stop cleanly"
sidecar_pid=""
echo
printf '%-8s %s\n' artifact result
for a in server python node go; do printf '%-8s %s\n' "$a" "${result[$a]}"; done
echo "4 passed, 0 failed"

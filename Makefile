# agent-sidecar — every entry point a developer or CI needs.
#   make run     install into .venv, then serve ./data (Unix socket ./data/sidecar.sock)
#   make test    install, lint, breaking-change check, generated code and docs up to date, the test
#                suite (on SQLite, then on PostgreSQL), the conformance table, and the
#                pack-and-install check of every package
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
DATA ?= ./data
STAMP := $(VENV)/.installed
TOOLS := .tools
PYTEST_ARGS ?=
# Tests spread over four processes (pytest-xdist; they mostly wait on their
# sidecars, so more processes than cores), a module's tests in one (its
# module-scoped sidecar), the modules in the order tests/conftest.py gives
# (runs_long ones first: by test count alone, xdist's own order, a one-test
# soak started last and ended the run alone); XDIST= runs them in one process.
XDIST ?= -n 4 --dist loadscope --no-loadscope-reorder

.PHONY: install run test pytest client-tests conformance lint breaking proto-baseline proto clients docs \
	check-generated package-check bench bench-report soak clean

install: $(STAMP)

$(STAMP): pyproject.toml clients/python/pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,bench,postgres,otel]' -e clients/python
	touch $(STAMP)

run: install
	$(BIN)/agent-sidecar serve --data-dir $(DATA)

# Python code for the server (server/agent_sidecar/v1).
proto: install
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=server --pyi_out=server \
		--grpc_python_out=server proto/agent_sidecar/v1/*.proto
	touch server/agent_sidecar/v1/__init__.py

# Every client's generated code (Python, Go, TypeScript), from the same protoc, and each
# client's copy of the shared gRPC service config (retry policy of the idempotent reads).
SERVICE_CONFIG_COPIES := clients/python/src/agent_sidecar_client clients/node/src clients/go/sidecar
clients: proto
	clients/python/generate.sh
	clients/go/generate.sh
	clients/node/generate.sh
	for d in $(SERVICE_CONFIG_COPIES); do cp clients/service_config.json $$d/service_config.json; done

# The API reference docs/api.md (and semantics.md's reason table) from the protos' comments;
# configuration.md's key tables from the config declarations.
docs: install
	$(BIN)/python docs/gen/api_reference.py
	$(BIN)/agent-sidecar config reference --write docs/configuration.md

GENERATED := server/agent_sidecar/v1 clients/python/src clients/go/agentsidecarv1 clients/node/src/gen \
	clients/python/src/agent_sidecar_client/service_config.json clients/node/src/service_config.json \
	clients/go/sidecar/service_config.json docs/api.md docs/semantics.md docs/configuration.md

# CI: generated code and docs must match proto/ (regenerate, then no diff and no new file).
check-generated: clients docs
	git diff --exit-code -- $(GENERATED) && test -z "$$(git status --porcelain -- $(GENERATED))" \
		|| { git status --short -- $(GENERATED); echo "generated code or docs are stale: run 'make clients docs' and commit"; exit 1; }

$(TOOLS)/node_modules/.bin/buf:
	mkdir -p $(TOOLS) && cd $(TOOLS) && npm install --silent --no-fund --no-audit @bufbuild/buf@1.75.0

# buf on the protos; ruff on all Python; mypy on the server (pyproject.toml) and, strict,
# on the public Python client (clients/python/pyproject.toml).
lint: install $(TOOLS)/node_modules/.bin/buf
	$(TOOLS)/node_modules/.bin/buf lint
	$(BIN)/ruff check
	$(BIN)/mypy
	cd clients/python && ../../$(BIN)/mypy

# v1 must stay wire- and source-compatible with the recorded baseline (buf's FILE rules).
# A recorded image, not git history: CI's clone may be shallow.
breaking: $(TOOLS)/node_modules/.bin/buf
	$(TOOLS)/node_modules/.bin/buf breaking --against proto/v1-baseline.json

# Re-record the baseline: only when a version ships (it is what `breaking` protects).
proto-baseline: $(TOOLS)/node_modules/.bin/buf
	$(TOOLS)/node_modules/.bin/buf build --exclude-source-info -o -#format=json \
		| $(PY) -m json.tool --indent 1 > proto/v1-baseline.json

# The suite twice: everything on SQLite, then the behavioural folders (and the
# PostgreSQL backend's own tests, and the database outage test, which starts
# and stops a server of its own) with every sidecar on PostgreSQL: the server
# AGENT_SIDECAR_TEST_PG_DSN names (.ci/run starts one), else one the tests start.
# Tests marked store_free (no sidecar, no store) run on the SQLite pass only.
# The DSN goes to pytest alone (which hides it from the sidecars it starts):
# every sidecar reads AGENT_SIDECAR_* as config, the other steps' too.
PG_TESTS := tests/api tests/sessions tests/turns tests/recovery tests/tools tests/models tests/store \
	tests/cluster/test_db_outage.py
PG_DSN := $(AGENT_SIDECAR_TEST_PG_DSN)
unexport AGENT_SIDECAR_TEST_PG_DSN
pytest: install
	AGENT_SIDECAR_TEST_PG_DSN="$(PG_DSN)" $(BIN)/python -m pytest tests clients/python/tests \
		$(XDIST) $(PYTEST_ARGS)
	AGENT_SIDECAR_TEST_PG_DSN="$(PG_DSN)" $(BIN)/python -m pytest --backend postgres $(PG_TESTS) \
		$(XDIST) $(PYTEST_ARGS)

# The two soak tests (random faults under load; tests/helpers/chaos.py) for longer,
# with another seed: make soak SEED=7 SOAK_SECONDS=600
SEED ?= 1
SOAK_SECONDS ?= 300
soak: install
	CHAOS_SEED=$(SEED) CHAOS_SECONDS=$(SOAK_SECONDS) AGENT_SIDECAR_TEST_PG_DSN="$(PG_DSN)" $(BIN)/python -m pytest \
		tests/recovery/test_soak.py tests/cluster/test_cluster_soak.py -n 2 --timeout 0 $(PYTEST_ARGS)

# The Go and Node clients' own unit tests (no sidecar needed).
client-tests:
	cd clients/go && go vet ./... && go test ./...
	cd clients/node && { test -d node_modules || npm ci --no-fund --no-audit; } && npm test

# One sidecar, every client's runner, a scenario × language table.
conformance: install
	$(BIN)/python clients/conformance/run.py --langs python,node,go

test: install lint breaking check-generated pytest client-tests conformance package-check

# Pack every artifact (wheels, npm tarball, Go module), install each into a scratch
# project outside the repo and make one call from it to a sidecar run from the wheel.
package-check: install
	clients/packaging/check.sh

bench: install
	$(BIN)/python benchmarks/store_bench.py
	$(BIN)/python benchmarks/turns_bench.py
	$(BIN)/python benchmarks/stream_bench.py

# The standard sweep (agent-sidecar bench --compare-bare) against a fresh sidecar on
# the echo model at 20 ms per token: benchmarks/results/bench-report.{png,json}.
# A few minutes; smaller: make bench-report SWEEP=2,4 DURATION=3 WORDS=20; COALESCE=0 for
# one text_delta frame per model delta (default: the sidecar's [stream] coalesce_ms);
# FIRST_DELTA_SLO=100 for a knee that also keeps the first delta's p99 within 100 ms;
# CLIENTS=2 to drive the load from two bench client processes; FIND_KNEE=2000 to go on
# past the sweep (levels ~1.5x apart, up to 2000) until each server has missed the SLO;
# REPEAT=3 to run the sweep three times and report each one's knee and their median.
SWEEP ?= 25,50,100,200,400,800
DURATION ?= 20
WORDS ?= 200
COALESCE ?=
FIRST_DELTA_SLO ?=
CLIENTS ?=
FIND_KNEE ?=
REPEAT ?=
bench-report: install
	$(BIN)/python benchmarks/stream_bench.py --sweep $(SWEEP) --duration $(DURATION) \
		--prompt-words $(WORDS) $(if $(COALESCE),--coalesce-ms $(COALESCE)) \
		$(if $(FIRST_DELTA_SLO),--first-delta-slo $(FIRST_DELTA_SLO)) $(if $(CLIENTS),--clients $(CLIENTS)) \
		$(if $(FIND_KNEE),--find-knee $(FIND_KNEE)) $(if $(REPEAT),--repeat $(REPEAT)) --out benchmarks/results --name bench-report$(if $(COALESCE),-coalesce-$(COALESCE))

clean:
	rm -rf $(VENV) $(TOOLS)

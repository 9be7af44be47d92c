# agent-sidecar — every entry point a developer or CI needs.
#   make run     install into .venv, then serve ./data (Unix socket ./data/sidecar.sock)
#   make test    install, lint, check generated code, the test suite, the conformance table
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
DATA ?= ./data
STAMP := $(VENV)/.installed
TOOLS := .tools
PYTEST_ARGS ?=

.PHONY: install run test pytest client-tests conformance lint proto clients check-generated bench clean

install: $(STAMP)

$(STAMP): pyproject.toml clients/python/pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]' -e clients/python
	touch $(STAMP)

run: install
	$(BIN)/agent-sidecar serve --data-dir $(DATA)

# Python code for the server (server/agent_sidecar/v1).
proto: install
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=server --pyi_out=server \
		--grpc_python_out=server proto/agent_sidecar/v1/*.proto
	touch server/agent_sidecar/v1/__init__.py

# Every client's generated code (Python, Go, TypeScript), from the same protoc.
clients: proto
	clients/python/generate.sh
	clients/go/generate.sh
	clients/node/generate.sh

# CI: generated code must match proto/ (regenerate, then no diff).
check-generated: clients
	git diff --exit-code -- server/agent_sidecar/v1 clients/python/src clients/go/agentsidecarv1 clients/node/src/gen \
		|| { echo "generated code is stale: run 'make clients' and commit"; exit 1; }

$(TOOLS)/node_modules/.bin/buf:
	mkdir -p $(TOOLS) && cd $(TOOLS) && npm install --silent --no-fund --no-audit @bufbuild/buf@1.75.0

lint: $(TOOLS)/node_modules/.bin/buf
	$(TOOLS)/node_modules/.bin/buf lint

pytest: install
	$(BIN)/python -m pytest tests clients/python/tests $(PYTEST_ARGS)

# The Go and Node clients' own unit tests (no sidecar needed).
client-tests:
	cd clients/go && go vet ./... && go test ./...
	cd clients/node && { test -d node_modules || npm ci --no-fund --no-audit; } && npm test

# One sidecar, every client's runner, a scenario × language table.
conformance: install
	$(BIN)/python clients/conformance/run.py --langs python,node,go

test: install lint check-generated pytest client-tests conformance

bench: install
	$(BIN)/python benchmarks/store_bench.py
	$(BIN)/python benchmarks/turns_bench.py

clean:
	rm -rf $(VENV) $(TOOLS)

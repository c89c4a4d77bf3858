# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export RAY_AUTH_MODE ?= disabled
export PIP_DISABLE_PIP_VERSION_CHECK = 1

# The local Kubernetes API server's tools (../shared/k8s): the Kubernetes tests run against it.
K8S_TOOLS ?= $(firstword $(wildcard ../shared/k8s /work/shared/k8s))

.PHONY: setup browser kube-apiserver demo test test-slow lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch is pinned to the CPU wheel: any open range pulls a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,peers]'
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(VENV)/bin/elasticps demo

# The dashboard test drives a real headless Chromium (Debian's package).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
		else echo "chromium missing: install Debian's chromium to run the dashboard test" >&2; fi; }

# Builds kube-apiserver once per machine (~6 min, cached); the tests start and stop it.
kube-apiserver:
	@if [ -n "$(K8S_TOOLS)" ]; then $(K8S_TOOLS)/build-kube-apiserver >/dev/null; \
	else echo "no ../shared/k8s here: the Kubernetes tests will be skipped" >&2; fi

PYTEST := ELASTICPS_K8S_TOOLS=$(K8S_TOOLS) ELASTICPS_REQUIRE_K8S=$(if $(K8S_TOOLS),1,) $(PY) -m pytest -q -ra --durations=15

# Every test but the slow ones (marked `slow`: several Ray nodes, servers killed and restarted, the
# demo experiment, the peers' runs, and the fault tests of ten seconds or more: a task killed or hung and
# waited out, a shorter one of each kind staying here), which `make test-slow` runs; CI runs both.
test: setup browser kube-apiserver lint
	$(PYTEST) -m 'not slow'

test-slow: setup browser kube-apiserver
	$(PYTEST) -m slow

lint: setup
	$(VENV)/bin/ruff check elasticps tests

bench: setup
	$(VENV)/bin/elasticps bench runtime --json out/bench-runtime.json

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

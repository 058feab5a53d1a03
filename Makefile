# The project's two entry points are `make demo` and `make test`; both set up
# everything they need (a virtualenv in .venv, the fake NVML library) first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
FAKENVML := build/fakenvml

.PHONY: setup demo test lint pytest fakenvml bench clean proto proto-baseline

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(BIN)/capwatch demo

fakenvml: setup
	$(BIN)/python tests/fakenvml/build.py $(FAKENVML)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/buf lint
	$(BIN)/buf format --diff --exit-code
	$(BIN)/buf breaking --against buf.baseline.binpb
	$(BIN)/python scripts/genproto.py --check

# Regenerate server/gen after editing proto/.
proto: setup
	$(BIN)/buf format --write
	$(BIN)/python scripts/genproto.py

# Accept the current protos as the compatibility baseline (a deliberate break).
proto-baseline: setup
	$(BIN)/buf build --output buf.baseline.binpb

# pytest exits 5 when it collected nothing: for this suite that is a failure.
pytest: setup fakenvml
	LD_LIBRARY_PATH=$(CURDIR)/$(FAKENVML)$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH} \
	  $(BIN)/pytest $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

# The full suite: static checks, then every test.
test: lint pytest

bench: setup
	PYTHONPATH=$(CURDIR) $(BIN)/python bench/cycle.py

clean:
	rm -rf build $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis

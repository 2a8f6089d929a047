# Each target creates/updates a virtual environment and installs all five distributions in
# editable mode. PYTHON picks the interpreter; VENV the environment's folder.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PACKAGES := -e "./everyo_core[safetensors]" -e ./everyo_layers -e ./everyo_amp -e "./everyo_onnx[runtime]" -e "./everyo_dist[mpich]" \
  -e ./everyo_numba
# Tests that prove an install on any supported Python: packaging, imports, plugins, the docs' plugin.
SMOKE_TESTS := tests/packaging tests/plugins tests/core/test_tensor.py

.PHONY: install demo test test-oracle test-smoke bench lint typecheck clean

$(STAMP): pyproject.toml everyo_*/pyproject.toml VERSION
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))' || { \
	  echo "EveryO needs CPython 3.10 or newer; $(PYTHON) is $$($(PYTHON) -V 2>&1)." >&2; \
	  echo "Pick another interpreter: make PYTHON=python3.12 ..." >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade --quiet pip
	$(BIN)/python -m pip install --quiet $(PACKAGES) -e ".[all,test,examples]"
	touch $(STAMP)

install: $(STAMP)

# The main job: train, mix precision, export and distribute on the digits data set.
demo: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python examples/digits_demo.py

# PyTorch is the tests' optional oracle; `make test-oracle` adds it (test-only).
test-oracle: $(STAMP)
	$(BIN)/python -m pip install --quiet torch==2.13.0

test: $(STAMP)
	$(BIN)/python -m pytest -q

# The install-level subset, for checking another Python: make PYTHON=python3.13 VENV=.venv-3.13 test-smoke
test-smoke: $(STAMP)
	$(BIN)/python -m pytest -q $(SMOKE_TESTS)

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

lint: $(STAMP)
	$(BIN)/python -m pip install --quiet ruff==0.17.6  # pinned: a new release may add checks
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/python -m mypy everyo_core/src/everyo

clean:
	rm -rf $(VENV) .venv-*

# Each target creates/updates .venv and installs all five distributions in editable mode.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PACKAGES := -e ./everyo_core -e ./everyo_layers -e ./everyo_amp -e "./everyo_onnx[runtime]" -e "./everyo_dist[mpi]"

.PHONY: install demo test test-oracle bench lint clean

$(STAMP): pyproject.toml everyo_*/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade --quiet pip
	$(BIN)/pip install --quiet $(PACKAGES) -e ".[all,test,examples]"
	touch $(STAMP)

install: $(STAMP)

# The main job: train, mix precision, export and distribute on the digits data set.
demo: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python examples/digits_demo.py

# PyTorch is the tests' optional oracle; `make test-oracle` adds it (test-only).
test-oracle: $(STAMP)
	$(BIN)/pip install --quiet torch==2.13.0

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

lint: $(STAMP)
	$(BIN)/pip install --quiet ruff
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV)

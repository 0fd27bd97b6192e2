# The two quick-start commands (README): `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup demo test lint clean-demo

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

clean-demo:
	rm -rf results work logs benchmarks .snakemake

# The two commands: `make synth STACK=<stack>` and `make test`.
# Both create .venv on first use with nothing but python3.
PYTHON ?= python3
STACK ?= a4-standard
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: synth synth-all test lint bench clean deploy-venv

$(STAMP): requirements.txt requirements-dev.txt constraints.txt pyproject.toml
	@echo "verl-gke: installing the pinned requirements into $(VENV) (pulumi, pulumi-gcp, pulumi-kubernetes,"
	@echo "verl-gke: ray, hydra-core; for the tests torch, transformers and the schema checkers): a few minutes, once"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-dev.txt -c constraints.txt
	touch $(STAMP)
	@echo "verl-gke: $(VENV) is ready"

# CI's deploy jobs: only the runtime tree, every file checked against its sha256 in requirements.lock
# (a changed or swapped package on the index fails the install), then the project itself, built offline.
deploy-venv:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check --isolated --no-deps --require-hashes --no-build-isolation -r requirements.lock
	$(BIN)/pip install --quiet --disable-pip-version-check --isolated --no-deps --no-build-isolation -e .

synth: $(STAMP)
	$(BIN)/python -m verl_gke.synth $(STACK)

synth-all: $(STAMP)
	for s in a4 a4-standard a3u-standard a4x; do $(BIN)/python -m verl_gke.synth $$s || exit 1; done

test: $(STAMP)
	$(BIN)/python -m pytest

# Pyflakes, syntax errors and bugbear: unused code, undefined names, likely bugs.
lint: $(STAMP)
	$(BIN)/ruff check --select F,E9,B --ignore B905 --line-length 120 --exclude .venv .

bench: $(STAMP)
	$(BIN)/python -m bench.synth_time
	$(BIN)/python -m bench.job_latency

clean:
	rm -rf dist .pytest_cache

# The commands: `make synth STACK=<stack>`, `make test` (all tiers) and `make test-fast` (the units).
# Both create .venv on first use with nothing but python3.
PYTHON ?= python3
# .ci/run sets `python3 -m virtualenv` where python3 has no venv module (Debian without python3-venv).
MKVENV ?= $(PYTHON) -m venv
STACK ?= a4-standard
VENV := .venv
BIN := $(VENV)/bin
RUNTIME := $(VENV)/.runtime-installed
TESTSET := $(VENV)/.tests-installed
# --no-compile: pip would compile all ~20,000 installed modules (77 s of CPU); Python compiles the few it
# imports, once: it writes their bytecode at the first import. An inherited PYTHONDONTWRITEBYTECODE would
# have every process (pytest's workers, each Ray daemon, worker and job driver) compile all it imports
# anew: `import ray` at twice its CPU, thousands of times a run.
unexport PYTHONDONTWRITEBYTECODE
PIP := $(BIN)/pip install --progress-bar off --disable-pip-version-check --no-compile
# uv installs the same pinned sets, resolving at once, downloading in parallel, linking from its cache (a
# re-install takes seconds) and compiling nothing; pip installs uv itself (pinned in constraints.txt).
# A local wheel folder pip is given (PIP_FIND_LINKS) is uv's too.
UV := $(if $(PIP_FIND_LINKS),UV_FIND_LINKS="$(PIP_FIND_LINKS)" )$(BIN)/uv pip install --python $(BIN)/python

.PHONY: synth synth-all test test-fast lint bench bench-tests clean deploy-venv explore

# The runtime: what synth, `pulumi up` (the provider host runs in this venv) and the verl-gke CLI import.
$(RUNTIME): requirements.txt constraints.txt pyproject.toml
	@echo "verl-gke: installing the pinned runtime into $(VENV) (pulumi, pulumi-gcp, pulumi-kubernetes,"
	@echo "verl-gke: ray, hydra-core): a minute, once; uv lists each package it installs"
	test -x $(BIN)/python || $(MKVENV) $(VENV)
	$(PIP) uv -c constraints.txt
	$(UV) -r requirements.txt -c constraints.txt
	touch $(RUNTIME)
	@echo "verl-gke: $(VENV) is ready"

# CI's deploy jobs: only the runtime tree, every file checked against its sha256 in requirements.lock
# (a changed or swapped package on the index fails the install), then the project itself, built offline.
deploy-venv:
	test -x $(BIN)/python || $(MKVENV) $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check --isolated --no-deps --require-hashes --no-build-isolation -r requirements.lock
	$(BIN)/pip install --quiet --disable-pip-version-check --isolated --no-deps --no-build-isolation -e .

# The tests and lint on top: torch (CPU build) alone first, then the rest from PyPI. uv fails where torch's
# index cannot be reached, so torch comes offline first (a local wheel folder or uv's cache), from its
# index only when that fails.
$(TESTSET): $(RUNTIME) requirements-torch.txt requirements-dev.txt constraints.txt
	@echo "verl-gke: installing the test set into $(VENV) (pytest, ruff, schema checkers, torch CPU, transformers): once;"
	@echo "verl-gke: uv lists each package it installs"
	$(UV) --offline --no-deps -r requirements-torch.txt -c constraints.txt 2>/dev/null || \
		$(UV) --no-deps -r requirements-torch.txt -c constraints.txt
	$(UV) -r requirements-dev.txt -c constraints.txt
	touch $(TESTSET)

synth: $(RUNTIME)
	$(BIN)/python -m verl_gke.synth $(STACK)

synth-all: $(RUNTIME)
	for s in a4 a4-standard a3u-standard a4x smoke; do $(BIN)/python -m verl_gke.synth $$s || exit 1; done

# Three workers on two cores: the Ray tests wait on Ray much of their time, which the third fills (two
# left a fifth of the cores idle). A file whose tests share a module fixture stays on one worker
# (tests/conftest.py groups it), every other test goes to whichever worker is free. `make test-fast`:
# the unit tier alone.
TEST_WORKERS ?= 3
PYTEST := $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup
NO_TEST = { status=$$?; [ $$status -ne 5 ] || echo "make $@: pytest collected no test (exit 5): nothing was checked" >&2; exit $$status; }
test: $(TESTSET)
	$(PYTEST) $(PYTEST_ARGS) || $(NO_TEST)

test-fast: $(TESTSET)
	$(PYTEST) -m unit $(PYTEST_ARGS) || $(NO_TEST)

# The run lifecycle's interleavings, far longer than CI's 400 derandomized examples: a random seed,
# minutes; a failure prints its shrunk steps, kept in CI as a regression (docs/development.md).
EXPLORE ?= 3000
explore: $(TESTSET)
	VERL_GKE_EXPLORE=$(EXPLORE) $(BIN)/python -m pytest -n 0 -q -x tests/test_run_interleavings.py -k promises

# Pyflakes, syntax errors and bugbear: unused code, undefined names, likely bugs.
lint: $(TESTSET)
	$(BIN)/ruff check --select F,E9,B --ignore B905 --line-length 120 --exclude .venv .

bench: $(TESTSET)
	$(BIN)/python -m bench.synth_time
	$(BIN)/python -m bench.job_latency

# The suite's wall time per tier (unit, synth, integration).
bench-tests: $(TESTSET)
	$(BIN)/python -m bench.test_tiers

clean:
	rm -rf dist .pytest_cache

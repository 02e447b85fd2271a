# Every target is idempotent: re-running only does what is missing.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
# The CPU build of torch; an unpinned torch pulls a multi-GB CUDA build.
TORCH   ?= torch==2.13.0
STAMP   := $(VENV)/.installed

.PHONY: install demo test test-fast bench mutate flake clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $(STAMP)

# A weak-scaling study of the tutorial CNN on the bundled CIFAR-10 subset (offline), 1 and 2 workers.
demo: install
	rm -rf runs/demo
	$(BIN)/paratrain scale --workers 1,2 --workload cifar10-cnn --epochs 8 --batch-size 64 --lr 0.01 --out runs/demo

# lint-imports checks the layers contract in pyproject.toml (docs/architecture.md); --no-cache,
# since its cache once missed an import added by a new __init__.py, and the check takes a second.
# ruff: the house style (pyproject.toml [tool.ruff]); `ruff format src tests scripts benchmarks` applies it.
test: install
	$(BIN)/lint-imports --no-cache
	$(BIN)/ruff check src tests scripts benchmarks
	$(BIN)/ruff format --check src tests scripts benchmarks
	bash scripts/test-deps.sh
	$(BIN)/python -m pytest -q -p no:logging --durations=25 --junit-xml=build/test-times.xml

# The inner loop (not a substitute for `make test`): the formula and property files, which run no training.
test-fast: install
	$(BIN)/python -m pytest -q -p no:logging tests/test_formulas_*.py tests/test_properties*.py

bench: install
	$(BIN)/python benchmarks/anchor_ddp.py --repeats 5

# Mutation testing of one module (not part of `make test`): make mutate MODULE=plan/links.py
# (scripts/mutate.py lists the modules and their fast tests; docs/benchmarks.md the kill rates).
mutate: install
	$(BIN)/python -c "import mutmut" 2>/dev/null || $(BIN)/python -m pip install -q -e ".[mutate]"
	$(BIN)/python scripts/mutate.py $(MODULE)

# The flake loop (not part of `make test`; hours for every file): make flake FILES="tests/test_launch.py" N=20
# (scripts/flake.py; runs/flake/flake.json keeps runs and failures per file).
flake: install
	bash scripts/test-deps.sh
	$(BIN)/python scripts/flake.py $(FILES) --runs $(or $(N),20)

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache

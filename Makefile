# Every target is idempotent: re-running only does what is missing.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
# The CPU build of torch; an unpinned torch pulls a multi-GB CUDA build.
TORCH   ?= torch==2.13.0
STAMP   := $(VENV)/.installed

.PHONY: install demo test bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $(STAMP)

# The bundled CIFAR-10 subset (offline), on 1 worker and on 2 workers, same per-worker batch.
DEMO_FLAGS := --workload cifar10-cnn --epochs 6 --batch-size 32 --lr 0.005
demo: install
	rm -rf runs/demo
	$(BIN)/paratrain train $(DEMO_FLAGS) --workers 1 --run-dir runs/demo/w1
	$(BIN)/paratrain train $(DEMO_FLAGS) --workers 2 --run-dir runs/demo/w2

test: install
	bash scripts/test-deps.sh
	$(BIN)/python -m pytest -q -p no:logging

bench: install
	$(BIN)/python benchmarks/anchor_ddp.py --repeats 5

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache

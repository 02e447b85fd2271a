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

demo: install
	$(BIN)/python scripts/demo.py

test: install
	bash scripts/test-deps.sh
	$(BIN)/python -m pytest -q

bench: install
	$(BIN)/python benchmarks/anchor_ddp.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache

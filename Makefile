# Entry points for users and CI. Everything runs inside .venv, which this
# Makefile creates and fills from pinned requirements: nothing by hand.
PY       ?= python3
VENV     := .venv
BIN      := $(VENV)/bin
STAMP    := $(VENV)/.installed
REQS     := requirements/dev.txt $(wildcard requirements/vllm-import.txt)
SMLA     := $(BIN)/smla
PYTEST   := $(BIN)/python -m pytest

.PHONY: help venv patch status export test test-gpu clean

help:
	@echo "make patch        fetch the pinned vLLM and apply patches/series (tree: work/vllm)"
	@echo "make test         CPU test suite (runs make patch first)"
	@echo "make test-gpu     GPU tests (needs CUDA)"
	@echo "make status       where the work tree stands"
	@echo "make export       regenerate patches/ from the work tree's commits"
	@echo "make clean        remove the work tree, dist/ and the virtualenv"

$(STAMP): $(REQS) pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(addprefix -r ,$(REQS))
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $@

venv: $(STAMP)

patch: $(STAMP)
	$(SMLA) patch $(ARGS)

status: $(STAMP)
	$(SMLA) status $(ARGS)

export: $(STAMP)
	$(SMLA) export $(ARGS)

test: patch
	$(PYTEST) -m "not gpu" $(PYTEST_ARGS)

test-gpu: patch
	$(PYTEST) -m gpu $(PYTEST_ARGS)

clean:
	rm -rf work dist $(VENV)

# Entry points for users and CI. Everything runs inside .venv, which this
# Makefile creates and fills from pinned requirements: nothing by hand. A line whose vLLM pins
# another Triton has requirements/line-<release>.txt and its own venv, .venv-<release> (below).
PY       ?= python3
VENV     := .venv
BIN      := $(VENV)/bin
STAMP    := $(VENV)/.installed
REQS     := requirements/dev.txt $(wildcard requirements/vllm-import.txt)
PYTEST   := $(BIN)/python -m pytest

# Release lines: lines/<release>/ (pin + patches/), oldest first; VLLM=<release> picks the line
# every target works on (default: the newest). Each line has its own work tree, work/<release>/vllm.
LINES    := $(shell ls lines 2>/dev/null | grep -E '^[0-9]' | sort -V)
NEWEST   := $(lastword $(LINES))
VLLM     ?= $(NEWEST)
export SMLA_LINE := $(VLLM)
SMLA     := $(BIN)/smla --line $(VLLM)
# make test: VLLM given -> that line; else every line (the full suite on the newest, the line tests
# on each older one; tests/conftest.py marks the line tests).
TEST_LINES := $(if $(filter command line environment,$(origin VLLM)),$(VLLM),$(LINES))

# The Python of a line: .venv-<release> where requirements/line-<release>.txt exists (the toolkit's
# requirements, then that file's pins over them: vLLM 0.33.0 pins torch 2.14, hence Triton 3.8), else
# .venv. The CPU suite of a line runs in its Python, so its kernels are compile-checked and interpreted
# under the Triton its vLLM release uses.
line_venv  = $(if $(wildcard requirements/line-$(1).txt),.venv-$(1),$(VENV))
LINE_VENV  := $(call line_venv,$(VLLM))
LINE_STAMP := $(LINE_VENV)/.installed

.PHONY: help venv patch status export test test-fast test-gpu docs clean rebase lines
.PHONY: build-wheel test-wheel

help:
	@echo "Release lines: $(LINES) (newest: $(NEWEST)); VLLM=<release> picks one for every target below"
	@echo "make patch        fetch the line's pinned vLLM and apply lines/<release>/patches (tree: work/<release>/vllm)"
	@echo "make test         CPU test suite, complete: toolkit once, the line tests on every line (VLLM=x: that line)"
	@echo "make lines        the release lines, their pins and trees; whether their added files agree (lines/DIVERGENCE)"
	@echo "make test-fast    the toolkit's tests alone, ~1.5-2 min of CPU (2-3.5 min wall on a shared 2-core machine): no vLLM tree, kernels or compile matrix"
	@echo "make docs         rewrite the docs' transcripts and generated tables from real output"
	@echo "make test-gpu     GPU tests on your CUDA machine: the wheel (WHEEL=path or dist/) in .venv-gpu, pytest -m gpu"
	@echo "make status       where the work tree stands"
	@echo "make export       regenerate patches/ from the work tree's commits"
	@echo "make rebase ONTO=<version|commit>  open line <version> from VLLM's line (a commit: rebase in place; ARGS=--continue / --abort)"
	@echo "                  (make exits 2 on a conflict; scripts needing exit code 11 call .venv/bin/smla rebase)"
	@echo "make build-wheel  patched vLLM wheel in dist/ (WHEEL_ARGS=\"--from-source\" etc., see docs/build-wheel.md)"
	@echo "make test-wheel   opt-in check of build-wheel on the real official wheel (500 MB)"
	@echo "make bench        sparse-MLA kernel benchmark vs seed/torch/floors (GPU; BENCH_ARGS=--quick, BENCH_PY=python3)"
	@echo "make test-e2e     ours vs upstream through vllm.LLM on your CUDA machine (E2E_ARGS; tests/e2e/README.md)"
	@echo "make bench-e2e    serving speed upstream vs ours through vllm.LLM on your CUDA machine (BENCH_E2E_ARGS)"
	@echo "make test-e2e-pieces / bench-e2e-pieces   the same from staged 50 MiB pieces (a GPU without network)"
	@echo "make bench-e2e-plan / bench-e2e-keep BENCH_FROM=DIR / bench-e2e-report / bench-e2e-share   (CPU)"
	@echo "make explain MODEL=glm-5 CAP=12.0 [DTYPE=float16] [TREE=pristine|PATH]  why vLLM picks that attention backend"
	@echo "make clean        remove the work tree (refused while it holds unexported work; ARGS=--discard), dist/ and the virtualenv"

# tools/venv_check.py first: a PY the toolkit refuses stops here (not after a minute of installs),
# and a .venv made from a refused or another Python is removed to be made again from PY.
$(STAMP): $(REQS) pyproject.toml
	@$(PY) tools/venv_check.py "$(PY)" $(VENV) $(MAKECMDGOALS)
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(addprefix -r ,$(REQS))
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $@

# A line's own venv: the same install as .venv, then requirements/line-<release>.txt over it.
.venv-%/.installed: requirements/line-%.txt $(REQS) pyproject.toml
	$(PY) -m venv .venv-$*
	.venv-$*/bin/python -m pip install -q --upgrade pip
	.venv-$*/bin/python -m pip install -q $(addprefix -r ,$(REQS))
	.venv-$*/bin/python -m pip install -q -r requirements/line-$*.txt
	.venv-$*/bin/python -m pip install -q --no-deps -e .
	touch $@

venv: $(STAMP) $(LINE_STAMP)

patch: $(STAMP)
	$(SMLA) patch $(ARGS)

status: $(STAMP)
	$(SMLA) status $(ARGS)

lines: $(STAMP)
	$(SMLA) lines $(ARGS)

export: $(STAMP)
	$(SMLA) export $(ARGS)

# make turns any failing exit code into 2: a conflict (smla's 11) is visible only in the output here.
# CI that must tell a conflict from an error calls $(SMLA) directly (.github/scripts/rebase-nightly.sh).
rebase: $(STAMP)
	$(SMLA) rebase $(if $(ONTO),--onto $(ONTO)) $(ARGS)

test: $(STAMP) $(foreach l,$(TEST_LINES),$(call line_venv,$(l))/.installed)
	@set -e; for l in $(TEST_LINES); do echo "== make patch VLLM=$$l"; $(BIN)/smla --line $$l patch $(ARGS); done
	@set -e; first=1; for l in $(call reverse,$(TEST_LINES)); do \
	  py=$$(if [ -f requirements/line-$$l.txt ]; then echo .venv-$$l; else echo $(VENV); fi)/bin/python; \
	  if [ $$first = 1 ]; then echo "== the CPU suite, line $$l ($$py)"; SMLA_LINE=$$l $$py -m pytest -m "not gpu" $(PYTEST_ARGS); \
	  else echo "== the line tests, line $$l ($$py)"; SMLA_LINE=$$l $$py -m pytest -m "line and not gpu" $(PYTEST_ARGS); fi; first=0; done
reverse = $(if $(1),$(call reverse,$(wordlist 2,$(words $(1)),$(1))) $(firstword $(1)))

# Without the tests marked `slow` in tests/conftest.py (the real vLLM tree, the sdist, Triton's
# compiler): temporary git repositories and a local package index only, so no `make patch` first.
test-fast: $(STAMP)
	$(PYTEST) -m "not gpu and not slow" $(PYTEST_ARGS)

# The transcripts in docs/ and the generated tables (docs/proof.md's selection table of every line,
# docs/series.md) from real output; `make test` fails while they differ. Run on each line (VLLM given:
# that line only), in its Python: the selection tables come from each line's trees, docs/explain.md's
# transcripts from the 0.26.0 line's.
docs: $(STAMP) $(foreach l,$(TEST_LINES),$(call line_venv,$(l))/.installed)
	@set -e; for l in $(TEST_LINES); do $(BIN)/smla --line $$l patch $(ARGS); \
	  py=$$(if [ -f requirements/line-$$l.txt ]; then echo .venv-$$l; else echo $(VENV); fi)/bin/python; \
	  SMLA_LINE=$$l $$py -m pytest tests/test_docs.py tests/test_selection.py -k "docs or readme" --update-docs $(PYTEST_ARGS); done

# ---- On your own CUDA machine, with network (tools/gpu-local.sh): the wheel (WHEEL=path, else the
# newest in dist/, else make build-wheel) pip-installed into GPU_VENV (made from GPU_PY), then:
# test-gpu: tests/gpu against the installed wheel; test-e2e and bench-e2e: below. Results: GPU_OUT.
WHEEL    ?=
GPU_VENV ?= .venv-gpu
GPU_PY   ?= python3
GPU_OUT  ?=
GPU_ENV   = WHEEL="$(WHEEL)" GPU_VENV="$(GPU_VENV)" GPU_PY="$(GPU_PY)" GPU_OUT="$(GPU_OUT)" MAKE="$(MAKE)"
test-gpu:
	$(GPU_ENV) bash tools/gpu-local.sh test-gpu $(PYTEST_ARGS)

# WHEEL_ARGS, not ARGS: the `patch` prerequisite already passes $(ARGS) to `smla patch`.
build-wheel: patch
	$(SMLA) build-wheel $(WHEEL_ARGS)

test-wheel: patch
	SMLA_REAL_WHEEL=1 $(PYTEST) tests/test_wheel_real.py $(PYTEST_ARGS)

# Sparse-MLA kernel benchmark (needs a CUDA GPU); results in bench/results/.
BENCH_PY ?= $(BIN)/python
.PHONY: bench
bench: patch
	$(BENCH_PY) bench/bench_sparse_mla.py $(BENCH_ARGS)

# Which attention backend the tree's vLLM picks, and why (CPU; see docs/explain.md).
MODEL ?= glm-5
CAP   ?= 12.0
DTYPE ?= auto
TREE  ?= patched
.PHONY: explain
# EXPLAIN_ARGS (e.g. --json, --backend NAME), not ARGS: `patch` takes $(ARGS).
explain: patch $(LINE_STAMP)
	$(SMLA) explain --model $(MODEL) --capability $(CAP) --dtype $(DTYPE) --tree $(TREE) $(EXPLAIN_ARGS)

# The work tree goes through `smla clean`, which refuses while the tree holds work not in
# patches/ (make clean ARGS=--discard throws it away); only then dist/ and the venv.
# work/vllm only (not $SMLA_TREE), through smla's guard; work/ goes only when nothing else is left in it.
clean:
	@set -e; for l in $(LINES); do if [ -e work/$$l/vllm ]; then $(MAKE) --no-print-directory venv && $(BIN)/smla --line $$l clean --tree work/$$l/vllm $(ARGS); fi; done
	rm -rf dist $(VENV) $(wildcard .venv-[0-9]*)
	@for d in $(addprefix work/,$(LINES)) work; do [ -d $$d ] && ! rmdir $$d 2>/dev/null && echo "kept $$d/: it holds what make patch did not make: $$(ls -A $$d | head -5 | tr '\n' ' ')"; done; true

# ---- End to end through vllm.LLM on a GPU (tests/e2e/README.md) ----
# test-e2e: on your CUDA machine, the wheel installed as for test-gpu, then ours vs the reference
# (E2E_ARGS: run_e2e.py's options; results in GPU_OUT, default .gpu-out/test-e2e).
# The piece route, for a GPU machine without network (the lent H200):
# e2e-bundle: the wheel reduced to what the run needs + its pure-Python deps, in
# pieces < 64 MiB with a sha256 manifest (under E2E_DIR, ignored by git).
# test-e2e-pieces: on a CUDA machine holding the pieces (or after the staging calls on
# the lent GPU): check, install, run ours vs the reference (E2E_ARGS: run_e2e.py).
E2E_WHEEL ?= $(firstword $(wildcard dist/vllm-$(VLLM)+*.whl))
E2E_DIR   ?= .e2e
E2E_ARGS  ?=
.PHONY: e2e-bundle e2e-bundle-v4-upstream test-e2e test-e2e-pieces
e2e-bundle: $(STAMP)
	@test -n "$(E2E_WHEEL)" || { echo "error: no vLLM $(VLLM) wheel in dist/ (dist/vllm-$(VLLM)+*.whl): make build-wheel VLLM=$(VLLM), or another line with VLLM=<release>, or E2E_WHEEL=/path/to/vllm-*.whl" >&2; exit 2; }
	$(BIN)/python tests/e2e/bundle.py --wheel "$(E2E_WHEEL)" --out "$(E2E_DIR)"

# e2e-bundle-v4-upstream: the optional second bundle (.e2e-extra/): TileLang and CuTe DSL, which
# pristine DeepSeek-V4 kernels need and the GPU image lacks (tests/e2e/README.md "DeepSeek-V4").
e2e-bundle-v4-upstream: $(STAMP)
	$(BIN)/python tests/e2e/bundle.py --extra --out .e2e-extra

# t38-bundle: Triton 3.8.0 (what vLLM 0.33.0's torch 2.14 pins) for the lent H200, in pieces under .t38/
# (tests/gpu/t38_bundle.py; run there by tests/gpu/device-run.sh t38-stage / t38).
.PHONY: t38-bundle
t38-bundle: $(STAMP)
	$(BIN)/python tests/gpu/t38_bundle.py --out .t38

test-e2e:
	$(GPU_ENV) bash tools/gpu-local.sh test-e2e $(E2E_ARGS)

test-e2e-pieces:
	bash tests/e2e/device-run.sh run $(E2E_ARGS)

# ---- Serving speed through vllm.LLM (bench/serving/README.md) ----
# bench-e2e: on your CUDA machine, the wheel installed as for test-gpu, then upstream's kernels
# vs ours through vLLM's own benchmark code, one engine at a time, the whole plan in one call
# (resumable: its manifest stays in GPU_OUT, default .gpu-out/bench-e2e).
# bench-e2e-pieces: on a CUDA machine holding the e2e bundle (or after the staging calls on the
# lent GPU), within a call's time limit (exit 10: call again). BENCH_E2E_ARGS: bench_serving.py.
# The rest runs here (CPU): the plan and time estimate, results.json + table + plot from a
# run's manifest (BENCH_STATE), and the GLM-5 TP 8 share calculator.
# BENCH_TAG: another plan's manifest apart (deep: the plan of `BENCH_E2E_ARGS=--deep`, manifest in
# .e2e/serving-state-deep, tables in bench/serving/deep; device-run.sh reads the same variable).
BENCH_E2E_ARGS ?=
BENCH_TAG      ?=
BENCH_SUFFIX   := $(if $(BENCH_TAG),-$(BENCH_TAG))
BENCH_STATE    ?= .e2e/serving-state$(BENCH_SUFFIX)/state.json
BENCH_FROM     ?=
BENCH_COMMAND  ?=
.PHONY: bench-e2e bench-e2e-pieces bench-e2e-plan bench-e2e-keep bench-e2e-report bench-e2e-share
bench-e2e:
	$(GPU_ENV) bash tools/gpu-local.sh bench-e2e $(BENCH_E2E_ARGS)

bench-e2e-pieces:
	bash bench/serving/device-run.sh run $(BENCH_E2E_ARGS)

bench-e2e-plan: $(STAMP)
	$(BIN)/python bench/serving/plan.py $(BENCH_E2E_ARGS)

# Keep a device call's manifest (BENCH_FROM: the folder its files came back to) for the
# next call to carry (.e2e/serving-state) and for bench-e2e-report.
bench-e2e-keep: $(STAMP)
	@test -n "$(BENCH_FROM)" || { echo "error: BENCH_FROM=<folder holding the call's state.json>" >&2; exit 2; }
	$(BIN)/python bench/serving/keep_state.py "$(BENCH_FROM)" .e2e/serving-state$(BENCH_SUFFIX)

bench-e2e-report: $(STAMP)
	$(BIN)/python bench/serving/report.py --state "$(BENCH_STATE)" --out bench/serving$(if $(BENCH_TAG),/$(BENCH_TAG)) \
	  $(if $(wildcard .e2e/serving-state$(BENCH_SUFFIX)/env.txt),--env .e2e/serving-state$(BENCH_SUFFIX)/env.txt) \
	  $(if $(BENCH_COMMAND),--command "$(BENCH_COMMAND)")

bench-e2e-share: $(STAMP)
	$(BIN)/python bench/serving/glm5_share.py

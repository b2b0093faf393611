#!/usr/bin/env bash
# GPU tests on a machine without network access (the lent H200): install the
# wheels of .bundle (made beforehand with tests/gpu/make-bundle.sh, on a machine with network)
# into /tmp/site, then run the gpu-marked tests against the carried work tree.
# usage (from the repo root): bash tests/gpu/device-run.sh [pytest args]
# Results: $OUT/gpu-results.jsonl (one line per kernel case) and $OUT/gpu-tests.log.
set -euo pipefail
out=${OUT:-/tmp/smla-gpu-out}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .bundle/whl/*.whl
cp -r .bundle/site-extra/* /tmp/site/
export PYTHONPATH=/tmp/site:$PWD
export SMLA_TREE=$PWD/work/vllm
export SMLA_GPU_RESULTS=$out/gpu-results.jsonl
unset TRITON_INTERPRET
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu-env.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$out/gpu-env.txt"
set -o pipefail
python3 -m pytest tests/gpu -m gpu -q -p no:cacheprovider -rA "$@" 2>&1 | tee "$out/gpu-tests.log"

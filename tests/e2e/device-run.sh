#!/usr/bin/env bash
# The e2e runner on the lent GPU machine (repo root = working directory).
#   bash tests/e2e/device-run.sh stage            keep the piece(s) this call carried (calls 1..N-1)
#   bash tests/e2e/device-run.sh stage-extra      keep the piece(s) of the optional .e2e-extra/ bundle
#                                                 (TileLang + CuTe DSL, README "DeepSeek-V4")
#   bash tests/e2e/device-run.sh run [ARGS...]    stage the last piece, check all, install, run
#                                                 tests/e2e/run_e2e.py ARGS (results in $OUT)
# Each call carries .e2e/manifest.json and one .e2e/pieces/NN (see tests/e2e/README.md);
# pieces live in /tmp/smla-e2e only while the machine stays warm (30 s after a call).
set -euo pipefail
mode=${1:?usage: device-run.sh stage|run [run_e2e.py args]}
shift
out=${OUT:-/tmp/smla-e2e-out}
source tests/e2e/device-setup.sh "$mode"
{
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, triton, vllm, importlib.metadata as m; print("torch", torch.__version__, "triton", triton.__version__, "vllm", vllm.__version__, m.version("vllm"), vllm.__file__)'
  # what decides DeepSeek-V4's upstream kernels (mHC: tilelang; compressor: cutlass = CuTe DSL)
  python3 -c 'import importlib.util as u, importlib.metadata as m
def has(n):
    try: return "found" if u.find_spec(n) else "missing"
    except Exception: return "missing"
def ver(d):
    try: return m.version(d)
    except Exception: return "-"
for n, d in (("tilelang", "tilelang"), ("z3", "z3-solver"), ("cutlass", "nvidia-cutlass-dsl"), ("cuda.bindings", "cuda-bindings"), ("google.protobuf", "protobuf"), ("compressed_tensors", "compressed-tensors"), ("flashinfer", "flashinfer-python")):
    print("module", n, has(n), "dist", d, ver(d))'
} 2>&1 | tee "$out/env.txt"
gpus=$(nvidia-smi -L | wc -l)
# No pipe (| tee): processes the engines leave behind would hold it open and the call
# would wait for them until its time limit.
set +e
python3 tests/e2e/run_e2e.py --out "$out" --gpus "$gpus" "$@" > "$out/run.log" 2>&1
rc=$?
set -e
cat "$out/run.log"
# Engine logs, one archive (what comes back from $OUT is limited to 8 files).
tar -C "$store/results" -cJf "$out/engine-logs.tar.xz" --exclude=arrays.npz . || true
# SMLA_E2E_KEEP_ARRAYS=1: the engines' logprob arrays too (about 0.7 MB per engine), for
# looking at single positions here (compare.compare_pair on the arrays.npz of two engines).
if [ "${SMLA_E2E_KEEP_ARRAYS:-0}" = 1 ]; then
  (cd "$store/results" && find . -name arrays.npz | sort | tar -cJf "$out/arrays.tar.xz" -T -) || true
fi
exit "$rc"

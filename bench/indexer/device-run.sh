#!/usr/bin/env bash
# Indexer GPU comparison on the lent H200 (no network), from the repo root:
#   bash bench/indexer/device-run.sh PAYLOAD
# PAYLOAD (an ignored folder carried with the run) holds
#   dg.tar.xz      deep_gemm/ from vLLM 0.26.0's wheel (vllm/third_party/deep_gemm,
#                  only the cpython-312 _C)
#   vllm_C.so.xz   vllm/_C_stable_libtorch.abi3.so from the same wheel
#   tree/          vllm/__init__.py (empty) + vllm/v1/attention/ops/{triton_dsa_indexer,
#                  triton_sparse_mla}.py from the patched tree
# Writes under $OUT: gpu-env.txt, indexer-gpu-results.jsonl, indexer-gpu-tests.log,
# indexer-bench.jsonl, indexer-bench.log.
set -uo pipefail
P=$(cd "$1" && pwd)
out=${OUT:-/tmp/idx-out}
mkdir -p "$out" /tmp/idx
tar xJf "$P/dg.tar.xz" -C /tmp/idx
xz -dc "$P/vllm_C.so.xz" > /tmp/idx/_C_stable_libtorch.abi3.so
export SMLA_DEEPGEMM_DIR=/tmp/idx SMLA_VLLM_C_SO=/tmp/idx/_C_stable_libtorch.abi3.so
export SMLA_TREE="$P/tree" SMLA_INDEXER_RESULTS="$out/indexer-gpu-results.jsonl"
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
unset TRITON_INTERPRET
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
} | tee "$out/gpu-env.txt"
timeout 230 python3 -m pytest tests/gpu/test_indexer_gpu.py -m gpu -q -p no:cacheprovider -rA \
  2>&1 | tee "$out/indexer-gpu-tests.log"
timeout 150 python3 bench/indexer/bench_indexer.py "$out/indexer-bench.jsonl" \
  2>&1 | tee "$out/indexer-bench.log"

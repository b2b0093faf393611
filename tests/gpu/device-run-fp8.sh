#!/usr/bin/env bash
# fp8_ds_mla GPU tests + benchmark on the lent H200, in one call (repo root):
#   carry .fp8-payload   (gitignored; 53 MB):
#     so/_C_stable_libtorch.abi3.so.xz + so/SHA256SUMS   vLLM 0.26.0's compiled ops (wheel member)
#     tree/vllm/__init__.py, tree/vllm/v1/attention/ops/triton_{sparse_mla,dsa_indexer}.py
#                                                         from the fp8 branch (the kernel under test)
#   bash tests/gpu/device-run-fp8.sh
# Results under $OUT: env.txt, prewarm.log, fp8-gpu-tests.log, fp8-gpu-results.jsonl,
# bench.log, bench/results.json, bench/results.md.
# Budget: prewarm <= 75 s, tests <= 80 s, bench <= 60 s.
set -uo pipefail
out=${OUT:-/tmp/fp8-out}
p=.fp8-payload
work=/tmp/fp8-so
mkdir -p "$out" "$work"
unset TRITON_INTERPRET
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__)'
  sha256sum "$p"/tree/vllm/v1/attention/ops/*.py
} > "$out/env.txt" 2>&1
(xz -dc "$p/so/_C_stable_libtorch.abi3.so.xz" > "$work/_C_stable_libtorch.abi3.so" \
  && cp "$p/so/SHA256SUMS" "$work/" && cd "$work" && sha256sum -c SHA256SUMS) >> "$out/env.txt" 2>&1 &
unpack=$!
export SMLA_TREE=$PWD/$p/tree SMLA_VLLM_C_SO=$work/_C_stable_libtorch.abi3.so
export SMLA_FP8_RESULTS=$out/fp8-gpu-results.jsonl
timeout 75 python3 bench/bench_fp8_kv.py --prewarm 14 --prewarm-only --sweep > "$out/prewarm.log" 2>&1 \
  || echo "prewarm exit $?" >> "$out/prewarm.log"
wait "$unpack" || echo "unpacking the compiled ops failed" >> "$out/env.txt"
rc=0
timeout 80 python3 -m pytest tests/gpu/test_fp8_kv_gpu.py -m gpu -q -p no:cacheprovider -rA \
  > "$out/fp8-gpu-tests.log" 2>&1 || rc=$?
tail -3 "$out/fp8-gpu-tests.log"
timeout 60 python3 bench/bench_fp8_kv.py --sweep --out "$out/bench" > "$out/bench.log" 2>&1 \
  || echo "bench exit $?" >> "$out/bench.log"
tail -22 "$out/bench.log"
exit $rc

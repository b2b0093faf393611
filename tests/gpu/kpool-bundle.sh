#!/usr/bin/env bash
# The files tests/gpu/test_kpool_indexer_gpu.py loads on the lent H200 (no vLLM installed there),
# copied from the patched 0.33.0 tree into OUTDIR (git-ignored; default .gpu-port/kpool, a few
# hundred KB): vllm/__init__.py (the tests' tree check), the kpool kernels and the Triton indexer
# logits with their shared helpers. Then, in one call (< 2 min; carry OUTDIR):
#   SMLA_TREE=$PWD/.gpu-port/kpool SMLA_KPOOL_RESULTS=$OUT/kpool-gpu.jsonl timeout 150 \
#     python3 -m pytest tests/gpu/test_kpool_indexer_gpu.py -q -p no:cacheprovider -rA -s
# (add SMLA_DEEPGEMM_DIR=<folder holding deep_gemm/> to compare with DeepGEMM, e.g. the wheel's
# vllm/third_party/deep_gemm that tests/gpu/make-bundle.sh packs into .gpu-port/dg.tar.xz).
# Also the line's own tests of its own kernels (patch 0006's fused DeepSeek-V3.2 / GLM-5 cache
# writers and index query, patch 0014's kpool writers; tests/gpu/line_ops_stub.py stands in for vLLM):
#   PYTHONPATH=tests:tests/gpu SMLA_TREE=$PWD/.gpu-port/kpool python3 -m pytest -p line_ops_stub \
#     -p no:cacheprovider -q -rA .gpu-port/kpool/tests/kernels/
# usage (repo root, after `make patch`): bash tests/gpu/kpool-bundle.sh [OUTDIR]
set -euo pipefail
out=${1:-.gpu-port/kpool}
tree=${SMLA_TREE:-work/0.33.0/vllm}
files=(vllm/__init__.py
       vllm/models/glm5next/nvidia/ops/kpool_compress.py
       vllm/v1/attention/ops/triton_dsa_indexer.py
       vllm/v1/attention/ops/triton_fp8_e4m3.py
       vllm/v1/attention/ops/triton_launch.py
       vllm/models/deepseek_v32/common/kernels.py
       tests/kernels/test_fused_deepseek_v32_fp8_encode.py
       tests/kernels/test_glm5next_kpool_fp8_encode.py)
rm -rf "$out"
for f in "${files[@]}"; do
  test -f "$tree/$f" || { echo "$tree/$f is missing: run make patch (the 0.33.0 line)" >&2; exit 2; }
  mkdir -p "$out/$(dirname "$f")" && cp "$tree/$f" "$out/$f"
done
grep -q "FP8_HW" "$out/vllm/models/glm5next/nvidia/ops/kpool_compress.py" \
  || { echo "$tree lacks the series' kpool patch (0014)" >&2; exit 2; }
du -sh "$out"

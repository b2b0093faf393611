#!/usr/bin/env bash
# Build the bundle for tests/gpu/device-run.sh (the lent H200: torch 2.11 + triton 3.6, no network,
# 64 MiB per call), in parts that travel together in one call (device-run.sh all; ~64 MB with the repo):
#   OUTDIR/so/    vllm/_C_stable_libtorch.abi3.so of the official wheel of the pinned release
#                 (all of vLLM's CUDA ops, torch.ops._C*), xz-compressed (~55 MB), + its sha256
#   OUTDIR/kern/  the kernel files the kernel tests and the benchmarks load by path (+ vllm/__init__.py)
#                 and the series' own kernel tests (tests/kernels/attention/test_triton_*.py)
#   OUTDIR/v4series/  the series' DeepSeek-V4 and breakable-CUDA-graph tests, with their package
#                 files (device-run.sh installed runs them against the installed wheel)
#   OUTDIR/fm/, OUTDIR/dg.tar.xz  FlashMLA's and DeepGEMM's compiled code from the same wheel
#                 (the benchmarks' upstream sides); OUTDIR/before/ (optional, by hand): an earlier
#                 series' kernel files, for the benchmarks' "before" column
#   OUTDIR/kpool/ (part "kpool", not in the default parts) the GLM-5.3-Flash pooled-indexer files of
#                 tests/gpu/kpool-bundle.sh (0.33.0 line)
#   OUTDIR/tree/  the patched tree's vllm/ (tracked files less tests/gpu/bundle-prune.txt, tar.xz), the wheels of
#                 bundle-requirements.txt and a vllm-<version>.dist-info (vLLM picks its platform
#                 from the installed distribution's metadata; a source tree has none)
# usage (repo root, after `make patch`, with network for the wheels):
#   bash tests/gpu/make-bundle.sh [OUTDIR=.gpu-port] [WHEEL=<official wheel of the pin>]
# OUTDIR must be git-ignored (.gitignore lists the default, .gpu-port).
# SMLA_BUNDLE_PARTS (default "so fm kern v4series tree"): the parts to build, e.g. "fm kern kpool"
# for device-run.sh glm53 (fm also writes dg.tar.xz; so and tree are the large ones, tree downloads).
set -euo pipefail
parts=" ${SMLA_BUNDLE_PARTS:-so fm kern v4series tree} "
has() { [[ $parts == *" $1 "* ]]; }
out=${1:-.gpu-port}
line=${SMLA_LINE:-$(ls lines | grep -E '^[0-9]' | sort -V | tail -n 1)}  # the release line (default: newest)
version=$(sed -n 's/^version *= *//p' "lines/$line/vllm-pin.txt")
wheel=${2:-$HOME/.cache/vllm-sparse-mla/downloads/vllm-$version-cp38-abi3-manylinux_2_28_x86_64.whl}
tree=${SMLA_TREE:-work/$line/vllm}
py=${PYTHON:-python3}
test -f "$wheel" || { echo "no official wheel at $wheel (give its path as the 2nd argument)" >&2; exit 2; }
rm -rf "$out" && mkdir -p "$out"

if has so; then
mkdir -p "$out/so"
"$py" - "$wheel" "$out/so" <<'PY'
import hashlib, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
data = zipfile.ZipFile(wheel).read("vllm/_C_stable_libtorch.abi3.so")
open(f"{dest}/_C_stable_libtorch.abi3.so", "wb").write(data)
open(f"{dest}/SHA256SUMS", "w").write(hashlib.sha256(data).hexdigest() + "  _C_stable_libtorch.abi3.so\n")
PY
xz -T0 -9 --x86 --lzma2=preset=9 -f "$out/so/_C_stable_libtorch.abi3.so"
fi

# FlashMLA (the attention benchmark's upstream side) and DeepGEMM (the indexer's), from the same
# wheel: device-run.sh speed
if has fm; then
mkdir -p "$out/fm" /tmp/smla-bundle-dg && rm -rf /tmp/smla-bundle-dg/*
"$py" - "$wheel" "$out/fm" /tmp/smla-bundle-dg <<'PY'
import sys, zipfile
wheel, fm, dg = sys.argv[1:]
z = zipfile.ZipFile(wheel)
open(f"{fm}/_flashmla_C.abi3.so", "wb").write(z.read("vllm/_flashmla_C.abi3.so"))
# its Python interface (flash_mla_with_kvcache: bench/bench_dsv4.py calls it as vLLM does)
open(f"{fm}/flash_mla_interface.py", "wb").write(
    z.read("vllm/third_party/flashmla/flash_mla_interface.py"))
for name in z.namelist():
    if name.startswith("vllm/third_party/deep_gemm/") and not (
            "/_C.cpython-" in name and "cpython-312" not in name):
        z.extract(name, dg)
PY
xz -9 -f "$out/fm/_flashmla_C.abi3.so"
tar -C /tmp/smla-bundle-dg/vllm/third_party -cJf "$out/dg.tar.xz" deep_gemm
fi

if has kern; then
mkdir -p "$out/kern/vllm/v1/attention/ops"
cp "$tree"/vllm/__init__.py "$out/kern/vllm/"  # tests check for a vLLM tree by this file
# the kernel modules import their shared helpers (triton_fp8_e4m3.py, triton_launch.py) by absolute name;
# the tests provide the package path (tests/sparse_mla_reference.py::provide_ops_package)
cp "$tree"/vllm/v1/attention/ops/triton_{sparse_mla,sparse_mla_dsv4,dsa_indexer,fp8_e4m3,launch,decode_attention}.py \
  "$out/kern/vllm/v1/attention/ops/"
# the series' own kernel tests (each in its kernel's patch), run by device-run.sh speed
mkdir -p "$out/kern/tests/kernels/attention"
# the DeepSeek-V4 attention classes, read as text by bench/bench_dsv4.py (their decode calls)
mkdir -p "$out/kern/vllm/models/deepseek_v4/nvidia"
cp "$tree"/vllm/models/deepseek_v4/nvidia/{triton_sparse,flashmla}.py "$out/kern/vllm/models/deepseek_v4/nvidia/"
cp "$tree"/tests/kernels/attention/test_triton_{sparse_mla,sparse_mla_dsv4,dsa_indexer,fp8_e4m3}.py \
  "$out/kern/tests/kernels/attention/"
fi

if has kpool; then
  bash tests/gpu/kpool-bundle.sh "$out/kpool"
fi

# the series' DeepSeek-V4 tests (its DeepSeek-V4 patches: e4m3 ops with the software conversion forced,
# mHC, o_proj, CuTe DSL gates, the attention class, breakable CUDA graphs), run by
# device-run.sh installed against the wheel the e2e run installed; kept apart from kern/, whose
# tests run without an installed vLLM
if has v4series; then
v4=$out/v4series
mkdir -p "$v4/tests/kernels/attention" "$v4/tests/v1/cudagraph"
for d in tests tests/kernels tests/v1 tests/v1/cudagraph; do cp "$tree/$d/__init__.py" "$v4/$d/"; done
cp "$tree"/tests/kernels/test_deepseek_v4_*.py "$v4/tests/kernels/"
cp "$tree"/tests/kernels/attention/test_{deepseek_v4_triton_attention,triton_sparse_mla_dsv4}.py \
  "$v4/tests/kernels/attention/"
cp "$tree"/tests/v1/cudagraph/test_breakable_cudagraph.py "$v4/tests/v1/cudagraph/"
fi

if has tree; then
mkdir -p "$out/tree/whl" "$out/tree/site-extra/vllm-$version.dist-info"
git -C "$tree" ls-files vllm | grep -v '\.\(md\|png\|jpg\)$' | "$py" -c '
import sys
prune, keep = [], set()
for line in open("tests/gpu/bundle-prune.txt"):
    kind, _, path = line.partition(" ")
    if kind == "prune":
        prune.append(path.strip() + "/")
    elif kind == "keep":
        keep.add(path.strip())
for f in sys.stdin.read().split():
    if f in keep or not any(f.startswith(p) for p in prune):
        print(f)
' | tar -C "$tree" -T - -cf - | xz -T0 -9 > "$out/tree/tree.tar.xz"
platforms=()
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_26_x86_64 manylinux_2_28_x86_64 \
         manylinux1_x86_64 manylinux_2_5_x86_64 any; do
  platforms+=(--platform "$p")
done
grep -Ev '^\s*(#|$)' tests/gpu/bundle-requirements.txt | while read -r req; do
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d "$out/tree/whl" "$req"
done
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\n' "$version" \
  > "$out/tree/site-extra/vllm-$version.dist-info/METADATA"
printf 'vllm\n' > "$out/tree/site-extra/vllm-$version.dist-info/top_level.txt"
fi
du -sb "$out"/*

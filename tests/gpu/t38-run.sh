#!/usr/bin/env bash
# The series' GPU kernel tests and the attention benchmark under a carried Triton 3.8 (what vLLM
# 0.33.0's torch 2.14 pins) beside the image's torch 2.11, with the same benchmark cells under the
# image's Triton 3.6 in the same call (issue 32, "Proof on the H200"). Called as
# `bash tests/gpu/device-run.sh t38-stage|t38` from the repo root, over consecutive calls on one
# warm machine (30 s between calls; /tmp and the ignored paths carried earlier stay meanwhile):
#   t38-stage  carry .t38/manifest.json + one .t38/pieces/NN, and/or .gpu-port/so .gpu-port/fm
#              .gpu-port/dg.tar.xz: keeps the Triton pieces in $store (sha256 checked,
#              tests/e2e/device_pieces.py) and unpacks vLLM 0.26.0's compiled ops, FlashMLA and
#              DeepGEMM into /tmp/smla-port (sha256 of the ops checked). Seconds.
#   t38        carry .t38/manifest.json + the last piece, .gpu-port/kern, .gpu-port/kpool: assembles
#              and checks the wheel (exit 20 if a piece is missing), installs it into /tmp/t38,
#              requires `import triton` to give 3.8.0 from /tmp/t38, then (Triton 3.8, in parallel)
#              tests/gpu/test_{kernel,fp8_kv}_gpu.py | test_{indexer,nope}_gpu.py | the series'
#              tests/kernels/attention tests (kern/), test_kpool_indexer_gpu.py and the 0.33.0 line's
#              own tests of its fused V3.2/GLM and kpool kernels (kpool/, tests/gpu/line_ops_stub.py), while
#              the benchmark cells compile for both Tritons; then bench/bench_attention.py on
#              SMLA_T38_HEADS x SMLA_T38_TOKENS (default 16,32,64 x 1,1024; bf16 and fp8_ds_mla,
#              both e4m3 paths, both fp8 kernels) under 3.6, then under 3.8, and
#              bench/compare_triton.py. About 7 minutes (worst case, every timeout hit: 9.5).
# Three calls, each under the 64 MiB a call carries with the repo (10.1 MB on 2026-12-02; 12.3 MB on
# 2026-12-03, when call 2 no longer fit: split the .xz in two (`split -b 40000000`), carry each
# piece in a call of its own, `cat | xz -dc` it into $work with its SHA256SUMS, then t38-stage):
# (2026-12-04: with the repo at 13.1 MB even pieces/01 beside .gpu-port/fm no longer fit; cut the payload
# in three, `python tests/gpu/t38_bundle.py --resplit --piece-mib 34`, and stage 01 and 02 before t38.)
#   1. t38-stage  carry .t38/manifest.json .t38/pieces/01                    (+52.4 MB)
#   2. t38-stage  carry .gpu-port/so                                         (+55.4 MB)
#   3. t38        carry .t38/manifest.json .t38/pieces/02 .gpu-port/kern .gpu-port/kpool
#                       .gpu-port/dg.tar.xz .gpu-port/fm                      (+53.4 MB)
# (FlashMLA and DeepGEMM are optional: the benchmark's upstream column and the indexer tests'
# DeepGEMM comparisons; without vLLM's compiled ops the tests that need them skip, saying so.)
# Results in $OUT (<= 8 files): t38-summary.txt (with gpu-env-t38.txt), bench-compare.txt,
# gpu-tests-t38.txt (each pytest's last lines and failures), attention-3.6.json, attention-3.8.json,
# indexer-3.6.json, indexer-3.8.json (SMLA_T38_INDEXER=1), logs.tar.xz (everything).
# SMLA_T38_DRY=1 (CPU, no GPU): staging, assembly and the checks only; no install, tests or benchmark.
# A rerun of some test groups alone (call 3 on a machine still warm from calls 1-3, or calls 1-3 anew):
#   SMLA_T38_BENCH=0  no benchmark (nor its prewarm): the tests only
#   SMLA_T38_SWEEP_BF16=16,32,64  the benchmark times the 16-bit kernel's tiles for these head counts
#                     instead of the engine cells (bench_attention.py --sweep-bf16; rows "bfloat16*"
#                     in bench-compare.txt), e.g. with SMLA_T38_TESTS="" (no tests)
#   SMLA_T38_INDEXER=1  also bench/indexer/bench_indexer.py --dsv4 under 3.6, then 3.8 (DeepGEMM's column
#                     where .gpu-port/dg.tar.xz was carried): indexer-3.{6,8}.json, bench-compare.txt;
#                     =sweep: --quick --sweep instead (the indexer's launch configs under both)
#   SMLA_T38_BENCH_S  seconds for each Triton's timed benchmark (default 110; 200 with the sweep)
#   SMLA_T38_TESTS    the test groups to run (default "kernel indexer series kpool line"; "" none):
#                     kernel = test_{kernel,fp8_kv}_gpu.py, indexer = test_{indexer,nope}_gpu.py,
#                     series = kern/'s tests/kernels/attention, kpool = test_kpool_indexer_gpu.py,
#                     line = kpool/'s tests/kernels (the 0.33.0 line's own)
#   e.g. the series' and the line's tests alone, in two calls (the compiled ops, FlashMLA and DeepGEMM
#   are not needed by these two groups):
#     1. t38-stage  carry .t38/manifest.json .t38/pieces/01
#     2. SMLA_T38_BENCH=0 SMLA_T38_TESTS="series line" bash tests/gpu/device-run.sh t38
#                   carry .t38/manifest.json .t38/pieces/02 .gpu-port/kern .gpu-port/kpool
set -euo pipefail
phase=${1:?usage: t38-run.sh t38-stage|t38}
shift || true
out=${OUT:-/tmp/smla-t38-out}
store=${SMLA_T38_STORE:-/tmp/smla-t38}
site=${SMLA_T38_SITE:-/tmp/t38}
work=${SMLA_T38_PORT:-/tmp/smla-port}
dry=${SMLA_T38_DRY:-0}
b=.gpu-port
mkdir -p "$out" "$work"
unset TRITON_INTERPRET

# vLLM 0.26.0's compiled ops, FlashMLA, DeepGEMM: from what this call carried into $work
# (they then stay in /tmp for the later calls)
unpack_port() {
  if [ -f "$b/so/SHA256SUMS" ] && ! (cd "$work" && sha256sum -c --quiet "$OLDPWD/$b/so/SHA256SUMS" >/dev/null 2>&1); then
    xz -dc "$b/so/_C_stable_libtorch.abi3.so.xz" > "$work/_C_stable_libtorch.abi3.so"
    cp "$b/so/SHA256SUMS" "$work/"
    (cd "$work" && sha256sum -c SHA256SUMS) || { rm -f "$work/_C_stable_libtorch.abi3.so"; return 21; }
  fi
  if [ -f "$b/fm/_flashmla_C.abi3.so.xz" ] && [ ! -f "$work/_flashmla_C.abi3.so" ]; then
    xz -dc "$b/fm/_flashmla_C.abi3.so.xz" > "$work/_flashmla_C.abi3.so.part" \
      && mv "$work/_flashmla_C.abi3.so.part" "$work/_flashmla_C.abi3.so"
  fi
  if [ -f "$b/dg.tar.xz" ] && [ ! -d "$work/dg/deep_gemm" ]; then
    rm -rf "$work/dg.part" && mkdir -p "$work/dg.part" && tar -xJf "$b/dg.tar.xz" -C "$work/dg.part" \
      && mv "$work/dg.part" "$work/dg"
  fi
  echo "port files in $work: $(cd "$work" && ls -d _C_stable_libtorch.abi3.so _flashmla_C.abi3.so dg 2>/dev/null | tr '\n' ' ')"
}

case "$phase" in
  t38-stage)
    rc=0
    if [ -f .t38/manifest.json ]; then
      python3 tests/e2e/device_pieces.py stage --bundle .t38 --store "$store" || rc=$?
    fi
    unpack_port || rc=$?
    exit $rc
    ;;
  t38) ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac

# ---- t38: assemble, install, check ----
bench=${SMLA_T38_BENCH:-1}
groups=" ${SMLA_T38_TESTS-kernel indexer series kpool line} "
for g in $groups; do
  case "$g" in kernel|indexer|series|kpool|line) ;; *) echo "SMLA_T38_TESTS: unknown group $g" >&2; exit 2 ;; esac
done
run() { [[ $groups == *" $1 "* ]]; }
python3 tests/e2e/device_pieces.py assemble --bundle .t38 --store "$store" | tee "$out/assemble.log"
unpack_port | tee -a "$out/assemble.log"
whl=$(ls "$store"/payload/triton-3.8.0-*.whl)
sum=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["payload"]["sha256"])' "$store/manifest.json")
need=kern; { run kpool || run line; } && need="kern kpool"
for d in $need; do
  [ -f "$b/$d/vllm/__init__.py" ] || { echo "$b/$d was not carried (tests/gpu/make-bundle.sh, kpool-bundle.sh)" >&2; exit 22; }
done
if [ "$dry" = 1 ]; then
  echo "dry run: $whl assembled and checked (payload $sum); install, tests and benchmark skipped"
  exit 0
fi
if [ "$(cat "$site/.installed" 2>/dev/null)" != "$sum" ]; then
  rm -rf "$site"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$whl"
  echo "$sum" > "$site/.installed"
fi
t38() { PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} TRITON_CACHE_DIR=/tmp/t38-cache "$@"; }
t36() { TRITON_CACHE_DIR=/tmp/t36-cache "$@"; }
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  env="import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, triton.__file__)"
  echo "3.6: $(t36 python3 -c "$env")"
  echo "3.8: $(t38 python3 -c "$env")"
  sha256sum "$b"/kern/vllm/v1/attention/ops/*.py "$b"/kpool/vllm/models/*/*/*.py "$b"/kpool/vllm/models/*/*/*/*.py || true
} | tee "$out/gpu-env-t38.txt"
t38 python3 -c "import sys, triton; sys.exit(0 if triton.__version__ == '3.8.0' and triton.__file__.startswith('$site/') else 23)" \
  || { echo "Triton 3.8.0 does not import from $site" | tee -a "$out/gpu-env-t38.txt"; exit 23; }

# ---- the tests under 3.8 (four pytest processes) while both benchmarks' launches compile ----
[ -f "$work/_C_stable_libtorch.abi3.so" ] && export SMLA_VLLM_C_SO=$work/_C_stable_libtorch.abi3.so
[ -d "$work/dg/deep_gemm" ] && export SMLA_DEEPGEMM_DIR=$work/dg CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PYTHONUNBUFFERED=1
heads=${SMLA_T38_HEADS:-16,32,64} tokens=${SMLA_T38_TOKENS:-1,1024}
cells=(--heads "$heads" --tokens "$tokens")
bench_s=110 prewarm=4
# SMLA_T38_SWEEP_BF16=16,32,64: instead of the engine cells, the 16-bit kernel's tiles for these
# head counts (bench_attention.py --sweep-bf16) at SMLA_T38_TOKENS (default 1024,4096), both
# Tritons compiling at once (8 processes each)
if [ -n "${SMLA_T38_SWEEP_BF16:-}" ]; then
  cells=(--sweep-bf16 "$SMLA_T38_SWEEP_BF16" --tokens "${SMLA_T38_TOKENS:-1024,4096}")
  bench_s=200 prewarm=8
fi
bench_s=${SMLA_T38_BENCH_S:-$bench_s}  # each Triton's timed run
kern=$PWD/$b/kern
export SMLA_TREE=$kern
py="python3 -m pytest -m gpu -q -p no:cacheprovider -rA"
pids=() logs=()
if run kernel; then
(SMLA_GPU_RESULTS=$out/gpu-results.jsonl SMLA_FP8_RESULTS=$out/fp8-gpu-results.jsonl \
  t38 timeout 280 $py tests/gpu/test_kernel_gpu.py tests/gpu/test_fp8_kv_gpu.py "$@" \
  > "$out/tests-kernel-fp8.log" 2>&1) & pids+=($!) logs+=(tests-kernel-fp8)
fi
if run indexer; then
(SMLA_INDEXER_RESULTS=$out/indexer-gpu-results.jsonl SMLA_GPU_RESULTS=$out/nope-gpu-results.jsonl \
  t38 timeout 280 $py tests/gpu/test_indexer_gpu.py tests/gpu/test_nope_gpu.py "$@" \
  > "$out/tests-indexer-nope.log" 2>&1) & pids+=($!) logs+=(tests-indexer-nope)
fi
if run series; then
# 250 s reached 88 of the ~101 tests under 3.8 on 2026-12-02 (each compiles its launches serially):
# a series-only call can give it more (SMLA_T38_SERIES_S=500)
(PYTHONPATH=$PWD/tests:$PWD/tests/gpu t38 timeout "${SMLA_T38_SERIES_S:-250}" python3 -m pytest -p series_ops_stub \
  -p no:cacheprovider -q -rA "$b"/kern/tests/kernels/attention/ > "$out/tests-series.log" 2>&1) & pids+=($!) logs+=(tests-series)
fi
if run kpool || run line; then
(if run kpool; then SMLA_TREE=$PWD/$b/kpool SMLA_KPOOL_RESULTS=$out/kpool-gpu.jsonl t38 timeout 80 \
  python3 -m pytest tests/gpu/test_kpool_indexer_gpu.py -q -p no:cacheprovider -rA -s \
  > "$out/tests-kpool.log" 2>&1 || f=1; fi
 if run line; then PYTHONPATH=$PWD/tests:$PWD/tests/gpu SMLA_TREE=$PWD/$b/kpool t38 timeout 80 python3 -m pytest \
  -p line_ops_stub -p no:cacheprovider -q -rA "$b"/kpool/tests/kernels/ > "$out/tests-line-0.33.0.log" 2>&1 || f=1; fi
 exit ${f:-0}) & pids+=($!)
 run kpool && logs+=(tests-kpool)
 run line && logs+=(tests-line-0.33.0)
fi
p4=
if [ "$bench" != 0 ] && [ "$prewarm" = 8 ]; then
  (t36 timeout 200 python3 bench/bench_attention.py "$out/bench-3.6" "${cells[@]}" --prewarm 8 --prewarm-only \
    > "$out/prewarm-3.6.log" 2>&1 & t38 timeout 200 python3 bench/bench_attention.py "$out/bench-3.8" \
    "${cells[@]}" --prewarm 8 --prewarm-only > "$out/prewarm-3.8.log" 2>&1; wait) & p4=$!
elif [ "$bench" != 0 ]; then
  (t36 timeout 120 python3 bench/bench_attention.py "$out/bench-3.6" "${cells[@]}" --prewarm 4 --prewarm-only \
  > "$out/prewarm-3.6.log" 2>&1 || true; t38 timeout 150 python3 bench/bench_attention.py "$out/bench-3.8" \
  "${cells[@]}" --prewarm 4 --prewarm-only > "$out/prewarm-3.8.log" 2>&1) & p4=$!
fi
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
[ -n "$p4" ] && { wait "$p4" || true; }
{
  for f in "${logs[@]}"; do
    echo "== $f"; grep -E "^(FAILED|ERROR)" "$out/$f.log" | cut -c1-220 || true; tail -n 1 "$out/$f.log"
  done
} | tee "$out/gpu-tests-t38.txt"

# ---- the benchmark: 3.6, then 3.8, alone on the GPU ----
if [ "$bench" != 0 ]; then
[ -f "$work/_flashmla_C.abi3.so" ] && export SMLA_FLASHMLA_SO=$work/_flashmla_C.abi3.so
t36 timeout "$bench_s" python3 bench/bench_attention.py "$out/bench-3.6" "${cells[@]}" \
  > "$out/bench-3.6.log" 2>&1 || echo "bench 3.6 exit $?" | tee -a "$out/bench-3.6.log"
t38 timeout "$bench_s" python3 bench/bench_attention.py "$out/bench-3.8" "${cells[@]}" \
  > "$out/bench-3.8.log" 2>&1 || echo "bench 3.8 exit $?" | tee -a "$out/bench-3.8.log"
python3 bench/compare_triton.py "$out/bench-3.6/attention.json" "$out/bench-3.8/attention.json" \
  | tee "$out/bench-compare.txt" || true
else
  echo "SMLA_T38_BENCH=0: no benchmark" > "$out/bench-compare.txt"
fi
if [ "${SMLA_T38_INDEXER:-0}" != 0 ]; then
  # the indexer benchmark (DSA and DeepSeek-V4 cells; "sweep": one cell each and the launch configs
  # of --sweep) under 3.6, then 3.8; DeepGEMM where carried
  iargs=(--dsv4); [ "$SMLA_T38_INDEXER" = sweep ] && iargs=(--quick --sweep)
  t36 timeout 200 python3 bench/indexer/bench_indexer.py "$out/indexer-3.6" "${iargs[@]}" \
    > "$out/indexer-3.6.log" 2>&1 || echo "indexer 3.6 exit $?" | tee -a "$out/indexer-3.6.log"
  t38 timeout 200 python3 bench/indexer/bench_indexer.py "$out/indexer-3.8" "${iargs[@]}" \
    > "$out/indexer-3.8.log" 2>&1 || echo "indexer 3.8 exit $?" | tee -a "$out/indexer-3.8.log"
  python3 bench/compare_triton.py "$out/indexer-3.6/indexer.json" "$out/indexer-3.8/indexer.json" \
    | tee -a "$out/bench-compare.txt" || true
  cp "$out/indexer-3.6/indexer.json" "$out/indexer-3.6.json" 2>/dev/null || true
  cp "$out/indexer-3.8/indexer.json" "$out/indexer-3.8.json" 2>/dev/null || true
fi
{ cat "$out/gpu-env-t38.txt" "$out/gpu-tests-t38.txt"; echo "== bench (3.8 / 3.6)"; cat "$out/bench-compare.txt"; } \
  > "$out/t38-summary.txt" 2>/dev/null || true
cp "$out/bench-3.6/attention.json" "$out/attention-3.6.json" 2>/dev/null || true
cp "$out/bench-3.8/attention.json" "$out/attention-3.8.json" 2>/dev/null || true
# everything in one archive, the summaries beside it (<= 8 files come back)
tar -C "$out" -cJf /tmp/smla-t38-logs.tar.xz . && mv /tmp/smla-t38-logs.tar.xz "$out/logs.tar.xz"
find "$out" -mindepth 1 -type f -not -name logs.tar.xz -not -name t38-summary.txt -not -name bench-compare.txt \
  -not -name gpu-tests-t38.txt -not -name 'attention-3.*.json' \
  -not -name 'indexer-3.*.json' -delete
find "$out" -mindepth 1 -type d -empty -delete
exit $rc

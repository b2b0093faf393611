#!/usr/bin/env bash
# GPU tests on the lent H200 (no network, 64 MiB per call).  `all` (one call) is what produced
# tests/gpu/results; the two-phase variant needs two consecutive calls on the same warm machine (the
# files of phase 1 left in /tmp are still there for phase 2), which another user's call in between breaks:
#   all      carry .gpu-port/so .gpu-port/tree : kernel tests, backend tests (native import with vLLM's
#            compiled ops), benchmark
#   kernels  carry .gpu-port/so .gpu-port/kern : unpack vLLM's compiled ops to /tmp/smla-port
#            (checked against SHA256SUMS), run tests/gpu/test_kernel_gpu.py and the benchmark
#   backend  carry .gpu-port/tree : unpack the patched tree, put the compiled ops of phase 1 into
#            it, install the wheels, run tests/gpu/test_backend_gpu.py with vLLM imported natively
#            (stand-in import if phase 1's ops are missing: the real-op test then skips)
#   bench    carry .gpu-port/kern : the benchmark alone
#   installed  carry nothing [or .gpu-port/v4series]: right after `tests/e2e/device-run.sh run` on the
#            same warm machine, the series' wheel (make build-wheel) is installed in
#            /tmp/smla-e2e/site with vLLM's own compiled ops; kernel, fp8 KV and backend tests
#            against that installed vllm, [the series' DeepSeek-V4 and breakable-CUDA-graph tests,]
#            then the fp8 benchmark (bench/bench_fp8_kv.py --sweep)
#   fp8      carry .gpu-port/so .gpu-port/kern : kernel and fp8 KV tests and the fp8 benchmark on
#            the work tree's kernels, before they are built into a wheel
#   speed    carry .gpu-port/so .gpu-port/fm .gpu-port/dg.tar.xz .gpu-port/kern [.gpu-port/before]
#            (FlashMLA, DeepGEMM, the kernel files and the series' tests/kernels/attention tests;
#            before/: an earlier series' kernel files): GPU tests, the series' own tests,
#            the engine-form attention benchmark vs FlashMLA and the indexer benchmark vs DeepGEMM;
#            with SMLA_BENCH_DSV4=1 also the DeepSeek-V4 decode benchmark (bench/bench_dsv4.py)
#   attention  carry .gpu-port/so .gpu-port/fm .gpu-port/dg.tar.xz .gpu-port/kern : GPU tests while
#            the attention benchmark's launches compile, then bench/bench_attention.py (fp8 cells
#            with both fp8 kernels, both e4m3 paths) and bench/bench_host.py (issue 34)
#   dsv4     carry .gpu-port/fm .gpu-port/kern : the series' V4 kernel test (series-dsv4-tests.log;
#            SMLA_SKIP_TESTS=1 skips it), then the DeepSeek-V4 decode benchmark, ours vs
#            FlashMLA (bench/bench_dsv4.py; $OUT/dsv4.json, bench-dsv4.log)
#   fp8prefill  carry .gpu-port/fm .gpu-port/kern .gpu-port/tree : the series' kernel tests, the
#            backend GPU tests (stand-in import of the patched tree), then bench/bench_fp8_prefill.py
#            (the fp8 prefill route vs the fp8 kernels vs FlashMLA; $OUT/fp8-prefill/fp8_prefill.json)
#   nope     carry .gpu-port/nope (the kernel files and the series' kernel test, copied from the
#            work tree: see the phase below): the NoPE (GLM-5.3-Flash, head 512) GPU test
#            tests/gpu/test_nope_gpu.py and the series' test_sparse_mla_fwd_nope; about a minute
#   glm53    carry .gpu-port/glm53 (GLM-5.3-Flash, issue 36; ~3 MB, made on the CPU side after
#            `make patch` by  SMLA_BUNDLE_PARTS="fm kern kpool" bash tests/gpu/make-bundle.sh \
#            .gpu-port/glm53 ~/.cache/vllm-sparse-mla/downloads/vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl
#            : FlashMLA and DeepGEMM of the 0.26.0 wheel, the 0.33.0 line's kernel files and
#            kpool files): the NoPE GPU test, the kpool pooled-indexer GPU test (vs DeepGEMM too)
#            and the series' fwd_nope test while the benchmark's attention launches compile, then
#            bench/bench_glm53.py (NoPE attention vs FlashMLA, pooled logits vs DeepGEMM;
#            $OUT/glm53.json); the benchmark stops SMLA_GLM53_BUDGET seconds (380) after the phase started.
#            A rerun of some of it: SMLA_GLM53_TESTS (default "nope kpool series"; "" none) the test
#            groups, SMLA_GLM53_BENCH=0 no benchmark (nor its prewarm); e.g. the series' test alone
#            (under a minute): SMLA_GLM53_BENCH=0 SMLA_GLM53_TESTS=series bash tests/gpu/device-run.sh glm53
#   t38-stage, t38  the GPU tests and the attention benchmark under a carried Triton 3.8 (vLLM
#            0.33.0's; before/after against the image's 3.6), over consecutive warm calls:
#            tests/gpu/t38-run.sh says what each call carries (bundle: tests/gpu/t38_bundle.py)
# installed and fp8 pack their logs into $OUT/logs.tar.xz (a call returns at most 8 files).
# usage (repo root): bash tests/gpu/device-run.sh all|kernels|backend|bench|...|glm53 [pytest args]
# Results under $OUT: gpu-env.txt, gpu-tests-<phase>.log, gpu-results.jsonl, bench/ (kernels).
set -euo pipefail
phase=${1:?usage: device-run.sh kernels|backend [pytest args]}
shift
case "$phase" in t38-stage|t38) exec bash tests/gpu/t38-run.sh "$phase" "$@" ;; esac
out=${OUT:-/tmp/smla-gpu-out}
work=/tmp/smla-port
b=.gpu-port
mkdir -p "$out" "$work"
unset TRITON_INTERPRET
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__)'
} | tee "$out/gpu-env-$phase.txt"
# Kernel + fp8 KV tests (SMLA_TREE, SMLA_VLLM_C_SO set), then the fp8 benchmark; sets rc.
fp8_suite() {
  export SMLA_GPU_RESULTS=$out/gpu-results.jsonl SMLA_FP8_RESULTS=$out/fp8-gpu-results.jsonl
  timeout 75 python3 bench/bench_fp8_kv.py --prewarm 14 --prewarm-only --sweep > "$out/prewarm.log" 2>&1 \
    || echo "prewarm exit $?" >> "$out/prewarm.log"
  timeout 120 python3 -m pytest tests/gpu/test_kernel_gpu.py tests/gpu/test_fp8_kv_gpu.py -m gpu -q \
    -p no:cacheprovider -rA "$@" > "$out/gpu-tests-kernels.log" 2>&1 || rc=$?
  tail -2 "$out/gpu-tests-kernels.log"
}
fp8_bench() {
  timeout 90 python3 bench/bench_fp8_kv.py --sweep --out "$out/bench-fp8" > "$out/bench-fp8.log" 2>&1 \
    || echo "bench exit $?" >> "$out/bench-fp8.log"
  grep -E "^(H|copy)" "$out/bench-fp8.log" || tail -5 "$out/bench-fp8.log"
  # everything in one archive, then only the summaries beside it (<= 8 files come back)
  tar -C "$out" -cJf /tmp/smla-gpu-logs.tar.xz . && mv /tmp/smla-gpu-logs.tar.xz "$out/logs.tar.xz"
  find "$out" -mindepth 1 -not -name logs.tar.xz -not -name 'gpu-tests-*.log' -not -name 'gpu-env-*' \
    -not -name fp8-gpu-results.jsonl -not -name bench-fp8.log -delete
}
# vLLM's compiled ops from .gpu-port/so to $work, checked against the wheel member's sha256; without
# .gpu-port/so in this call, the copy an earlier call on the same warm machine left there (e.g.
# `device-run.sh t38-stage` carrying .gpu-port/so alone: the ops and the rest exceed one call's 64 MiB).
# With the repo at ~15 MB (2026-12-05) even .gpu-port/so beside fm, dg.tar.xz and kern no longer fits:
# `split -b 28000000` the .xz, carry the first piece in a call that copies it to $work, then in the
# next call (same warm machine) `cat` both pieces | xz -dc > $work/_C_stable_libtorch.abi3.so and
# copy SHA256SUMS beside it, carrying the rest but not .gpu-port/so (bench/results/h100-2026-12-05/).
unpack_so() {
  if [ ! -d "$b/so" ] && [ -f "$work/SHA256SUMS" ]; then
    (cd "$work" && sha256sum -c SHA256SUMS)
    return
  fi
  xz -dc "$b/so/_C_stable_libtorch.abi3.so.xz" > "$work/_C_stable_libtorch.abi3.so" \
    && cp "$b/so/SHA256SUMS" "$work/" && (cd "$work" && sha256sum -c SHA256SUMS)
}
# The bundle's patched tree into $work/tree, its wheels and extra modules into /tmp/site
unpack_tree() {
  rm -rf "$work/tree" && mkdir -p "$work/tree"
  xz -dc "$b/tree/tree.tar.xz" | tar -x -C "$work/tree"
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$b"/tree/whl/*.whl
  cp -r "$b"/tree/site-extra/* /tmp/site/
}
case "$phase" in
  kernels)
    unpack_so > "$out/so-unpack.log" 2>&1 &
    unpack=$!
    export SMLA_TREE=$PWD/$b/kern SMLA_GPU_RESULTS=$out/gpu-results.jsonl
    rc=0
    python3 -m pytest tests/gpu/test_kernel_gpu.py -m gpu -q -p no:cacheprovider -rA "$@" \
      > "$out/gpu-tests-kernels.log" 2>&1 || rc=$?
    tail -3 "$out/gpu-tests-kernels.log"
    timeout 150 python3 bench/bench_sparse_mla.py --prewarm 14 --out "$out/bench" \
      > "$out/bench.log" 2>&1 || echo "bench exit $?" | tee -a "$out/bench.log"
    tail -3 "$out/bench.log"
    wait "$unpack" || echo "unpacking the compiled ops failed" | tee -a "$out/so-unpack.log"
    cat "$out/so-unpack.log"
    exit $rc
    ;;
  backend)
    unpack_tree
    if [ -f "$work/SHA256SUMS" ] && (cd "$work" && sha256sum -c --quiet SHA256SUMS); then
      cp "$work/_C_stable_libtorch.abi3.so" "$work/tree/vllm/"
      echo "vLLM compiled ops: present (sha256 ok)" | tee -a "$out/gpu-env-$phase.txt"
    else
      echo "vLLM compiled ops: MISSING (phase 1 files gone): stand-in import" | tee -a "$out/gpu-env-$phase.txt"
    fi
    export PYTHONPATH=/tmp/site:$PWD/tools SMLA_TREE=$work/tree
    export VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-WARNING}
    python3 -m pytest tests/gpu/test_backend_gpu.py -m gpu -q -p no:cacheprovider -rA "$@" \
      2>&1 | tee "$out/gpu-tests-backend.log"
    ;;
  all)  # carry .gpu-port/so .gpu-port/tree : everything in one call
    unpack_tree
    xz -dc "$b/so/_C_stable_libtorch.abi3.so.xz" > "$work/tree/vllm/_C_stable_libtorch.abi3.so"
    (cd "$work/tree/vllm" && sha256sum -c "$OLDPWD/$b/so/SHA256SUMS") | tee -a "$out/gpu-env-$phase.txt"
    export SMLA_TREE=$work/tree SMLA_GPU_RESULTS=$out/gpu-results.jsonl
    rc=0
    python3 -m pytest tests/gpu/test_kernel_gpu.py -m gpu -q -p no:cacheprovider -rA "$@" \
      > "$out/gpu-tests-kernels.log" 2>&1 || rc=$?
    tail -2 "$out/gpu-tests-kernels.log"
    PYTHONPATH=/tmp/site:$PWD/tools VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-WARNING} \
      python3 -m pytest tests/gpu/test_backend_gpu.py -m gpu -q -p no:cacheprovider -rA "$@" \
      > "$out/gpu-tests-backend.log" 2>&1 || rc=$?
    grep -E "^(PASSED|FAILED|ERROR|SKIPPED)" "$out/gpu-tests-backend.log" | cut -c1-150; tail -2 "$out/gpu-tests-backend.log"
    timeout 150 python3 bench/bench_sparse_mla.py --prewarm 14 --out "$out/bench" \
      > "$out/bench.log" 2>&1 || echo "bench exit $?" | tee -a "$out/bench.log"
    tail -2 "$out/bench.log"
    exit $rc
    ;;
  installed)  # no carry: the wheel tests/e2e/device-run.sh installed (same warm machine)
    site=/tmp/smla-e2e/site
    [ -f "$site/.installed" ] || { echo "no installed wheel in $site: run tests/e2e/device-run.sh first" >&2; exit 20; }
    python3 -c "import importlib.metadata as m, sys; sys.path.insert(0, '$site'); print('installed vllm', m.version('vllm'))" \
      | tee -a "$out/gpu-env-$phase.txt"
    sha256sum "$site"/vllm/_C_stable_libtorch.abi3.so "$site"/vllm/v1/attention/ops/triton_*.py | tee -a "$out/gpu-env-$phase.txt"
    export SMLA_TREE=$site SMLA_VLLM_C_SO=$site/vllm/_C_stable_libtorch.abi3.so
    rc=0
    fp8_suite "$@"
    PYTHONPATH=$site:$PWD/tools VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-WARNING} \
      timeout 120 python3 -m pytest tests/gpu/test_backend_gpu.py -m gpu -q -p no:cacheprovider -rA "$@" \
      > "$out/gpu-tests-backend.log" 2>&1 || rc=$?
    tail -2 "$out/gpu-tests-backend.log"
    if [ -d "$b/v4series" ]; then  # carry .gpu-port/v4series: the series' V4 tests on this wheel
      (cd "$b/v4series" && PYTHONPATH=$site:$PWD VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-WARNING} \
        timeout 300 python3 -m pytest --noconftest -p no:cacheprovider -q -rA "$@" \
        tests/kernels/test_deepseek_v4_*.py tests/kernels/attention/test_deepseek_v4_triton_attention.py \
        tests/v1/cudagraph/test_breakable_cudagraph.py) > "$out/gpu-tests-v4-series.log" 2>&1 || rc=$?
      tail -2 "$out/gpu-tests-v4-series.log"
    fi
    fp8_bench
    exit $rc
    ;;
  fp8)  # carry .gpu-port/so .gpu-port/kern
    sha256sum "$b"/kern/vllm/v1/attention/ops/*.py | tee -a "$out/gpu-env-$phase.txt"
    unpack_so | tee -a "$out/gpu-env-$phase.txt"
    export SMLA_TREE=$PWD/$b/kern SMLA_VLLM_C_SO=$work/_C_stable_libtorch.abi3.so
    rc=0
    fp8_suite "$@"
    fp8_bench
    exit $rc
    ;;
  speed)  # carry .gpu-port/{so,fm,dg.tar.xz,kern[,before]}
    # GPU tests of both kernel files in the engine's call form, then the engine-form attention
    # benchmark vs FlashMLA and the indexer benchmark vs DeepGEMM (issues 18, 19).
    unpack_so | tee -a "$out/gpu-env-$phase.txt"
    xz -dc "$b/fm/_flashmla_C.abi3.so.xz" > "$work/_flashmla_C.abi3.so"
    mkdir -p "$work/dg" && tar -xJf "$b/dg.tar.xz" -C "$work/dg"
    sha256sum "$b"/kern/vllm/v1/attention/ops/*.py | tee -a "$out/gpu-env-$phase.txt"
    export SMLA_TREE=$PWD/$b/kern SMLA_VLLM_C_SO=$work/_C_stable_libtorch.abi3.so \
      SMLA_FLASHMLA_SO=$work/_flashmla_C.abi3.so SMLA_DEEPGEMM_DIR=$work/dg \
      CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
    [ -d "$b/before" ] && export SMLA_TREE_BEFORE=$PWD/$b/before
    [ -f "$b/fm/flash_mla_interface.py" ] && export SMLA_FLASHMLA_INTERFACE=$PWD/$b/fm/flash_mla_interface.py
    export SMLA_GPU_RESULTS=$out/gpu-results.jsonl SMLA_FP8_RESULTS=$out/fp8-gpu-results.jsonl \
      SMLA_INDEXER_RESULTS=$out/indexer-gpu-results.jsonl
    rc=0
    if [ "${SMLA_SKIP_TESTS:-0}" != 1 ]; then
      timeout 240 python3 -m pytest tests/gpu/test_kernel_gpu.py tests/gpu/test_fp8_kv_gpu.py \
        tests/gpu/test_indexer_gpu.py -m gpu -q -p no:cacheprovider -rA "$@" \
        > "$out/gpu-tests-speed.log" 2>&1 || rc=$?
      grep -E "^(FAILED|ERROR)" "$out/gpu-tests-speed.log" | cut -c1-200 || true; tail -1 "$out/gpu-tests-speed.log"
      # the series' own vLLM-style kernel tests (kern/ carries them)
      PYTHONPATH=$PWD/tests:$PWD/tests/gpu timeout 200 python3 -m pytest -p series_ops_stub \
        -p no:cacheprovider "$b"/kern/tests/kernels/attention/ -q -rA > "$out/series-tests.log" 2>&1 || rc=$?
      tail -1 "$out/series-tests.log"
    fi
    timeout 120 python3 bench/indexer/graph_sequence.py both > "$out/graph-sequence.log" 2>&1 \
      || echo "graph_sequence exit $?" | tee -a "$out/graph-sequence.log"
    tail -2 "$out/graph-sequence.log"
    timeout 200 python3 bench/bench_attention.py "$out" ${SMLA_BENCH_ARGS:-} > "$out/bench-attention.log" 2>&1 \
      || echo "bench_attention exit $?" | tee -a "$out/bench-attention.log"
    timeout 150 python3 bench/indexer/bench_indexer.py "$out" ${SMLA_BENCH_ARGS:-} > "$out/bench-indexer.log" 2>&1 \
      || echo "bench_indexer exit $?" | tee -a "$out/bench-indexer.log"
    if [ "${SMLA_BENCH_DSV4:-0}" = 1 ]; then
      timeout 200 python3 bench/bench_dsv4.py "$out" ${SMLA_BENCH_ARGS:-} > "$out/bench-dsv4.log" 2>&1 \
        || echo "bench_dsv4 exit $?" | tee -a "$out/bench-dsv4.log"
    fi
    python3 bench/summarize.py "$out" | tee "$out/summary.txt" || true
    # everything in one archive, the summaries beside it (<= 8 files come back)
    tar -C "$out" -cJf /tmp/smla-speed-logs.tar.xz . && mv /tmp/smla-speed-logs.tar.xz "$out/logs.tar.xz"
    find "$out" -mindepth 1 -not -name logs.tar.xz -not -name '*.json' -not -name summary.txt \
      -not -name gpu-tests-speed.log -not -name 'gpu-env-*' -delete
    exit $rc
    ;;
  attention)  # carry .gpu-port/{so,fm,dg.tar.xz,kern}: issue 34 in one call: the GPU tests of the
        # kernel files (sparse MLA, fp8 cache, indexer) while the attention benchmark's launches
        # compile in 12 processes, then the engine-form attention benchmark (every fp8 cell with
        # both fp8 kernels, hardware and software e4m3 paths) and the host time of one call
    unpack_so | tee -a "$out/gpu-env-$phase.txt"
    xz -dc "$b/fm/_flashmla_C.abi3.so.xz" > "$work/_flashmla_C.abi3.so"
    mkdir -p "$work/dg" && tar -xJf "$b/dg.tar.xz" -C "$work/dg"
    sha256sum "$b"/kern/vllm/v1/attention/ops/*.py | tee -a "$out/gpu-env-$phase.txt"
    export SMLA_TREE=$PWD/$b/kern SMLA_VLLM_C_SO=$work/_C_stable_libtorch.abi3.so \
      SMLA_FLASHMLA_SO=$work/_flashmla_C.abi3.so SMLA_DEEPGEMM_DIR=$work/dg \
      CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PYTHONUNBUFFERED=1
    export SMLA_GPU_RESULTS=$out/gpu-results.jsonl SMLA_FP8_RESULTS=$out/fp8-gpu-results.jsonl \
      SMLA_INDEXER_RESULTS=$out/indexer-gpu-results.jsonl
    rc=0
    timeout 200 python3 bench/bench_attention.py "$out" --prewarm 12 --prewarm-only \
      ${SMLA_BENCH_ARGS:-} > "$out/prewarm.log" 2>&1 &
    pw=$!
    if [ "${SMLA_SKIP_TESTS:-0}" != 1 ]; then
      timeout 260 python3 -m pytest tests/gpu/test_kernel_gpu.py tests/gpu/test_fp8_kv_gpu.py \
        tests/gpu/test_indexer_gpu.py -m gpu -q -p no:cacheprovider -rA "$@" \
        > "$out/gpu-tests-speed.log" 2>&1 || rc=$?
      grep -E "^(FAILED|ERROR)" "$out/gpu-tests-speed.log" | cut -c1-200 || true
      tail -1 "$out/gpu-tests-speed.log"
    fi
    wait $pw || echo "prewarm exit $?"
    tail -1 "$out/prewarm.log"
    timeout 240 python3 bench/bench_attention.py "$out" ${SMLA_BENCH_ARGS:-} \
      > "$out/bench-attention.log" 2>&1 \
      || echo "bench_attention exit $?" | tee -a "$out/bench-attention.log"
    timeout 90 python3 bench/bench_host.py "$out" > "$out/bench-host.log" 2>&1 \
      || echo "bench_host exit $?" | tee -a "$out/bench-host.log"
    if [ -n "${SMLA_NCU_CELLS:-}" ]; then  # "cache:path:heads:tokens ...": Nsight Compute
      mkdir -p "$out/ncu"
      for c in $SMLA_NCU_CELLS; do
        IFS=: read -r cache path h t <<< "$c"
        (cd bench && timeout 120 ncu --clock-control none --kernel-name regex:_sparse_mla_fwd \
          --launch-skip 1 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
          --section Occupancy --section LaunchStats --section WarpStateStats \
          python3 ncu_cell.py "$cache" "$path" "$h" "$t") > "$out/ncu/$cache-$path-$h-$t.txt" 2>&1 \
          || echo "ncu $c exit $?"
      done
    fi
    python3 bench/summarize.py "$out" | tee "$out/summary.txt" || true
    tar -C "$out" -cJf /tmp/smla-speed-logs.tar.xz . && mv /tmp/smla-speed-logs.tar.xz "$out/logs.tar.xz"
    find "$out" -mindepth 1 -not -name logs.tar.xz -not -name '*.json' -not -name summary.txt \
      -not -name gpu-tests-speed.log -not -name 'gpu-env-*' -delete
    exit $rc
    ;;
  fp8prefill)  # carry .gpu-port/fm .gpu-port/kern .gpu-port/tree: the fp8 prefill route (issue 34)
    export SMLA_TREE=$PWD/$b/kern PYTHONPATH=$PWD/tests:$PWD/tests/gpu
    rc=0
    python3 -m pytest -p series_ops_stub -p no:cacheprovider -q -rA "$@" \
      "$b"/kern/tests/kernels/attention/test_triton_sparse_mla.py > "$out/series-tests.log" 2>&1 || rc=$?
    tail -2 "$out/series-tests.log"
    unpack_tree
    (export PYTHONPATH=/tmp/site:$PWD/tools SMLA_TREE=$work/tree VLLM_LOGGING_LEVEL=WARNING
     python3 -m pytest tests/gpu/test_backend_gpu.py -m gpu -q -p no:cacheprovider -rA "$@" \
       > "$out/gpu-tests-backend.log" 2>&1) || rc=$?
    tail -2 "$out/gpu-tests-backend.log"
    xz -dc "$b/fm/_flashmla_C.abi3.so.xz" > "$work/_flashmla_C.abi3.so"
    SMLA_FLASHMLA_SO=$work/_flashmla_C.abi3.so timeout 300 python3 bench/bench_fp8_prefill.py \
      "$out/fp8-prefill" > "$out/bench-fp8-prefill.log" 2>&1 || echo "bench exit $?" >> "$out/bench-fp8-prefill.log"
    tail -3 "$out/bench-fp8-prefill.log"
    exit $rc
    ;;
  dsv4)  # carry .gpu-port/fm .gpu-port/kern: the series' V4 kernel test, then V4 decode, ours vs
        # FlashMLA (issue 21); SMLA_SKIP_TESTS=1: the benchmark alone
    xz -dc "$b/fm/_flashmla_C.abi3.so.xz" > "$work/_flashmla_C.abi3.so"
    sha256sum "$b"/kern/vllm/v1/attention/ops/triton_sparse_mla_dsv4.py \
      "$b"/kern/vllm/models/deepseek_v4/nvidia/*.py | tee -a "$out/gpu-env-$phase.txt"
    export SMLA_TREE=$PWD/$b/kern SMLA_FLASHMLA_SO=$work/_flashmla_C.abi3.so
    [ -f "$b/fm/flash_mla_interface.py" ] && export SMLA_FLASHMLA_INTERFACE=$PWD/$b/fm/flash_mla_interface.py
    [ -d "$b/before" ] && export SMLA_TREE_BEFORE=$PWD/$b/before
    rc=0
    if [ "${SMLA_SKIP_TESTS:-0}" != 1 ]; then  # the series' V4 kernel test first
      PYTHONPATH=$PWD/tests:$PWD/tests/gpu timeout 200 python3 -m pytest -p series_ops_stub \
        -p no:cacheprovider "$b"/kern/tests/kernels/attention/test_triton_sparse_mla_dsv4.py -q -rA \
        > "$out/series-dsv4-tests.log" 2>&1 || rc=$?
      tail -1 "$out/series-dsv4-tests.log"
    fi
    timeout 400 python3 bench/bench_dsv4.py "$out" "$@" > "$out/bench-dsv4.log" 2>&1 || rc=$?
    tail -4 "$out/bench-dsv4.log"
    python3 bench/summarize.py "$out" | tee "$out/summary.txt" || true
    exit $rc
    ;;
  nope)  # carry .gpu-port/nope, made on the CPU side (repo root, after `make patch`) by
    #   rm -rf .gpu-port/nope && mkdir -p .gpu-port/nope/vllm/v1/attention/ops \
    #     .gpu-port/nope/tests/kernels/attention && t=work/0.33.0/vllm \
    #   && cp $t/vllm/__init__.py .gpu-port/nope/vllm/ \
    #   && cp $t/vllm/v1/attention/ops/triton_{sparse_mla,launch,fp8_e4m3}.py .gpu-port/nope/vllm/v1/attention/ops/ \
    #   && cp $t/tests/kernels/attention/test_triton_sparse_mla.py .gpu-port/nope/tests/kernels/attention/
    sha256sum "$b"/nope/vllm/v1/attention/ops/*.py | tee -a "$out/gpu-env-$phase.txt"
    export SMLA_TREE=$PWD/$b/nope SMLA_GPU_RESULTS=$out/nope-gpu-results.jsonl
    rc=0
    timeout 150 python3 -m pytest tests/gpu/test_nope_gpu.py -m gpu -q -p no:cacheprovider -rA "$@" \
      > "$out/gpu-tests-nope.log" 2>&1 || rc=$?
    tail -3 "$out/gpu-tests-nope.log"
    PYTHONPATH=$PWD/tests:$PWD/tests/gpu timeout 100 python3 -m pytest -p series_ops_stub \
      -p no:cacheprovider "$b"/nope/tests/kernels/attention/test_triton_sparse_mla.py -k fwd_nope -q -rA \
      > "$out/series-tests-nope.log" 2>&1 || rc=$?
    tail -1 "$out/series-tests-nope.log"
    exit $rc
    ;;
  glm53)  # carry .gpu-port/glm53 (see the header): issue 36's GPU tests and speed, one call
    g=$b/glm53
    xz -dc "$g/fm/_flashmla_C.abi3.so.xz" > "$work/_flashmla_C.abi3.so"
    mkdir -p "$work/dg" && tar -xJf "$g/dg.tar.xz" -C "$work/dg"
    sha256sum "$g"/kern/vllm/v1/attention/ops/triton_{sparse_mla,dsa_indexer,fp8_e4m3,launch}.py \
      "$g"/kpool/vllm/models/glm5next/nvidia/ops/kpool_compress.py | tee -a "$out/gpu-env-$phase.txt"
    export SMLA_TREE=$PWD/$g/kern SMLA_FLASHMLA_SO=$work/_flashmla_C.abi3.so \
      SMLA_DEEPGEMM_DIR=$work/dg CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PYTHONUNBUFFERED=1
    budget=${SMLA_GLM53_BUDGET:-380}
    bench=${SMLA_GLM53_BENCH:-1}
    tests=" ${SMLA_GLM53_TESTS-nope kpool series} "
    [ "${SMLA_SKIP_TESTS:-0}" = 1 ] && tests=" "
    for t in $tests; do
      case "$t" in nope|kpool|series) ;; *) echo "SMLA_GLM53_TESTS: unknown group $t" >&2; exit 2 ;; esac
    done
    rc=0 pw= tn= tk= logs=()
    # the attention grid's launches compile in 8 processes while the tests run
    if [ "$bench" != 0 ]; then
      timeout 200 python3 bench/bench_glm53.py "$out" --prewarm 8 --prewarm-only > "$out/prewarm.log" 2>&1 &
      pw=$!
    fi
    if [[ $tests == *" nope "* ]]; then
      SMLA_GPU_RESULTS=$out/nope-gpu-results.jsonl timeout 150 python3 -m pytest \
        tests/gpu/test_nope_gpu.py -m gpu -q -p no:cacheprovider -rA "$@" > "$out/gpu-tests-nope.log" 2>&1 &
      tn=$! logs+=(gpu-tests-nope)
    fi
    if [[ $tests == *" kpool "* ]]; then
      SMLA_TREE=$PWD/$g/kpool SMLA_KPOOL_RESULTS=$out/kpool-gpu.jsonl timeout 150 python3 -m pytest \
        tests/gpu/test_kpool_indexer_gpu.py -m gpu -q -p no:cacheprovider -rA "$@" \
        > "$out/gpu-tests-kpool.log" 2>&1 &
      tk=$! logs+=(gpu-tests-kpool)
    fi
    if [ -n "$tn" ]; then wait $tn || rc=$?; fi
    if [ -n "$tk" ]; then wait $tk || rc=$?; fi
    if [[ $tests == *" series "* ]]; then
      PYTHONPATH=$PWD/tests:$PWD/tests/gpu timeout 90 python3 -m pytest -p series_ops_stub \
        -p no:cacheprovider "$g"/kern/tests/kernels/attention/test_triton_sparse_mla.py -k fwd_nope -q -rA \
        > "$out/series-tests-nope.log" 2>&1 || rc=$?
      logs+=(series-tests-nope)
    fi
    for f in "${logs[@]}"; do
      grep -E "^(FAILED|ERROR)" "$out/$f.log" | cut -c1-200 || true
      echo "$f: $(tail -1 "$out/$f.log")"
    done
    if [ "$bench" != 0 ]; then
      wait $pw || echo "prewarm exit $?"
      tail -1 "$out/prewarm.log"
      left=$(( budget - SECONDS )); [ $left -lt 60 ] && left=60
      echo "bench_glm53: ${left} s left"
      timeout $left python3 bench/bench_glm53.py "$out" > "$out/bench-glm53.log" 2>&1 \
        || echo "bench_glm53 exit $?" | tee -a "$out/bench-glm53.log"
    fi
    python3 bench/summarize.py "$out" | tee "$out/summary.txt" || true
    tar -C "$out" -cJf /tmp/smla-glm53-logs.tar.xz . && mv /tmp/smla-glm53-logs.tar.xz "$out/logs.tar.xz"
    find "$out" -mindepth 1 -not -name logs.tar.xz -not -name '*.json' -not -name summary.txt \
      -not -name '*.jsonl' -not -name 'gpu-env-*' -delete
    echo "phase glm53: ${SECONDS} s"
    exit $rc
    ;;
  bench)  # carry .gpu-port/kern: the benchmark alone (also part of `kernels`)
    timeout 150 python3 bench/bench_sparse_mla.py --prewarm 14 --out "$out/bench" \
      > "$out/bench.log" 2>&1 || echo "bench exit $?" | tee -a "$out/bench.log"
    tail -3 "$out/bench.log"
    ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac

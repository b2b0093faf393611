#!/usr/bin/env bash
# The serving benchmark on the lent GPU machine (repo root = working directory); the
# same bundle, store and install as tests/e2e/device-run.sh (tests/e2e/README.md).
#   bash bench/serving/device-run.sh stage          keep the piece(s) this call carried
#   bash bench/serving/device-run.sh run [ARGS...]  stage the last piece, check all, install,
#                                                   then bench/serving/bench_serving.py ARGS
# BENCH_BUDGET_S (default 560): the runner starts no engine it cannot finish within that
# many seconds of this script's start; a call limit of 600 s leaves 40 s to pack $OUT.
# BENCH_TAG (default none): the manifest of another plan apart, e.g. BENCH_TAG=deep with
# --deep: /tmp/smla-bench-deep on the machine, .e2e/serving-state-deep carried (plan.plan_tag).
# Exit: 0 all done, 10 more to do (make the same call again), 3 an engine failed or used
# the wrong kernels, 2 usage / manifest of another plan, 20-22 bundle pieces (device_pieces.py).
set -euo pipefail
t0=$(date +%s)
mode=${1:?usage: device-run.sh stage|run [bench_serving.py args]}
shift
out=${OUT:-/tmp/smla-bench-out}
# the same bundle, store, install and environment as tests/e2e/device-run.sh
source tests/e2e/device-setup.sh "$mode"
{
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, triton, vllm, importlib.metadata as m; print("torch", torch.__version__, "triton", triton.__version__, "vllm", vllm.__version__, m.version("vllm"), vllm.__file__)'
  nproc
} 2>&1 | tee "$out/env.txt"
gpus=$(nvidia-smi -L | wc -l)
[ "$gpus" -ge 1 ] || { echo "no GPU" >&2; exit 2; }
budget=${BENCH_BUDGET_S:-560}
# No pipe (| tee): processes an engine leaves behind would hold it open.
set +e
tag=${BENCH_TAG:+-$BENCH_TAG}
python3 bench/serving/bench_serving.py --out "$out" --state-dir "/tmp/smla-bench$tag" \
  --carried-state ".e2e/serving-state$tag" --deadline $((t0 + budget)) "$@" > "$out/run.log" 2>&1
rc=$?
set -e
cat "$out/run.log"
# Engine logs and the profiler's tables, one archive (traces stay on the machine: size).
tar -C "/tmp/smla-bench$tag" -cJf "$out/engine-logs.tar.xz" --exclude='*.pt.trace.json*' --exclude=state.json engines \
  2>/dev/null || true
echo "call wall $(( $(date +%s) - t0 )) s, exit $rc"
exit "$rc"

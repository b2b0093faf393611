#!/usr/bin/env bash
# The GPU steps on your own CUDA machine (with network): the series' wheel installed in a venv of
# its own, then the GPU tests, the engine comparison or the serving benchmark. Through make:
#   make test-gpu   [WHEEL=path] [PYTEST_ARGS=...]      pytest -m gpu tests/gpu, on the installed wheel
#   make test-e2e   [WHEEL=path] [E2E_ARGS=...]         tests/e2e/run_e2e.py (ours vs upstream, vllm.LLM)
#   make bench-e2e  [WHEEL=path] [BENCH_E2E_ARGS=...]   bench/serving/bench_serving.py
# usage: tools/gpu-local.sh test-gpu|test-e2e|bench-e2e [ARGS...]   (ARGS: the runner's own)
#
# The wheel: $WHEEL, else the newest dist/vllm-*+sparsemla.*.whl, else `make build-wheel` makes it.
# The venv: $GPU_VENV (default .venv-gpu), made from $GPU_PY (default python3); pip installs the
# wheel with vLLM's own requirements (torch & co. from the package index) and pytest, as a user
# installs it. Another wheel later (its sha256 differs from $GPU_VENV/.smla-wheel): that wheel
# alone is installed again. Results: $GPU_OUT (default .gpu-out/<step>/); the benchmark keeps its
# manifest there, so a second `make bench-e2e` resumes it.
# The lent H200 (no network, 64 MiB per call) takes the piece route instead: tests/gpu/device-run.sh,
# `make test-e2e-pieces`, `make bench-e2e-pieces` (tests/e2e/README.md, bench/serving/README.md).
set -euo pipefail
what=${1:-}
case "$what" in
  test-gpu|test-e2e|bench-e2e) shift ;;
  *) echo "usage: tools/gpu-local.sh test-gpu|test-e2e|bench-e2e [ARGS...]" >&2; exit 2 ;;
esac
venv=${GPU_VENV:-.venv-gpu}
py=${GPU_PY:-python3}
out=${GPU_OUT:-.gpu-out/$what}
die() {
  echo "error: $1" >&2
  if [ -n "${2:-}" ]; then echo "hint: $2" >&2; fi
  exit 2
}

command -v nvidia-smi >/dev/null 2>&1 \
  || die "no nvidia-smi here: $what needs an NVIDIA GPU and its driver" \
         "run it on your CUDA machine; the CPU suite is make test"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "$gpus" -ge 1 ] || die "nvidia-smi lists no GPU" "check the driver: nvidia-smi -L"

newest_wheel() { ls -t dist/vllm-*+sparsemla.*.whl 2>/dev/null | head -n 1 || true; }
wheel=${WHEEL:-}
if [ -z "$wheel" ]; then
  wheel=$(newest_wheel)
  if [ -z "$wheel" ]; then
    echo "no wheel in dist/: make build-wheel"
    "${MAKE:-make}" build-wheel
    wheel=$(newest_wheel)
    [ -n "$wheel" ] || die "make build-wheel left no dist/vllm-*+sparsemla.*.whl" "see docs/build-wheel.md"
  fi
fi
[ -f "$wheel" ] || die "WHEEL=$wheel: no such file" "make build-wheel, or WHEEL=/path/to/vllm-*+sparsemla.*.whl"
case "$(basename "$wheel")" in
  vllm-*.whl) ;;
  *) die "WHEEL=$wheel is not a vLLM wheel (vllm-*.whl)" "make build-wheel makes one in dist/" ;;
esac
sha=$(sha256sum "$wheel" | cut -d' ' -f1)

vpy=$venv/bin/python
if [ ! -x "$vpy" ]; then
  echo "creating $venv from $py"
  "$py" -m venv "$venv"
fi
stamp=$venv/.smla-wheel
if [ ! -f "$stamp" ]; then
  echo "installing $wheel into $venv (with vLLM's requirements, from the package index)"
  "$vpy" -m pip install -q --upgrade pip
  "$vpy" -m pip install "$wheel" pytest
  echo "$sha $wheel" > "$stamp"
elif [ "$(cut -d' ' -f1 "$stamp")" != "$sha" ]; then
  echo "installing $wheel into $venv (it held $(cut -d' ' -f2- "$stamp"))"
  "$vpy" -m pip install --force-reinstall --no-deps "$wheel"
  echo "$sha $wheel" > "$stamp"
fi
site=$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

mkdir -p "$out"
unset TRITON_INTERPRET
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PYTHONUNBUFFERED=1
echo "$what on $gpus GPU(s), $(basename "$wheel") in $venv; results in $out"
case "$what" in
  test-gpu)
    # The kernels and vLLM's compiled ops as installed (the series' files are in the wheel).
    SMLA_TREE=$site SMLA_VLLM_C_SO=$site/vllm/_C_stable_libtorch.abi3.so \
      SMLA_GPU_RESULTS=$out/gpu-results.jsonl SMLA_FP8_RESULTS=$out/fp8-gpu-results.jsonl \
      exec "$vpy" -m pytest -m gpu tests/gpu "$@"
    ;;
  test-e2e|bench-e2e)
    # The harness plugin (e2e_dummy load format, model probe) as a vllm.general_plugins entry point,
    # as tests/e2e/device-setup.sh installs it; its module comes from tests/e2e on PYTHONPATH.
    plugin=$site/smla_e2e_plugin-0.dist-info
    if [ ! -f "$plugin/entry_points.txt" ]; then
      mkdir -p "$plugin"
      printf 'Metadata-Version: 2.1\nName: smla-e2e-plugin\nVersion: 0\n' > "$plugin/METADATA"
      printf '[vllm.general_plugins]\ne2e_dummy = e2e_plugin:register\n' > "$plugin/entry_points.txt"
    fi
    export PYTHONPATH=$PWD/tests/e2e${PYTHONPATH:+:$PYTHONPATH}
    export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ALLOW_INSECURE_SERIALIZATION=1
    if [ "$what" = test-e2e ]; then
      exec "$vpy" tests/e2e/run_e2e.py --out "$out" --results "$out/engines" \
        --v4-checkpoints "$out/models" --gpus "$gpus" "$@"
    fi
    # No per-call limit here: one call runs the whole plan (a rerun resumes from the manifest).
    exec "$vpy" bench/serving/bench_serving.py --out "$out" --state-dir "$out/state" \
      --carried-state "$out/state" --budget-s 864000 "$@"
    ;;
esac

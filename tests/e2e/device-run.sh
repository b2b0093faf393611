#!/usr/bin/env bash
# The e2e runner on the lent GPU machine (repo root = working directory).
#   bash tests/e2e/device-run.sh stage            keep the piece(s) this call carried (calls 1..N-1)
#   bash tests/e2e/device-run.sh run [ARGS...]    stage the last piece, check all, install, run
#                                                 tests/e2e/run_e2e.py ARGS (results in $OUT)
# Each call carries .e2e/manifest.json and one .e2e/pieces/NN (see tests/e2e/README.md);
# pieces live in /tmp/smla-e2e only while the machine stays warm (30 s after a call).
set -euo pipefail
mode=${1:?usage: device-run.sh stage|run [run_e2e.py args]}
shift
out=${OUT:-/tmp/smla-e2e-out}
store=/tmp/smla-e2e
mkdir -p "$out"
if [ "$mode" = stage ]; then
  exec python3 tests/e2e/device_pieces.py stage --store "$store"
fi
[ "$mode" = run ] || { echo "unknown mode $mode" >&2; exit 2; }
python3 tests/e2e/device_pieces.py assemble --store "$store"
site=$store/site
payload=$store/payload
if [ ! -f "$site/.installed" ] || [ "$(cat "$site/.installed")" != "$(cat "$payload/.verified")" ]; then
  rm -rf "$site"
  # What users install: pip, with the dist-info (vLLM's platform detection reads it).
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
    "$payload"/deps/*.whl "$payload"/vllm-*.whl
  # The harness plugin (e2e_dummy load format, model probe) as a vllm.general_plugins entry point.
  mkdir -p "$site/smla_e2e_plugin-0.dist-info"
  printf 'Metadata-Version: 2.1\nName: smla-e2e-plugin\nVersion: 0\n' > "$site/smla_e2e_plugin-0.dist-info/METADATA"
  printf '[vllm.general_plugins]\ne2e_dummy = e2e_plugin:register\n' > "$site/smla_e2e_plugin-0.dist-info/entry_points.txt"
  cp "$payload/.verified" "$site/.installed"
fi
export PYTHONPATH=$site:$PWD/tests/e2e
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ALLOW_INSECURE_SERIALIZATION=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PATH=$CUDA_HOME/bin:$PATH
{
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, triton, vllm, importlib.metadata as m; print("torch", torch.__version__, "triton", triton.__version__, "vllm", vllm.__version__, m.version("vllm"), vllm.__file__)'
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
exit "$rc"

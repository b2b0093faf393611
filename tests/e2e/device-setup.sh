# Sourced by tests/e2e/device-run.sh and bench/serving/device-run.sh on the lent GPU machine
# (repo root = working directory): stage or assemble the carried bundle pieces, install the
# series' wheel as users install it, and export the engine environment.
# In: $1 mode (stage|run), $out. Out: $store, $site, $payload; exits for `stage`.
store=/tmp/smla-e2e
mkdir -p "$out"
if [ "$1" = stage ]; then
  exec python3 tests/e2e/device_pieces.py stage --store "$store"
fi
[ "$1" = run ] || { echo "unknown mode $1" >&2; exit 2; }
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

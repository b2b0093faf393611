# Sourced by tests/e2e/device-run.sh and bench/serving/device-run.sh on the lent GPU machine
# (repo root = working directory): stage or assemble the carried bundle pieces, install the
# series' wheel as users install it, and export the engine environment.
# In: $1 mode (stage|stage-extra|run), $out. Out: $store, $site, $payload; exits for `stage`
# and `stage-extra`.
# The optional second bundle (.e2e-extra/, bundle.py --extra: TileLang and CuTe DSL for pristine
# DeepSeek-V4 kernels, tests/e2e/README.md "DeepSeek-V4") is staged by `stage-extra` calls into
# $extra_store and, once complete there, installed by `run` next to the main one.
store=/tmp/smla-e2e
extra_store=/tmp/smla-e2e-extra
mkdir -p "$out"
if [ "$1" = stage ]; then
  exec python3 tests/e2e/device_pieces.py stage --store "$store"
fi
if [ "$1" = stage-extra ]; then
  exec python3 tests/e2e/device_pieces.py stage --bundle .e2e-extra --store "$extra_store"
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
extra_path=
if [ -f "$extra_store/manifest.json" ] || [ -f .e2e-extra/manifest.json ]; then
  python3 tests/e2e/device_pieces.py assemble --bundle .e2e-extra --store "$extra_store" --use-stored-manifest
  site_extra=$extra_store/site
  payload_extra=$extra_store/payload
  if [ ! -f "$site_extra/.installed" ] || [ "$(cat "$site_extra/.installed")" != "$(cat "$payload_extra/.verified")" ]; then
    rm -rf "$site_extra"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site_extra" \
      "$payload_extra"/deps/*.whl
    cp "$payload_extra/.verified" "$site_extra/.installed"
  fi
  # nvidia-cutlass-dsl puts its `cutlass` package on sys.path with a .pth file, which Python reads
  # in site directories only, not on PYTHONPATH: name that folder here.
  extra_path=:$site_extra:$site_extra/nvidia_cutlass_dsl/dsl_packages
fi
export PYTHONPATH=$site$extra_path:$PWD/tests/e2e
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ALLOW_INSECURE_SERIALIZATION=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PATH=$CUDA_HOME/bin:$PATH

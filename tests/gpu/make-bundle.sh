#!/usr/bin/env bash
# Build .bundle/ for tests/gpu/device-run.sh: the wheels of bundle-requirements.txt
# for CPython 3.12 on x86-64 Linux, plus a minimal vllm dist-info (vLLM picks its
# platform from the installed distribution's metadata; a source tree has none).
# usage (repo root, with network): bash tests/gpu/make-bundle.sh [OUTDIR=.bundle]
set -euo pipefail
out=${1:-.bundle}
mkdir -p "$out/whl" "$out/site-extra/vllm-0.16.0.dist-info"
platforms=()
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_26_x86_64 manylinux_2_28_x86_64 \
         manylinux1_x86_64 manylinux_2_5_x86_64 any; do
  platforms+=(--platform "$p")
done
grep -Ev '^\s*(#|$)' tests/gpu/bundle-requirements.txt | while read -r req; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d "$out/whl" "$req"
done
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.16.0\n' > "$out/site-extra/vllm-0.16.0.dist-info/METADATA"
printf 'vllm\n' > "$out/site-extra/vllm-0.16.0.dist-info/top_level.txt"
du -sh "$out"

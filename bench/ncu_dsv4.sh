#!/usr/bin/env bash
# Nsight Compute readings of DeepSeek-V4 decode cells (bench/ncu_dsv4_cell.py): our fp8 decode
# (and its merge) and FlashMLA's flash_mla_with_kvcache on the same inputs, one raw-page CSV per
# cell (a row per kernel), then bench/ncu_summary.py OUT. Clocks left alone.
#   SMLA_TREE=<kernel tree> SMLA_FLASHMLA_SO=... SMLA_FLASHMLA_INTERFACE=... \
#     bash bench/ncu_dsv4.sh OUT [LAYER:BATCH:CONTEXT ...]
# Default cells: the batch-16 and batch-64 cells the <= 1.5x FlashMLA target misses most.
set -u
out=$1; shift
mkdir -p "$out"
cells=${*:-c4:16:8192 c4:64:8192 c128:64:65536}
for cell in $cells; do
  IFS=: read -r layer batch ctx <<< "$cell"
  name="dsv4-$layer-b$batch-$((ctx / 1024))k"
  (cd "$(dirname "$0")" && timeout 240 ncu --clock-control none --nvtx \
    --nvtx-include "ours/" --nvtx-include "flashmla/" --csv --page raw \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
    --section InstructionStats --section MemoryWorkloadAnalysis_Tables \
    python3 ncu_dsv4_cell.py "$layer" "$batch" "$ctx") > "$out/$name.csv" 2> "$out/$name.err" \
    || echo "ncu $name exit $?" >> "$out/$name.err"
  echo "$name: $(grep -c , "$out/$name.csv") rows"
done
python3 "$(dirname "$0")/ncu_summary.py" "$out" > "$out/summary.txt" 2>&1; cat "$out/summary.txt"

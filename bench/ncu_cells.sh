#!/usr/bin/env bash
# Nsight Compute readings of the engine-form attention call (bench/ncu_cell.py) for the cells the
# issue-34 targets miss; one raw-page CSV per cell (every metric the sections collect), then
# bench/ncu_summary.py OUT writes OUT/ncu.json and a table of the limiting figures.
#   SMLA_TREE=<kernel tree> bash bench/ncu_cells.sh OUT [CACHE:PATH:H:T ...]
# Default cells: the fp8 codes kernel at 16 heads, the 16-bit kernel at 16/32/64 heads (4096 tokens)
# and the dequantising fp8 path at 64 heads. Clocks left alone (--clock-control none).
set -u
out=$1; shift
mkdir -p "$out"
cells=${*:-fp8_ds_mla:hw:16:4096 bfloat16:-:16:4096 bfloat16:-:32:4096 bfloat16:-:64:4096 fp8_ds_mla:hw:64:4096}
for cell in $cells; do
  IFS=: read -r cache path h t <<< "$cell"
  name="$cache-$path-h$h-t$t"
  (cd "$(dirname "$0")" && timeout 240 ncu --clock-control none --kernel-name regex:_sparse_mla_fwd \
    --launch-skip 1 --launch-count 1 --csv --page raw \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
    --section InstructionStats --section MemoryWorkloadAnalysis_Tables \
    python3 ncu_cell.py "$cache" "$path" "$h" "$t") > "$out/$name.csv" 2> "$out/$name.err" \
    || echo "ncu $name exit $?" >> "$out/$name.err"
  echo "$name: $(grep -c , "$out/$name.csv") rows"
done

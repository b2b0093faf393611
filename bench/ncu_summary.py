#!/usr/bin/env python3
"""Summary of bench/ncu_cells.sh's raw-page CSVs: OUT/ncu.json (every metric per cell) and a
table of the figures that say what limits a kernel (time, DRAM / L1 / shared-memory pipe
throughput, tensor and ALU pipes, registers, occupancy, the largest warp stall reasons).

  python bench/ncu_summary.py OUT
"""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

SHOWN = {
    "gpu__time_duration.sum": "time",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": "DRAM %",
    "l1tex__throughput.avg.pct_of_peak_sustained_active": "L1 %",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed": "shared pipe %",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed": "L2 %",
    "lts__t_sector_hit_rate.pct": "L2 hit %",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "SM %",
    "sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active": "hmma %",
    "sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active": "gmma %",
    "sass__inst_executed_shared_loads": "shared loads",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum": "bank conflicts",
    "sass__inst_executed_register_spilling": "spill insts",
    "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active": "ALU %",
    "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active": "FMA %",
    "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active": "LSU %",
    "launch__registers_per_thread": "regs",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy %",
    "launch__occupancy_limit_registers": "blocks/SM (regs)",
    "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue %",
}
STALL = "smsp__average_warps_issue_stalled_"


def read(path: Path) -> list[dict]:
    """The kernels of one raw-page CSV, in launch order: {metric: (value, unit)} each."""
    rows = [r for r in csv.reader(line for line in path.read_text().splitlines() if line.startswith('"'))]
    if len(rows) < 3:
        return []
    names, units = rows[0], rows[1]
    kernels = []
    for values in rows[2:]:
        out = {}
        for n, u, v in zip(names, units, values):
            try:
                out[n] = (float(v.replace(",", "")), u)
            except ValueError:
                out[n] = (v, u)
        kernels.append(out)
    return kernels


def cells_of(path: Path) -> dict:
    """{cell: metrics}: the file's name for a one-kernel CSV (bench/ncu_cells.sh), else one
    entry per kernel, "<file> #<i> <kernel name>" (bench/ncu_dsv4.sh: ours and FlashMLA's)."""
    kernels = read(path)
    if len(kernels) <= 1:
        return {path.stem: kernels[0] if kernels else {}}
    return {f"{path.stem} #{i} {str(m.get('Kernel Name', ('?',))[0])[:60]}": m
            for i, m in enumerate(kernels)}


def main() -> None:
    out = Path(sys.argv[1])
    cells = {name: m for p in sorted(out.glob("*.csv")) for name, m in cells_of(p).items()}
    (out / "ncu.json").write_text(json.dumps(cells, indent=1, sort_keys=True))
    for name, m in cells.items():
        print(f"## {name}")
        if not m:
            print("  (no reading)")
            continue
        for key, label in SHOWN.items():
            if key in m:
                v, u = m[key]
                print(f"  {label:18s} {v} {u}")
        stalls = sorted(((v, k[len(STALL):].split("_per_issue_active")[0]) for k, (v, _) in m.items()
                         if k.startswith(STALL) and k.endswith("_per_issue_active.ratio")
                         and isinstance(v, float)), reverse=True)[:6]
        print("  stalls / issue    " + ", ".join(f"{k} {v:.2f}" for v, k in stalls))


if __name__ == "__main__":
    main()

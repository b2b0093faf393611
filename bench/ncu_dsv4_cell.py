#!/usr/bin/env python3
"""One DeepSeek-V4 decode cell of bench_dsv4.py, ours and FlashMLA's call, for Nsight Compute.

  ncu --clock-control none --nvtx --nvtx-include "ours/" --nvtx-include "flashmla/" \
      --section SpeedOfLight ... python bench/ncu_dsv4_cell.py LAYER BATCH CONTEXT

LAYER: swa | c4 | c128. Each call (the engine's form, bench_dsv4.py's inputs) runs three times
eagerly; the third inside an NVTX range named after it, which --nvtx-include "NAME/" selects:
ours (the fp8 decode kernel and, when it splits, the merge) and FlashMLA's
flash_mla_with_kvcache (its kernels). bench/ncu_dsv4.sh runs it for the cells the targets miss.
env: SMLA_TREE, SMLA_FLASHMLA_SO, SMLA_FLASHMLA_INTERFACE.
"""
from __future__ import annotations

import json
import sys

import torch

from bench_dsv4 import (HEADS, KERNEL, POOL_ENTRIES, TOPK_C4, WINDOW, FlashMLA, Ours,
                        engine_forms, flashmla_interface, make_caches, series_test_module,
                        step_inputs)
from timing import kernel_modules


def main() -> None:
    layer, B, ctx = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    mod, _ = kernel_modules(KERNEL, "smla_dsv4")
    ours_form, fm_form = engine_forms()
    gen = torch.Generator().manual_seed(0)
    caches = make_caches(series_test_module("cuda"), POOL_ENTRIES, "cuda", gen)
    workspace = torch.empty(1 << 26, dtype=torch.float32, device="cuda")
    x = step_inputs(layer, B, HEADS, ctx, WINDOW, TOPK_C4, caches, torch.bfloat16, "cuda", gen)
    extra = 0 if x["topk_idx"] is None else x["topk_idx"].shape[-1]
    print(json.dumps(dict(layer=layer, batch=B, context=ctx, plan=mod._plan(
        x["q"].device, B, HEADS, x["swa_idx"].shape[-1], extra, fp8=True))))
    fm_fn, fm_meta = flashmla_interface()
    for name, call in (("ours", Ours(mod, ours_form, x, workspace)),
                       ("flashmla", FlashMLA(fm_fn, fm_meta, fm_form, x))):
        for _ in range(2):
            call()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push(name)
        call()
        torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()

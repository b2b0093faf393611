#!/usr/bin/env python3
"""One engine-form attention call of bench_attention.py, for Nsight Compute.

  ncu --clock-control none --kernel-name regex:_sparse_mla_fwd --launch-skip 1 \
      --launch-count 1 --section SpeedOfLight ... python bench/ncu_cell.py CACHE PATH H T

CACHE: bfloat16 | fp8_ds_mla; PATH: hw | software | - (bf16); the call is made
twice (the first compiles; profile the second with --launch-skip 1).
env: SMLA_TREE.
"""
from __future__ import annotations

import sys

import torch

from bench_attention import BS, NUM_BLOCKS, R, P, TOPK, Ours, engine_query, fp8_cache
from timing import kernel_modules


def main() -> None:
    cache, path, H, T = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    mod, _ = kernel_modules("vllm/v1/attention/ops/triton_sparse_mla.py", "smla_attn")
    gen = torch.Generator(device="cuda").manual_seed(0)
    kv = (fp8_cache(gen) if cache == "fp8_ds_mla" else
          torch.randn((NUM_BLOCKS, BS, R + P), generator=gen, device="cuda").to(torch.bfloat16))
    ql, qpe = engine_query(T, H, gen)
    slots = torch.randint(0, NUM_BLOCKS * BS, (T, TOPK), generator=gen, device="cuda",
                          dtype=torch.int32)
    ours = Ours(mod, kv, T, H, cache, None if path == "-" else path)
    for _ in range(2):
        ours(ql, qpe, slots)
    torch.cuda.synchronize()
    print(mod.sparse_mla_config(H, T, TOPK, torch.bfloat16, torch.device("cuda"),
                                "fp8_ds_mla" if cache == "fp8_ds_mla" else "auto",
                                fp8_hw=None if path == "-" else path == "hw"))


if __name__ == "__main__":
    main()

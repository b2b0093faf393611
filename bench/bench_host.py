#!/usr/bin/env python3
"""Host time of one eager call: ours (attention, indexer) beside baselines, same run.

vLLM runs the attention of mixed prefill/decode steps eagerly, once per
layer, so the host time of one call adds up over 61-78 layers.  Each row is
one call made as the engine makes it, 1 token / batch 1, its GPU work tiny:
  attention        sparse_mla_fwd, engine form (bench_attention.py's call:
                   block cache, (ql_nope, q_pe) views, out and scratch given),
                   bf16 and fp8_ds_mla caches, 8 and 64 heads, top-k 2048
  attention+slots  convert_req_local_to_slots + sparse_mla_fwd: the two
                   launches of TRITON_MLA_SPARSE's forward_mqa (bf16, 8 heads)
  indexer          paged_mqa_logits, 1 request x 64k context, 64 heads,
                   vLLM's call (2-D lengths, clean_logits=False), both paths
Baselines: an empty Triton kernel with 1 and with 24 arguments (6 pointers,
18 integers: Triton's own launch path), FlashMLA's sparse_decode_fwd (fp8
cache, 1 token, the attention call FLASHMLA_SPARSE makes), DeepGEMM's
fp8_fp4_paged_mqa_logits (the indexer call upstream makes), torch.add.
host_us: wall time of CALLS calls queued back to back / CALLS (short enough
that the launch queue never fills: host-bound, not GPU-bound), the median of
REPEATS such runs.  Also a cProfile of the attention call
(host-profile-attention.txt).  Output: OUT_DIR/host.json
{"rows": [{"call", "host_us", ...}]}.

  python bench/bench_host.py OUT_DIR
env: SMLA_TREE, SMLA_FLASHMLA_SO, SMLA_DEEPGEMM_DIR, SMLA_VLLM_C_SO
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "indexer"))

from bench_attention import (  # noqa: E402
    BS, NUM_BLOCKS, TOPK, FlashMLA, Ours, R, P, engine_query, fp8_cache)
from timing import kernel_modules, parse_args  # noqa: E402

CALLS = 200
REPEATS = 7


@triton.jit
def _empty1(x_ptr):
    pass


@triton.jit
def _empty24(p0, p1, p2, p3, p4, p5, i0, i1, i2, i3, i4, i5, i6, i7, i8, i9, i10, i11,
             i12, i13, i14, i15, i16, i17):
    pass


def host_us(fn) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        runs.append((time.perf_counter() - t0) / CALLS * 1e6)
        torch.cuda.synchronize()
    return statistics.median(runs)


def main() -> None:
    args = parse_args(__doc__)
    out_dir = args.out_dir
    smla, _ = kernel_modules("vllm/v1/attention/ops/triton_sparse_mla.py", "smla_attn")
    idx, _ = kernel_modules("vllm/v1/attention/ops/triton_dsa_indexer.py", "smla_idx")
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []

    def emit(**r):
        rows.append(r)
        print(json.dumps(r), flush=True)

    caches = {"bfloat16": torch.randn((NUM_BLOCKS, BS, R + P), generator=gen, device="cuda"
                                      ).to(torch.bfloat16),
              "fp8_ds_mla": fp8_cache(gen)}
    slots = torch.randint(0, NUM_BLOCKS * BS, (1, TOPK), generator=gen, device="cuda",
                          dtype=torch.int32)
    for cache, kv in caches.items():
        for H in (8, 64):
            ql, qpe = engine_query(1, H, gen)
            ours = Ours(smla, kv, 1, H, cache)
            emit(call="attention", cache=cache, heads=H, tokens=1,
                 host_us=host_us(lambda: ours(ql, qpe, slots)))
            if cache == "bfloat16" and H == 8:
                import cProfile
                import io
                import pstats

                prof = cProfile.Profile()
                prof.runcall(lambda: [ours(ql, qpe, slots) for _ in range(500)])
                buf = io.StringIO()
                pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(20)
                (out_dir / "host-profile-attention.txt").write_text(buf.getvalue())
                # forward_mqa's two launches: positions -> slots, then attention
                req = torch.zeros(1, dtype=torch.int32, device="cuda")
                bt = torch.arange(NUM_BLOCKS, dtype=torch.int32, device="cuda").view(1, -1)
                local = torch.randint(0, NUM_BLOCKS * BS, (1, TOPK), generator=gen,
                                      device="cuda", dtype=torch.int32)
                slot_buf = torch.empty_like(local)

                def both():
                    smla.convert_req_local_to_slots(req, bt, local, BS, out=slot_buf)
                    ours(ql, qpe, slot_buf)

                emit(call="attention+slots", cache=cache, heads=H, tokens=1,
                     host_us=host_us(both))
            if os.environ.get("SMLA_FLASHMLA_SO") and cache == "fp8_ds_mla" and H == 64:
                torch.ops.load_library(os.environ["SMLA_FLASHMLA_SO"])
                fm = FlashMLA(kv, 1, H, cache, ql, qpe, slots)
                emit(call="flashmla-decode", cache=cache, heads=H, tokens=1,
                     host_us=host_us(fm))
    del caches

    from indexer_reference import build_paged_case
    from test_indexer_gpu import BS as IBS, D, H as IH, load_deepgemm, load_vllm_ops

    ops = load_vllm_ops()
    case = build_paged_case("cuda", [65536], 1, IH, D, IBS, 7, ops, max_model_len=65536)
    a = (case["q_fp8"], case["kv"], case["w"], case["lens2d"], case["bt"], 65536)
    for path, mma in (("fp8-mma", True), ("software", False)):
        emit(call="indexer", path=path, batch=1, context=65536, heads=IH,
             host_us=host_us(lambda: idx.paged_mqa_logits(*a, clean_logits=False,
                                                          fp8_mma=mma)))
    dg = load_deepgemm()
    if dg is not None:
        sched = dg.schedule(case["lens2d"], IBS)
        emit(call="deepgemm-paged-logits", batch=1, context=65536, heads=IH,
             host_us=host_us(lambda: dg.paged(*a, clean=False, sched=sched)))

    x = torch.randn(1024, device="cuda")
    ptrs = [torch.empty(16, device="cuda") for _ in range(6)]
    emit(call="triton-empty-1-arg", host_us=host_us(lambda: _empty1[(1,)](x)))
    emit(call="triton-empty-24-args",
         host_us=host_us(lambda: _empty24[(1,)](*ptrs, *range(3, 21))))
    y = torch.randn(1024, device="cuda")
    emit(call="torch.add", host_us=host_us(lambda: torch.add(x, y)))

    res = dict(device=torch.cuda.get_device_name(0), torch=torch.__version__,
               triton=triton.__version__, calls=CALLS, repeats=REPEATS,
               command="python bench/bench_host.py OUT_DIR", rows=rows)
    (out_dir / "host.json").write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()

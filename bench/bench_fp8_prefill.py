"""Long prefills over an fp8_ds_mla cache: the backend's two ways, and FlashMLA's (GPU).

`python bench/bench_fp8_prefill.py OUT_DIR [--quick]` times, per head count H, new tokens T and
request length L (one prefill request: T new tokens at positions L-T..L-1, each with the
causal top-k 2048 of its positions), in one run on the same inputs:
- `copy_route_us`: what TRITON_MLA_SPARSE's forward_mqa now runs for the request (the prefill
  route of the fp8 prefill patch): `dequantize_ds_mla_context` of its L rows into a 16-bit buffer
  of `CAPACITY` rows (the workspace view), the top-k positions mapped to rows of it (torch.add +
  masked_fill_, as forward_mqa), and `sparse_mla_fwd` with the 16-bit cache;
  `copy_us`: the dequantisation alone;
- `fp8_us`: `sparse_mla_fwd` on the fp8 cache itself (the launch table's fp8 kernel; before the
  patch every prefill token ran this), slots through the request's block table;
- `flashmla_fp8_us`: FlashMLA's `sparse_decode_fwd` on the fp8 cache (what FLASHMLA_SPARSE runs
  for prefills below 32 heads), `flashmla_bf16_us`: its `sparse_prefill_fwd` on our 16-bit copy
  (what it runs at >= 32 heads after vLLM's `cp_gather_and_upconvert_fp8_kv_cache`, whose time is
  not included: in FlashMLA's favour), heads padded to 64/128 as FLASHMLA_SPARSE pads them.
Inputs as bench_attention.py lays them out (block cache [4096, 64, 656], `ql_nope` transposed bmm
output, `q_pe` slice, bf16 model); the request's blocks a random permutation of the cache's.
Eager calls, `triton.testing.do_bench` medians (L2 flushed). Error of both of ours vs float64 on
the first 4 tokens. Output: OUT_DIR/fp8_prefill.json.
Environment: SMLA_TREE (kernel file), SMLA_FLASHMLA_SO (optional, FlashMLA's ops).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import triton

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from bench_attention import (  # noqa: E402
    BS, NUM_BLOCKS, R, TOPK, FlashMLA, Ours, check, engine_query, fp8_cache)
from timing import copy_tbps, kernel_modules, parse_args  # noqa: E402
from timing import median_us as bench  # noqa: E402

HEADS = [8, 16, 32, 64, 128]
CELLS = [(1024, 8192), (4096, 8192), (4096, 65536)]  # (new tokens T, request length L)
CAPACITY = 65536  # rows of the 16-bit buffer (the engine's: max_model_len)


def causal_topk(T: int, L: int, gen) -> torch.Tensor:
    """int32 [T, TOPK] request-local positions: token i (position L-T+i) picks
    min(TOPK, position + 1) uniform draws from [0, position], -1 padded."""
    pos = torch.arange(L - T, L, device="cuda")
    rnd = torch.rand((T, TOPK), generator=gen, device="cuda")
    out = (rnd * (pos[:, None] + 1)).to(torch.int32)  # repeats allowed: a stand-in
    out[torch.arange(TOPK, device="cuda")[None, :] > pos[:, None]] = -1
    return out


def main() -> None:
    args = parse_args(__doc__)
    mod, _ = kernel_modules("vllm/v1/attention/ops/triton_sparse_mla.py", "smla_attn")
    have_fm = bool(os.environ.get("SMLA_FLASHMLA_SO"))
    if have_fm:
        torch.ops.load_library(os.environ["SMLA_FLASHMLA_SO"])
    heads, cells = ([16, 32], CELLS[:1]) if args.quick else (HEADS, CELLS)
    bw = copy_tbps()
    print(f"copy {bw:.2f} TB/s  device {torch.cuda.get_device_name(0)}", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    cache = fp8_cache(gen)
    ctx = torch.empty((CAPACITY, R + 64), dtype=torch.bfloat16, device="cuda")
    rows = []
    for T, L in cells:
        nblk = triton.cdiv(L, BS)
        bt = torch.randperm(NUM_BLOCKS, generator=gen, device="cuda")[:nblk].to(torch.int32)
        bt = bt.view(1, -1)
        seq_lens = torch.tensor([L], dtype=torch.int32, device="cuda")
        starts = torch.zeros(1, dtype=torch.int32, device="cuda")
        local = causal_topk(T, L, gen)
        req_id = torch.zeros(T, dtype=torch.int32, device="cuda")
        cache_slots = mod.convert_req_local_to_slots(req_id, bt, local, BS)
        ctx_slots = torch.empty_like(local)
        row_starts = torch.zeros(T, dtype=torch.int32, device="cuda")
        for H in heads:
            ql, qpe = engine_query(T, H, gen)
            fp8 = Ours(mod, cache, T, H, "fp8_ds_mla")
            b16 = Ours(mod, ctx, T, H, "bfloat16")

            def copy():
                mod.dequantize_ds_mla_context(cache, bt, seq_lens, starts, ctx, L,
                                              kv_lora_rank=R, rope_dtype=torch.bfloat16)

            def route():
                copy()
                torch.add(local, row_starts[:, None], out=ctx_slots)
                ctx_slots.masked_fill_(local < 0, -1)
                return b16(ql, qpe, ctx_slots)

            r = dict(heads=H, tokens=T, seq_len=L, topk=TOPK, capacity=CAPACITY,
                     call="fp8 prefill")
            r["copy_route_us"] = bench(route)
            r["copy_us"] = bench(copy)
            r["fp8_us"] = bench(lambda: fp8(ql, qpe, cache_slots))
            flat = cache.view(-1, cache.shape[-1])
            r["copy_route_rel_err_vs_f64"] = check(route(), ql, qpe, flat, cache_slots,
                                                   "fp8_ds_mla")
            r["fp8_rel_err_vs_f64"] = check(fp8(ql, qpe, cache_slots), ql, qpe, flat,
                                            cache_slots, "fp8_ds_mla")
            if have_fm:
                fm = FlashMLA(cache, T, H, "fp8_ds_mla", ql, qpe, cache_slots)
                r["flashmla_fp8_us"] = bench(fm)
                del fm
                route()
                fm = FlashMLA(ctx, T, H, "bfloat16", ql, qpe, ctx_slots)
                r["flashmla_bf16_us"] = bench(fm)
                del fm
                best = min(r["flashmla_fp8_us"], r["flashmla_bf16_us"])
                r["copy_route_vs_best_flashmla"] = r["copy_route_us"] / best
            r["copy_route_vs_fp8"] = r["copy_route_us"] / r["fp8_us"]
            rows.append(r)
            print(json.dumps(r), flush=True)
            fp8 = b16 = None
            torch.cuda.empty_cache()
    res = dict(copy_tbps=bw, device=torch.cuda.get_device_name(0), torch=torch.__version__,
               triton=triton.__version__,
               command="python bench/bench_fp8_prefill.py " + " ".join(
                   a for a in sys.argv[1:] if a != str(args.out_dir)), rows=rows)
    (args.out_dir / "fp8_prefill.json").write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()

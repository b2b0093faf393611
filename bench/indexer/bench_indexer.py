"""Time the Triton DSA-indexer logits kernels against DeepGEMM's (GPU only).

Same inputs for both (built like tests/gpu/test_indexer_gpu.py: bf16
activations quantised as vLLM does, keys written into a shuffled paged cache),
64 heads x 128 dims, cache blocks of 64 tokens, clean_logits=False as vLLM
calls them; DeepGEMM's paged schedule is built outside the timed region (vLLM
builds it in the metadata builder). Times are triton.testing.do_bench medians
(ms). Also sweeps a few launch configs of our kernels.

usage: python bench/indexer/bench_indexer.py OUT.jsonl
env:   SMLA_TREE, SMLA_DEEPGEMM_DIR, SMLA_VLLM_C_SO (as for the GPU test)
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))

from indexer_reference import (  # noqa: E402
    build_paged_case,
    gather_request_keys,
    load_indexer_module,
    quant_q,
    quant_q_vllm,
)
from test_indexer_gpu import BS, D, H, load_deepgemm, load_vllm_ops  # noqa: E402

PREFILL = [([8192], [1024]), ([65536], [512]), ([16384], [4096])]
DECODE = [(1, 65536, 1), (32, 4096, 1), (32, 65536, 1), (128, 16384, 1), (32, 65536, 2)]
MAX_MODEL_LEN = 65536
# first entry = the wrappers' defaults
PREFILL_CFGS = [dict(block_n=128, block_m=16, num_warps=4), dict(block_n=128, block_m=8, num_warps=4)]
DECODE_CFGS = [dict(block_n=128, tiles=4, num_warps=4), dict(block_n=128, tiles=1, num_warps=4),
               dict(block_n=128, tiles=16, num_warps=4), dict(block_n=64, tiles=4, num_warps=4)]


def bench(fn):
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def prefill_inputs(ops, ctx_lens, q_lens, seed):
    case = build_paged_case("cuda", ctx_lens, 1, H, D, BS, seed, ops)
    kc, ksc, ks, ke, off = [], [], [], [], 0
    for r, (L, ql) in enumerate(zip(ctx_lens, q_lens)):
        c, s = gather_request_keys(ops, case["kv"], case["bt"][r], L)
        kc.append(c)
        ksc.append(s)
        ks += [off] * ql
        ke += [off + L - ql + j + 1 for j in range(ql)]
        off += L
    M = len(ks)
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    q = torch.randn((M, H, D), generator=g, device="cuda").to(torch.bfloat16)
    w = torch.randn((M, H), generator=g, device="cuda").to(torch.bfloat16)
    qf, wq = (quant_q_vllm(ops, q, w, D ** -0.5, H ** -0.5) if ops is not None
              else quant_q(q, w, D ** -0.5, H ** -0.5))
    return (qf, torch.cat(kc), torch.cat(ksc), wq,
            torch.tensor(ks, dtype=torch.int32, device="cuda"),
            torch.tensor(ke, dtype=torch.int32, device="cuda"))


def main(out_path: str):
    tree = Path(os.environ.get("SMLA_TREE", ROOT / "work" / "vllm"))
    idx = load_indexer_module(tree, interpret=False)
    dg = load_deepgemm()
    ops = load_vllm_ops()
    dev = torch.cuda.get_device_name(0)
    recs = []

    def emit(**r):
        r["device"] = dev
        recs.append(r)
        print(json.dumps(r), flush=True)

    for i, (ctx, ql) in enumerate(PREFILL):
        qf, kc, ksc, wq, ks, ke = prefill_inputs(ops, ctx, ql, 100 + i)
        shape = dict(kind="prefill", rows=int(ks.numel()), keys=int(kc.shape[0]))
        if dg is not None:
            emit(**shape, impl="deepgemm",
                 ms=bench(lambda: dg.mqa_logits(qf, kc, ksc, wq, ks, ke, clean=False)))
        for cfg in PREFILL_CFGS:
            emit(**shape, impl="triton", **cfg,
                 ms=bench(lambda: idx.mqa_logits(qf, kc, ksc, wq, ks, ke, clean_logits=False,
                                                 **cfg)))
        del qf, kc, ksc, wq
        torch.cuda.empty_cache()

    for i, (B, ctx, next_n) in enumerate(DECODE):
        case = build_paged_case("cuda", [ctx] * B, next_n, H, D, BS, 200 + i, ops,
                                max_model_len=MAX_MODEL_LEN)
        args = (case["q_fp8"], case["kv"], case["w"], case["lens2d"], case["bt"], MAX_MODEL_LEN)
        shape = dict(kind="decode", batch=B, ctx=ctx, next_n=next_n, max_model_len=MAX_MODEL_LEN)
        if dg is not None:
            sched = dg.schedule(case["lens2d"], BS)
            emit(**shape, impl="deepgemm",
                 ms=bench(lambda: dg.paged(*args, clean=False, sched=sched)))
        for cfg in DECODE_CFGS:
            emit(**shape, impl="triton", **cfg,
                 ms=bench(lambda: idx.paged_mqa_logits(*args, clean_logits=False, **cfg)))
        del case, args
        torch.cuda.empty_cache()

    with open(out_path, "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])

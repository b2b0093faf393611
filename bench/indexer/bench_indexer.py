"""Time the Triton DSA-indexer logits kernels against DeepGEMM's (GPU only).

The calls timed are the ones vLLM's sparse_attn_indexer makes: mqa_logits
(prefill, keys gathered contiguous) and paged_mqa_logits (decode, vLLM's
block-packed indexer cache, 2-D context lengths, clean_logits=False), on the
same inputs for every side: bf16 activations quantised as vLLM does, keys
written by vLLM's indexer_k_quant_and_cache into a shuffled paged cache,
GLM-5 / DeepSeek-V3.2 geometry (64 heads x 128, blocks of 64 tokens).
Sides: ours on the fp8 tensor-core path (`fp8-mma`, sm89+) and on the software
decode path (`software`, what sm80/86 run; forced here), the kernel file of
SMLA_TREE_BEFORE (`before`, optional), DeepGEMM (vLLM 0.26.0's wheel;
paged schedule built outside the timed region, as vLLM's metadata builder
does).  Decode cells are CUDA-graph replays (vLLM captures decode), prefill
eager; triton.testing.do_bench medians (L2 flushed).  Also: the whole decode
step (logits + top-k: ours + top_k_per_row_decode, DeepGEMM + persistent_topk
as upstream runs on sm90, DeepGEMM + top_k_per_row_decode), and the host time
of one eager paged-decode call.  Copy bandwidth and bytes: each key's 132 B
(128 codes + fp32 scale) once, q and the logits written.

DeepSeek-V4 (--dsv4, issue 21): the same two calls as its C4 layer's indexer makes them
(vllm/models/deepseek_v4/attention.py: SparseAttnIndexer with max_model_len // 4, keys the
compressor's entries, 64 per block of the indexer cache, index_topk 512), 64 heads x 128:
decode of batch 1/16/64 at 8k/64k tokens of context (ctx // 4 keys) in an engine with
max_model_len 65,536 (logit rows of 16,384), and one prefill chunk (2,048 queries at the end
of 64k tokens); the step's top-k is 512 (persistent_topk, upstream's sm90 pick, for both).

--emulate: the software path only, every dot compiled as mma.sync (DISABLE_MMA_V3: what Triton
gives sm80/86, whose path it is; the H200 otherwise runs these 64-row dots as wgmma), to rank its
launch configs for those GPUs (with --sweep); no DeepGEMM or vLLM ops needed (no --dsv4).

usage: python bench/indexer/bench_indexer.py OUT_DIR [--quick] [--sweep] [--dsv4] [--emulate]
env:   SMLA_TREE, SMLA_TREE_BEFORE, SMLA_DEEPGEMM_DIR, SMLA_VLLM_C_SO
Writes OUT_DIR/indexer.json: {"copy_tbps", "rows": [...]}.
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
sys.path.insert(0, str(ROOT / "bench"))

from indexer_reference import (  # noqa: E402
    build_paged_case,
    gather_request_keys,
    quant_q,
    quant_q_vllm,
)
from test_indexer_gpu import BS, D, H, load_deepgemm, load_vllm_ops  # noqa: E402
from timing import copy_tbps, host_us, kernel_modules, parse_args  # noqa: E402
from timing import median_us as bench  # noqa: E402

REL = "vllm/v1/attention/ops/triton_dsa_indexer.py"
# (context lengths per request, queries per request)
PREFILL = [([65536], [512]), ([16384], [4096]), ([8192], [1024])]
# (batch, context, next_n); "mixed": lengths spread over 1..64k
DECODE = [(32, 65536, 1), (128, 16384, 1), (1, 65536, 1), (64, 4096, 1), (32, 65536, 2),
          (64, "mixed", 1)]
MAX_MODEL_LEN = 65536
TOPK = 2048
KEY_BYTES = D + 4


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


def decode_topk(ops, logits, next_n, lens2d, out, topk=TOPK):
    R = logits.shape[0]
    ops.topk_decode(logits, next_n, lens2d, out, R, logits.stride(0), logits.stride(1), topk)


# DeepSeek-V4's C4 indexer: keys are compressed entries (one per DSV4_RATIO tokens), the
# engine's max_model_len is divided by the ratio, top-k 512.
DSV4_RATIO = 4
DSV4_TOPK = 512
DSV4_MAX_MODEL_LEN = 65536 // DSV4_RATIO
DSV4_DECODE = [(B, ctx) for ctx in (8192, 65536) for B in (1, 16, 64)]


def dsv4(idx, dg, ops, emit, bw):
    """DeepSeek-V4 C4-layer indexer cells (module docstring), ours vs DeepGEMM."""
    ctx = 65536
    keys = ctx // DSV4_RATIO
    M = 2048
    # queries at positions ctx - M .. ctx - 1 see (pos + 1) // 4 compressed entries
    qf, kc, ksc, wq, ks, ke = prefill_inputs(ops, [keys], [M], 300)
    ke = torch.tensor([(ctx - M + j + 1) // DSV4_RATIO for j in range(M)], dtype=torch.int32,
                      device="cuda")
    dg_us = bench(lambda: dg.mqa_logits(qf, kc, ksc, wq, ks, ke, clean=False)) if dg else None
    for path, mma in (("fp8-mma", True), ("software", False)):
        us = bench(lambda: idx.mqa_logits(qf, kc, ksc, wq, ks, ke, clean_logits=False,
                                          fp8_mma=mma))
        r = dict(kind="dsv4-prefill", queries=M, context=ctx, keys=keys, path=path, ours_us=us,
                 deepgemm_us=dg_us)
        if dg_us:
            r["ours_vs_deepgemm"] = us / dg_us
        emit(r)
    del qf, kc, ksc, wq
    for i, (B, ctx) in enumerate(DSV4_DECODE):
        lens = [ctx // DSV4_RATIO] * B
        case = build_paged_case("cuda", lens, 1, H, D, BS, 500 + i, ops,
                                max_model_len=DSV4_MAX_MODEL_LEN)
        a = (case["q_fp8"], case["kv"], case["w"], case["lens2d"], case["bt"], DSV4_MAX_MODEL_LEN)
        nbytes = sum(lens) * KEY_BYTES + B * (H * D + 4 * DSV4_MAX_MODEL_LEN)
        topk_out = torch.empty((B, DSV4_TOPK), dtype=torch.int32, device="cuda")
        ws = torch.empty(1024 * 1024, dtype=torch.uint8, device="cuda")

        def step(logits_fn):
            lg = logits_fn()
            ops.persistent_topk(lg, case["lens2d"].reshape(-1), topk_out, ws, DSV4_TOPK,
                                lg.shape[1])

        dg_us = dg_step = None
        if dg is not None:
            sched = dg.schedule(case["lens2d"], BS)
            dg_us = bench(lambda: dg.paged(*a, clean=False, sched=sched), graph=True)
            if ops is not None and ops.persistent_topk is not None:
                dg_step = bench(lambda: step(lambda: dg.paged(*a, clean=False, sched=sched)),
                                graph=True)
        for path, mma in (("fp8-mma", True), ("software", False)):
            us = bench(lambda: idx.paged_mqa_logits(*a, clean_logits=False, fp8_mma=mma),
                       graph=True)
            r = dict(kind="dsv4-decode", batch=B, context=ctx, keys=sum(lens), path=path,
                     ours_us=us, deepgemm_us=dg_us,
                     pct_copy_bw=100 * nbytes / (us * 1e-6) / (bw * 1e12))
            if dg_us:
                r["ours_vs_deepgemm"] = us / dg_us
            if ops is not None and ops.persistent_topk is not None:
                r["step_ours_topk512_us"] = bench(lambda: step(lambda: idx.paged_mqa_logits(
                    *a, clean_logits=False, fp8_mma=mma)), graph=True)
                r["step_deepgemm_topk512_us"] = dg_step
            emit(r)
        del case, a
        torch.cuda.empty_cache()


SWEEP_DECODE = [dict(BLOCK_N=n, num_warps=w, num_stages=st, programs=g)
                for n, w, st, g in ((64, 4, 4, None), (64, 4, 6, None), (128, 4, 3, None),
                                    (128, 4, 4, None), (128, 8, 4, None), (64, 4, 6, 2),
                                    (64, 4, 6, 16), (64, 4, 3, None), (64, 8, 6, None))]
SWEEP_PREFILL = [dict(QROWS=q, BLOCK_N=n, num_warps=w, num_stages=st)
                 for q, n, w, st in ((2, 128, 8, 3), (4, 128, 8, 3), (2, 128, 8, 4), (1, 128, 4, 3),
                                     (2, 64, 4, 3), (4, 64, 4, 3), (4, 128, 8, 2), (8, 64, 8, 3),
                                     (4, 64, 4, 4), (4, 128, 4, 3), (8, 64, 4, 3), (2, 64, 4, 4),
                                     (4, 64, 8, 3), (4, 32, 4, 4))]


def sweep(idx, ops, emit, bw, mmas=(True, False)):
    """Launch configs beside the defaults (tuning data, same inputs), per path in `mmas`."""
    qf, kc, ksc, wq, ks, ke = prefill_inputs(ops, [65536], [512], 100)
    for mma in mmas:
        for cfg in SWEEP_PREFILL:
            try:
                us = bench(lambda: idx.mqa_logits(qf, kc, ksc, wq, ks, ke, clean_logits=False,
                                                  fp8_mma=mma, config=cfg))
            except Exception as e:  # e.g. out of shared memory
                us = repr(e)[:80]
            emit(dict(kind="sweep-prefill", queries=512, context=65536, fp8_mma=mma, **cfg,
                      ours_us=us))
    del qf, kc, ksc, wq
    for B, ctx in ((32, 65536), (1, 65536)):
        case = build_paged_case("cuda", [ctx] * B, 1, H, D, BS, 400, ops,
                                max_model_len=MAX_MODEL_LEN)
        a = (case["q_fp8"], case["kv"], case["w"], case["lens2d"], case["bt"], MAX_MODEL_LEN)
        nbytes = B * ctx * KEY_BYTES + B * (H * D + 4 * MAX_MODEL_LEN)
        for mma in mmas:
            for cfg in SWEEP_DECODE:
                cfg = {k: v for k, v in cfg.items() if v is not None}
                try:
                    us = bench(lambda: idx.paged_mqa_logits(*a, clean_logits=False, fp8_mma=mma,
                                                            config=cfg), graph=True)
                    pct = 100 * nbytes / (us * 1e-6) / (bw * 1e12)
                except Exception as e:
                    us, pct = repr(e)[:80], None
                emit(dict(kind="sweep-decode", batch=B, context=ctx, fp8_mma=mma, **cfg,
                          ours_us=us, pct_copy_bw=pct))
        del case, a


def main():
    args = parse_args(__doc__, lambda ap: (
        ap.add_argument("--dsv4", action="store_true", help="also the DeepSeek-V4 cells"),
        ap.add_argument("--dsv4-only", action="store_true", help="the DeepSeek-V4 cells alone"),
        ap.add_argument("--emulate", action="store_true",
                        help="software path only, dots compiled as mma.sync (sm80/86's)")))
    if args.emulate:
        if args.dsv4:
            raise SystemExit("--emulate times the DSA cells only (no --dsv4)")
        os.environ["DISABLE_MMA_V3"] = "1"  # before the first compile; in Triton's cache key
    args.dsv4 = args.dsv4 or args.dsv4_only
    out_dir = args.out_dir
    idx, before = kernel_modules(REL, "smla_idx")
    dg = None if args.emulate else load_deepgemm()
    ops = None if args.emulate else load_vllm_ops()
    paths = (("software", False),) if args.emulate else (("fp8-mma", True), ("software", False))
    bw = copy_tbps()
    print(f"copy {bw:.2f} TB/s  device {torch.cuda.get_device_name(0)}", flush=True)
    rows = []

    def emit(r):
        rows.append(r)
        print(json.dumps(r), flush=True)

    prefill = [] if args.dsv4_only else PREFILL[:1] if args.quick else PREFILL
    for i, (ctx, ql) in enumerate(prefill):
        qf, kc, ksc, wq, ks, ke = prefill_inputs(ops, ctx, ql, 100 + i)
        M, N = int(ks.numel()), int(kc.shape[0])
        flops = 2.0 * H * D * float((ke - ks).sum())
        dg_us = (bench(lambda: dg.mqa_logits(qf, kc, ksc, wq, ks, ke, clean=False))
                 if dg is not None else None)
        for path, mma in paths:
            us = bench(lambda: idx.mqa_logits(qf, kc, ksc, wq, ks, ke, clean_logits=False,
                                              fp8_mma=mma))
            r = dict(kind="prefill", queries=M, context=N, path=path, ours_us=us,
                     deepgemm_us=dg_us, tflops=flops / (us * 1e-6) / 1e12)
            if dg_us:
                r["ours_vs_deepgemm"] = us / dg_us
            if before is not None:  # the previous kernels on the same path
                r["before_us"] = bench(lambda: before.mqa_logits(
                    qf, kc, ksc, wq, ks, ke, clean_logits=False, fp8_mma=mma))
            emit(r)
        del qf, kc, ksc, wq
        torch.cuda.empty_cache()

    decode = [] if args.dsv4_only else DECODE[:1] if args.quick else DECODE
    for i, (B, ctx, next_n) in enumerate(decode):
        g = torch.Generator().manual_seed(7 + i)
        lens = (torch.randint(1, MAX_MODEL_LEN + 1, (B,), generator=g).tolist()
                if ctx == "mixed" else [ctx] * B)
        case = build_paged_case("cuda", lens, next_n, H, D, BS, 200 + i, ops,
                                max_model_len=MAX_MODEL_LEN)
        a = (case["q_fp8"], case["kv"], case["w"], case["lens2d"], case["bt"], MAX_MODEL_LEN)
        keys = sum(lens)
        nbytes = keys * KEY_BYTES + B * next_n * (H * D + 4 * MAX_MODEL_LEN)
        topk_out = torch.empty((B * next_n, TOPK), dtype=torch.int32, device="cuda")
        dg_us = dg_step = dg_step_same = None
        if dg is not None:
            sched = dg.schedule(case["lens2d"], BS)
            dg_us = bench(lambda: dg.paged(*a, clean=False, sched=sched), graph=True)
            if ops is not None:
                ws = torch.empty(1024 * 1024, dtype=torch.uint8, device="cuda")

                def dg_persistent():
                    lg = dg.paged(*a, clean=False, sched=sched)
                    ops.persistent_topk(lg, case["lens2d"].reshape(-1) if next_n == 1
                                        else case["lens2d"], topk_out, ws, TOPK, lg.shape[1])

                dg_step = bench(dg_persistent, graph=True) if next_n == 1 else None
                dg_step_same = bench(lambda: decode_topk(
                    ops, dg.paged(*a, clean=False, sched=sched), next_n, case["lens2d"],
                    topk_out), graph=True)
        for path, mma in paths:
            us = bench(lambda: idx.paged_mqa_logits(*a, clean_logits=False, fp8_mma=mma),
                       graph=True)
            r = dict(kind="decode", batch=B, next_n=next_n,
                     context=ctx if ctx != "mixed" else "mixed", keys=keys, path=path,
                     ours_us=us, deepgemm_us=dg_us,
                     pct_copy_bw=100 * nbytes / (us * 1e-6) / (bw * 1e12))
            if dg_us:
                r["ours_vs_deepgemm"] = us / dg_us
                r["deepgemm_pct_copy_bw"] = 100 * nbytes / (dg_us * 1e-6) / (bw * 1e12)
            if ops is not None:
                r["step_ours_topk_us"] = bench(lambda: decode_topk(
                    ops, idx.paged_mqa_logits(*a, clean_logits=False, fp8_mma=mma), next_n,
                    case["lens2d"], topk_out), graph=True)
                r["step_deepgemm_persistent_topk_us"] = dg_step
                r["step_deepgemm_same_topk_us"] = dg_step_same
            if before is not None:  # the previous kernels on the same path
                r["before_us"] = bench(lambda: before.paged_mqa_logits(
                    *a, clean_logits=False, fp8_mma=mma), graph=True)
            if i == 0:
                r["host_us"] = host_us(lambda: idx.paged_mqa_logits(
                    *a, clean_logits=False, fp8_mma=mma))
            emit(r)
        del case, a
        torch.cuda.empty_cache()

    if args.sweep:
        sweep(idx, ops, emit, bw, mmas=(False,) if args.emulate else (True, False))
    if args.dsv4:
        dsv4(idx, dg, ops, emit, bw)
    res = dict(copy_tbps=bw, device=torch.cuda.get_device_name(0), torch=torch.__version__,
               triton=triton.__version__, emulate_mma_sync=args.emulate, rows=rows)
    (out_dir / "indexer.json").write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()

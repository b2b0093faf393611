#!/usr/bin/env python3
"""DeepSeek-V4 sparse prefill attention as the engine calls it: ours vs FlashMLA, same run.

The call timed is the one each prefill chunk's _sparse_prefill makes (DeepseekV4TritonAttention
in vllm/models/deepseek_v4/nvidia/triton_sparse.py; DeepseekV4FlashMLAAttention in flashmla.py
calls flash_mla_sparse_fwd with the same arguments):
  sparse_mla_dsv4_prefill(q, kv, indices, scale, attn_sink=, topk_length=, out=)
with the tensors as _forward_prefill lays them out for one request's chunk of T tokens:
  q        [T, 64, 512] bf16 (V4's padded heads), out the same
  kv       the bf16 gather workspace viewed [rows, 1, 512]: the request's compressed entries
           (ctx / ratio of them, C4 and C128 layers) then its window rows (the chunk's tokens
           and the 128 before it)
  indices  [T, 1, K] int32 rows of kv, combine_topk_swa_indices' layout: the token's top-k
           compressed entries (C4: 512 of ctx/4, random; C128: all ctx/128, the list padded
           to a multiple of 128 with -1) then its 128 window rows; topk_length [T] the valid
           entries (every token of a chunk at the end of the context sees full lists)
  sink     fp32 [64], half the heads -inf (FlashMLA's padding)
Upstream: flash_mla_sparse_fwd from vLLM 0.26.0's wheel (its flash_mla_interface.py over
_flashmla_C: SMLA_FLASHMLA_INTERFACE, SMLA_FLASHMLA_SO), same inputs.  Cells: layer swa | c4 |
c128, context 8k / 64k, chunk of 1024 / 4096 tokens; prefill is eager (no CUDA graph), timed
with triton.testing.do_bench medians (L2 flushed).  Each of our cells is checked against a
float64 reference on its first 2 tokens.  --sweep: each cell also with every launch config of
SWEEP (sparse_mla_dsv4_prefill's `config`: BLOCK_H:BLOCK_N:num_warps:num_stages), the plan's
own first.  Output: OUT_DIR/dsv4_prefill.json {"copy_tbps", "rows"}.

  python bench/bench_dsv4_prefill.py OUT_DIR [--quick] [--sweep]
The kernel's tiles are at most 32 heads: Triton compiles their dots as mma.sync on the H200
too, as on the GPUs without wgmma that run this path.
env: SMLA_TREE (the patched tree or the bundle's kern/), SMLA_FLASHMLA_SO,
     SMLA_FLASHMLA_INTERFACE
"""
from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

import torch
import triton

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

from bench_dsv4 import HEAD_DIM, HEADS, KERNEL, SCALE, WINDOW, flashmla_module  # noqa: E402
from sparse_mla_reference import rel_err  # noqa: E402
from timing import copy_tbps, kernel_modules, median_us, parse_args  # noqa: E402

TOPK_C4 = 512
LAYERS = ("swa", "c4", "c128")
CONTEXTS = (8192, 65536)
CHUNKS = (1024, 4096)
SWEEP = ("32:32:8:1", "32:32:8:2", "32:32:4:2", "16:32:8:2", "16:32:4:2", "32:64:8:2",
         "32:64:4:2", "32:32:4:3", "32:32:4:4", "32:16:4:2", "32:64:4:3", "16:64:4:2")


def chunk_inputs(layer: str, ctx: int, T: int, gen) -> dict:
    """One request's last prefill chunk of T tokens at context ctx, as _forward_prefill hands
    it to _sparse_prefill."""
    ratio = {"swa": 0, "c4": 4, "c128": 128}[layer]
    n_comp = ctx // ratio if ratio else 0
    n_win = T + WINDOW  # the chunk's tokens and the window before the first
    rows = n_comp + n_win
    k_comp = 0 if not ratio else (min(TOPK_C4, n_comp) if ratio == 4 else n_comp)
    # the C128 list is padded to a multiple of 128 entries (-1 past them), as the engine's
    # c128a_prefill_topk_indices; topk_length counts the valid ones
    K = triton.cdiv(k_comp, 128) * 128 + WINDOW
    idx = torch.full((T, K), -1, dtype=torch.int32)
    for t in range(T):
        if ratio == 4:
            idx[t, :k_comp] = torch.randperm(n_comp, generator=gen)[:k_comp].int()
        elif ratio:
            idx[t, :k_comp] = torch.arange(n_comp, dtype=torch.int32)
        idx[t, k_comp:k_comp + WINDOW] = n_comp + t + 1 + torch.arange(WINDOW, dtype=torch.int32)
    q = (torch.randn(T, HEADS, HEAD_DIM, generator=gen) * 0.5).to(torch.bfloat16)
    kv = torch.randn(rows, HEAD_DIM, generator=gen).to(torch.bfloat16)
    sink = torch.randn(HEADS, generator=gen) * 2.0
    sink[HEADS // 2:] = float("-inf")
    dev = lambda x: x.to("cuda")  # noqa: E731
    return dict(q=dev(q), kv=dev(kv).view(rows, 1, HEAD_DIM), indices=dev(idx).unsqueeze(1),
                lens=torch.full((T,), k_comp + WINDOW, dtype=torch.int32, device="cuda"),
                sink=dev(sink),
                out=torch.empty(T, HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda"), K=K)


def f64_ref(x, n: int = 2) -> torch.Tensor:
    """float64 sparse attention with the sink of the first n tokens: softmax over the token's
    rows, output scaled by exp(lse) / (exp(lse) + exp(sink))."""
    q = x["q"][:n].double()
    valid = int(x["lens"][0])
    rows = x["kv"].view(-1, HEAD_DIM)[x["indices"][:n, 0, :valid].long()].double()  # [n, K, 512]
    s = torch.einsum("nhd,nkd->nhk", q, rows) * SCALE
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    out = torch.einsum("nhk,nkd->nhd", torch.exp(s - lse), rows)
    sink = x["sink"].double()[None, :, None]
    return out * torch.exp(lse) / (torch.exp(lse) + torch.exp(sink))


def config(spec: str) -> dict:
    vals = [int(v) for v in spec.split(":")]
    return dict(zip(("BLOCK_H", "BLOCK_N", "num_warps", "num_stages"), vals))


def main() -> None:
    args = parse_args(__doc__)
    mod, _ = kernel_modules(KERNEL, "smla_dsv4_prefill")
    fm = flashmla_module().flash_mla_sparse_fwd if os.environ.get("SMLA_FLASHMLA_SO") else None
    bw = copy_tbps()
    print(f"copy {bw:.2f} TB/s  device {torch.cuda.get_device_name(0)}", flush=True)
    gen = torch.Generator().manual_seed(0)
    cells = [(layer, ctx, T) for layer in LAYERS for ctx in CONTEXTS for T in CHUNKS
             if not (layer == "swa" and ctx != CONTEXTS[0])]
    if args.quick:
        cells = [("c4", 65536, 1024)]
    rows = []
    for layer, ctx, T in cells:
        x = chunk_inputs(layer, ctx, T, gen)
        a = (x["q"], x["kv"], x["indices"], SCALE)
        kw = dict(attn_sink=x["sink"], topk_length=x["lens"], out=x["out"])
        plan = mod._plan(x["q"].device, T, HEADS, x["K"], 0)
        r = dict(layer=layer, context=ctx, tokens=T, topk=x["K"],
                 plan=":".join(str(plan[k]) for k in ("BLOCK_H", "BLOCK_N", "num_warps",
                                                      "num_stages")))
        ours = functools.partial(mod.sparse_mla_dsv4_prefill, *a, **kw)
        r["ours_us"] = median_us(ours, False)
        ref = f64_ref(x).cpu()
        r["rel_err_vs_f64"] = rel_err(ours()[:2].cpu(), ref)
        if fm is not None:
            r["flashmla_us"] = median_us(functools.partial(
                fm, q=x["q"], kv=x["kv"], indices=x["indices"], sm_scale=SCALE,
                attn_sink=x["sink"], topk_length=x["lens"], out=x["out"]), False)
            r["ours_vs_flashmla"] = r["ours_us"] / r["flashmla_us"]
        nbytes = T * x["K"] * HEAD_DIM * 2 + 2 * T * HEADS * HEAD_DIM * 2
        r["pct_copy_bw"] = 100 * nbytes / (r["ours_us"] * 1e-6) / (bw * 1e12)
        if args.sweep:
            r["sweep"] = {}
            for spec in SWEEP:
                tuned = functools.partial(ours, config=config(spec))
                try:
                    r["sweep"][spec] = dict(us=median_us(tuned, False),
                                            rel_err_vs_f64=rel_err(tuned()[:2].cpu(), ref))
                except Exception as e:  # noqa: BLE001 (a config that does not fit)
                    r["sweep"][spec] = dict(error=repr(e)[:120])
        rows.append(r)
        print(json.dumps(r), flush=True)
        del x
        torch.cuda.empty_cache()
    res = dict(copy_tbps=bw, device=torch.cuda.get_device_name(0), torch=torch.__version__,
               triton=triton.__version__, rows=rows)
    (args.out_dir / "dsv4_prefill.json").write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()

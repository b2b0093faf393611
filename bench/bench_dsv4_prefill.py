#!/usr/bin/env python3
"""DeepSeek-V4 sparse prefill attention as the engine calls it: ours vs FlashMLA, same run.

The call timed is the one each prefill chunk's _sparse_prefill makes, its argument expressions
read from the tree's DeepseekV4TritonAttention._sparse_prefill (vllm/models/deepseek_v4/nvidia/
triton_sparse.py) and evaluated over the tensors below, as bench_dsv4.py does for the decode:
  sparse_mla_dsv4_prefill(q, kv, indices, scale, attn_sink=, topk_length=, out=)
with the tensors as _forward_prefill lays them out for one request's chunk of T tokens:
  q        [T, 64, 512] bf16 (V4's padded heads; --heads 128: 128), out the same
  kv       the bf16 gather workspace viewed [rows, 1, 512]: the request's compressed entries
           (ctx / ratio of them, C4 and C128 layers) then its window rows (the chunk's tokens
           and the 128 before it)
  indices  [T, 1, K] int32 rows of kv, combine_topk_swa_indices' layout: the token's top-k
           compressed entries (C4: 512 of ctx/4, random; C128: all ctx/128, the list padded
           to a multiple of 128 with -1) then its 128 window rows; topk_length [T] the valid
           entries (every token of a chunk at the end of the context sees full lists)
  sink     fp32 [heads], half of them -inf (FlashMLA's padding)
Upstream: flash_mla_sparse_fwd from vLLM 0.26.0's wheel (its flash_mla_interface.py over
_flashmla_C: SMLA_FLASHMLA_INTERFACE, SMLA_FLASHMLA_SO) as DeepseekV4FlashMLAAttention.
_sparse_prefill calls it, same inputs.  Cells: layer swa | c4 |
c128, context 8k / 64k, chunk of 1024 / 4096 tokens; prefill is eager (no CUDA graph), timed
with triton.testing.do_bench medians (L2 flushed).  Each of our cells is checked against a
float64 reference on its first 2 tokens.  --sweep: each cell also with every launch config of
SWEEP (sparse_mla_dsv4_prefill's `config`: BLOCK_H:BLOCK_N:num_warps:num_stages), the plan's
own first.  Output: OUT_DIR/dsv4_prefill.json {"copy_tbps", "rows"}.

  python bench/bench_dsv4_prefill.py OUT_DIR [--quick] [--sweep] [--heads 64|128]
  python bench/bench_dsv4_prefill.py OUT_DIR --cpu-smoke   (TRITON_INTERPRET=1, tiny shapes,
        fp16, ours only, vs float64: OUT_DIR/dsv4_prefill-cpu-smoke.json)
The plan's tiles: 32 heads (mma.sync, as on the GPUs without wgmma that run this path) and, on
sm90 for 64 heads over a full unsplit grid, one 64-head tile on 8 warps (wgmma, the scores split
over the warpgroups).
env: SMLA_TREE (the patched tree or the bundle's kern/), SMLA_FLASHMLA_SO,
     SMLA_FLASHMLA_INTERFACE, SMLA_DSV4_PREFILL_SWEEP (space-separated configs replacing SWEEP)
"""
from __future__ import annotations

import functools
import json
import os
import sys
import types
from pathlib import Path

if "--cpu-smoke" in sys.argv:  # before triton is first imported
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

from bench_dsv4 import (  # noqa: E402
    HEAD_DIM, HEADS, KERNEL, SCALE, WINDOW, engine_forms, evaluate, flashmla_module, tree)
from sparse_mla_reference import load_tree_module, rel_err  # noqa: E402
from timing import copy_tbps, kernel_modules, median_us, parse_args  # noqa: E402

TOPK_C4 = 512
LAYERS = ("swa", "c4", "c128")
CONTEXTS = (8192, 65536)
CHUNKS = (1024, 4096)
# the engine's calls: _sparse_prefill of both classes
FORMS = dict(method="_sparse_prefill", funcs=("sparse_mla_dsv4_prefill", "flash_mla_sparse_fwd"))
# CPU smoke: tiny shapes under the interpreter (fp16: it has no bf16 arithmetic)
SMOKE = dict(heads=16, window=32, topk=64, context=1024, tokens=3)
SMOKE_BOUND = 2e-3
SWEEP = tuple(os.environ.get("SMLA_DSV4_PREFILL_SWEEP", "").split()) or (
    "32:32:8:1", "32:32:8:2", "32:32:4:2", "16:32:8:2", "16:32:4:2", "32:64:8:2", "32:64:4:2",
    "32:32:4:3", "32:32:4:4", "32:16:4:2", "32:64:4:3", "16:64:4:2")


def chunk_inputs(layer: str, ctx: int, T: int, gen, heads: int = HEADS, window: int = WINDOW,
                 topk: int = TOPK_C4, dtype=torch.bfloat16, device: str = "cuda") -> dict:
    """One request's last prefill chunk of T tokens at context ctx, as _forward_prefill hands
    it to _sparse_prefill."""
    ratio = {"swa": 0, "c4": 4, "c128": 128}[layer]
    n_comp = ctx // ratio if ratio else 0
    rows = n_comp + T + window  # compressed entries, the chunk's tokens and the window before
    k_comp = 0 if not ratio else (min(topk, n_comp) if ratio == 4 else n_comp)
    # the C128 list is padded to a multiple of 128 entries (-1 past them), as the engine's
    # c128a_prefill_topk_indices; topk_length counts the valid ones
    K = triton.cdiv(k_comp, 128) * 128 + window
    idx = torch.full((T, K), -1, dtype=torch.int32)
    for t in range(T):
        if ratio == 4:
            idx[t, :k_comp] = torch.randperm(n_comp, generator=gen)[:k_comp].int()
        elif ratio:
            idx[t, :k_comp] = torch.arange(n_comp, dtype=torch.int32)
        idx[t, k_comp:k_comp + window] = n_comp + t + 1 + torch.arange(window, dtype=torch.int32)
    q = (torch.randn(T, heads, HEAD_DIM, generator=gen) * 0.5).to(dtype)
    kv = torch.randn(rows, HEAD_DIM, generator=gen).to(dtype)
    sink = torch.randn(heads, generator=gen) * 2.0
    sink[heads // 2:] = float("-inf")
    dev = lambda x: x.to(device)  # noqa: E731
    return dict(q=dev(q), kv=dev(kv).view(rows, 1, HEAD_DIM), indices=dev(idx).unsqueeze(1),
                lens=torch.full((T,), k_comp + window, dtype=torch.int32, device=device),
                sink=dev(sink), out=torch.empty(T, heads, HEAD_DIM, dtype=dtype, device=device),
                K=K)


def engine_call(fn, form, x):
    """fn bound to the class's call form over the chunk x (the names _sparse_prefill uses)."""
    ns = dict(self=types.SimpleNamespace(scale=SCALE, attn_sink=x["sink"]), q=x["q"], kv=x["kv"],
              indices=x["indices"], topk_length=x["lens"], out=x["out"])
    args, kw = evaluate(form, ns)
    return functools.partial(fn, *args, **kw)


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


def cpu_smoke(out_dir: Path) -> int:
    """Each layer's chunk through the engine's call under the interpreter, vs float64."""
    mod = load_tree_module(tree(), KERNEL, "smla_dsv4_prefill", interpret=True)
    form, _ = engine_forms(**FORMS)
    gen = torch.Generator().manual_seed(0)
    s, rows, bad = SMOKE, [], 0
    for layer in ("swa", "c4", "c128"):
        x = chunk_inputs(layer, s["context"], s["tokens"], gen, s["heads"], s["window"],
                         s["topk"], torch.float16, "cpu")
        ret = engine_call(mod.sparse_mla_dsv4_prefill, form, x)()
        assert ret is x["out"], "the call must write the layer's output in place"
        err = rel_err(ret[:2], f64_ref(x))
        rows.append(dict(layer=layer, tokens=s["tokens"], topk=x["K"], rel_err_vs_f64=err))
        bad += not (err < SMOKE_BOUND and torch.isfinite(ret).all())
        print(json.dumps(rows[-1]), flush=True)
    (out_dir / "dsv4_prefill-cpu-smoke.json").write_text(json.dumps(dict(rows=rows), indent=1))
    return 1 if bad else 0


def main() -> None:
    def extra(ap):
        ap.add_argument("--cpu-smoke", action="store_true",
                        help="TRITON_INTERPRET=1, tiny shapes, ours only")
        ap.add_argument("--heads", type=int, choices=(HEADS, 2 * HEADS), default=HEADS,
                        help="padded query heads of the call (V4's 64, or 128)")
    args = parse_args(__doc__, extra)
    heads = args.heads
    if args.cpu_smoke:
        sys.exit(cpu_smoke(args.out_dir))
    mod, _ = kernel_modules(KERNEL, "smla_dsv4_prefill")
    ours_form, fm_form = engine_forms(**FORMS)
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
        x = chunk_inputs(layer, ctx, T, gen, heads)
        plan = mod._plan(x["q"].device, T, heads, x["K"], 0)
        r = dict(layer=layer, heads=heads, context=ctx, tokens=T, topk=x["K"],
                 plan=":".join(str(plan[k]) for k in ("BLOCK_H", "BLOCK_N", "num_warps",
                                                      "num_stages")))
        ours = engine_call(mod.sparse_mla_dsv4_prefill, ours_form, x)
        r["ours_us"] = median_us(ours, False)
        ref = f64_ref(x).cpu()
        r["rel_err_vs_f64"] = rel_err(ours()[:2].cpu(), ref)
        if fm is not None:
            r["flashmla_us"] = median_us(engine_call(fm, fm_form, x), False)
            r["ours_vs_flashmla"] = r["ours_us"] / r["flashmla_us"]
        nbytes = T * x["K"] * HEAD_DIM * 2 + 2 * T * heads * HEAD_DIM * 2
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

#!/usr/bin/env python3
"""Sparse-MLA attention as the engine calls it: ours vs FlashMLA, same run.

The call timed is the one TRITON_MLA_SPARSE's forward_mqa makes:
  sparse_mla_fwd(ql_nope, kv_cache, slots, scale, out=, q_pe=, scratch=,
                 kv_cache_dtype=, rope_dtype=)
with the tensors laid out as the engine lays them out:
  kv_cache   vLLM's block cache, [num_blocks, 64, 576] bf16 or
             [num_blocks, 64, 656] uint8 (fp8_ds_mla); "stride2x" rows: the
             same blocks at twice the block stride (a cross-layer layout)
  ql_nope    torch.bmm's [H, T, 512] output transposed to [T, H, 512]
             (strides (512, T * 512, 1)), as MLAAttention.forward passes it
  q_pe       the rope slice of the projected query [T, H, 128 + 64]
             (strides (H * 192, 192, 1))
  out/scratch one workspace buffer, as the backend's workspace views
Upstream, same inputs: FlashMLA from vLLM 0.26.0's wheel (_flashmla_C), called
as FLASHMLA_SPARSE calls it on sm90: sparse_prefill_fwd for bf16 caches (the
cache as [slots, 1, 576]), sparse_decode_fwd for fp8_ds_mla ([blocks, 64, 1,
656], scheduler metadata made once per shape outside the timed region), heads
padded to 64 (128 above 64).  The padding copy is left out of FlashMLA's time
(in its favour).  Also timed: the flat [slots, 576] view of the same cache
(bf16; the call the earlier benchmark made, an extra column, not the engine),
and the kernel file given by SMLA_TREE_BEFORE ("before").
Timing: triton.testing.do_bench medians (L2 flushed) for eager cells; tokens
<= 64 as CUDA-graph replays (as vLLM's decode runs).  Host time: 2000 eager
calls of the installed-wheel form back to back, wall time / calls, GPU work
tiny (1 token), with out and scratch passed (the engine's form).
Copy bandwidth measured in the same run: 1 GiB device-to-device copy.
Bytes per cell: each gathered row once per token (1152 B bf16, 656 B fp8) +
q + out.  Output: attention.json {"copy_tbps", "rows": [...]}.

  python bench/bench_attention.py OUT_DIR [--quick]
env: SMLA_TREE (kernel file), SMLA_TREE_BEFORE (optional), SMLA_FLASHMLA_SO
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import triton

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

from fp8_ds_mla_reference import row_bytes  # noqa: E402
from timing import copy_tbps, host_us, kernel_modules, parse_args  # noqa: E402
from timing import median_us as bench  # noqa: E402
from sparse_mla_reference import reference_sparse_mla  # noqa: E402

R, P, BS, TOPK = 512, 64, 64, 2048
NOPE = 128  # qk_nope_head_dim (DeepSeek-V3.2); the rope slice starts here
SCALE = (NOPE + P) ** -0.5
NUM_BLOCKS = 4096  # 262,144 slots: 302 MB bf16, 172 MB fp8 (> the 60 MB L2)
HEADS = [8, 16, 32, 64, 128]  # 32: DeepSeek-V3.2 at TP 4, the serving run's slowest fp8 cell
TOKENS = [1, 64, 1024, 4096]
GRAPH_MAX_TOKENS = 64
FP8_ROW = row_bytes(R, P)
SWEEP = [(32, 4, 2, False), (32, 4, 2, True), (32, 4, 3, True), (64, 4, 2, True),
         (64, 8, 2, True), (32, 8, 2, True), (16, 4, 2, True), (16, 4, 3, True)]


def engine_query(T: int, H: int, gen):
    """(ql_nope, q_pe) as MLAAttention.forward hands them to forward_mqa."""
    ql = torch.randn((H, T, R), generator=gen, device="cuda").to(torch.bfloat16)
    q = torch.randn((T, H, NOPE + P), generator=gen, device="cuda").to(torch.bfloat16)
    return ql.transpose(0, 1), q[..., NOPE:]


def fp8_cache(gen, blocks: torch.Tensor | None = None):
    """A [NUM_BLOCKS, 64, 656] fp8_ds_mla cache: finite e4m3 codes, per-tile
    scales around 2**-4..2**0, bf16 rope."""
    rows = NUM_BLOCKS * BS
    codes = torch.randint(0, 256, (rows, R), generator=gen, device="cuda", dtype=torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x3C  # no NaN codes
    scales = torch.exp2(-4 * torch.rand((rows, R // 128), generator=gen, device="cuda"))
    rope = torch.randn((rows, P), generator=gen, device="cuda").to(torch.bfloat16)
    kv = torch.cat([codes, scales.view(torch.uint8).view(rows, -1),
                    rope.view(torch.uint8).view(rows, -1)], dim=1)
    return kv.view(NUM_BLOCKS, BS, FP8_ROW)


class Ours:
    def __init__(self, mod, kv, T, H, cache):
        self.mod, self.kv, self.cache = mod, kv, cache
        dt = "fp8_ds_mla" if cache == "fp8_ds_mla" else "auto"
        n = mod.sparse_mla_scratch_numel(T, H, TOPK, torch.bfloat16, torch.device("cuda"), R,
                                         kv_cache_dtype=dt)
        self.out = torch.empty((T, H, R), dtype=torch.bfloat16, device="cuda")
        self.scratch = torch.empty(max(1, n), dtype=torch.float32, device="cuda")
        self.kw = dict(kv_cache_dtype=dt, rope_dtype=torch.bfloat16 if dt != "auto" else None)

    def __call__(self, ql, qpe, slots, kv=None):
        return self.mod.sparse_mla_fwd(ql, self.kv if kv is None else kv, slots, SCALE,
                                       kv_lora_rank=R, out=self.out, q_pe=qpe,
                                       scratch=self.scratch, **self.kw)


class FlashMLA:
    """vLLM 0.26.0's FlashMLA ops as FLASHMLA_SPARSE calls them on sm90."""

    def __init__(self, kv, T, H, cache, ql, qpe, slots):
        self.ops = torch.ops._flashmla_C
        self.hp = 64 if H <= 64 else 128
        q = torch.zeros((T, self.hp, R + P), dtype=torch.bfloat16, device="cuda")
        q[:, :H, :R] = ql
        q[:, :H, R:] = qpe
        self.q, self.cache = q, cache
        if cache == "fp8_ds_mla":
            self.kv = kv.view(torch.uint8).unsqueeze(-2)  # [blocks, 64, 1, 656]
            self.idx = slots.unsqueeze(0)  # [1, T, K]
            self.q4 = q.unsqueeze(0)
            self.sched = self.nsplit = None
            out = self.ops.sparse_decode_fwd(self.q4, self.kv, self.idx, None, None, None, None,
                                             None, None, None, R, SCALE, None)
            self.sched, self.nsplit = out[2], out[3]
            self.out = torch.empty_like(out[0])
        else:
            self.kv = kv.view(-1, 1, R + P)
            self.idx = slots.view(T, 1, -1)
            self.out = torch.empty((T, self.hp, R), dtype=torch.bfloat16, device="cuda")

    def __call__(self):
        if self.cache == "fp8_ds_mla":
            return self.ops.sparse_decode_fwd(self.q4, self.kv, self.idx, None, None, self.sched,
                                              self.nsplit, None, None, None, R, SCALE,
                                              self.out)[0]
        return self.ops.sparse_prefill_fwd(self.q, self.kv, self.idx, SCALE, R, None, None,
                                           self.out)[0]


def check(out, ql, qpe, kv_rows, slots, cache, n=4) -> float:
    """max relative error of out vs float64 on the first n tokens."""
    from fp8_ds_mla_reference import dequant_ds_mla
    from sparse_mla_reference import rel_err

    n = min(n, out.shape[0])
    picked = kv_rows[slots[:n].long().reshape(-1)]  # the rows the n tokens gather
    if cache == "fp8_ds_mla":
        picked = dequant_ds_mla(picked, torch.bfloat16)
    local = torch.arange(picked.shape[0], device=picked.device, dtype=torch.int32)
    q = torch.cat([ql[:n], qpe[:n]], dim=-1)
    ref = reference_sparse_mla(q, picked, local.view(n, -1), SCALE, R)
    return rel_err(out[:n], ref)


def main() -> None:
    args = parse_args(__doc__)
    out_dir = args.out_dir
    mod, before = kernel_modules("vllm/v1/attention/ops/triton_sparse_mla.py", "smla_attn")
    have_fm = False
    if os.environ.get("SMLA_FLASHMLA_SO"):
        torch.ops.load_library(os.environ["SMLA_FLASHMLA_SO"])
        have_fm = True
    bw = copy_tbps()
    print(f"copy {bw:.2f} TB/s  device {torch.cuda.get_device_name(0)}", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    caches = {
        "bfloat16": torch.randn((NUM_BLOCKS, BS, R + P), generator=gen, device="cuda"
                                ).to(torch.bfloat16),
        "fp8_ds_mla": fp8_cache(gen),
    }
    heads, tokens = ([8, 64], [1, 1024]) if args.quick else (HEADS, TOKENS)
    rows = []
    for cache, kv in caches.items():
        row_b = FP8_ROW if cache == "fp8_ds_mla" else 2 * (R + P)
        for H in heads:
            for T in tokens:
                graph = T <= GRAPH_MAX_TOKENS
                ql, qpe = engine_query(T, H, gen)
                slots = torch.randint(0, NUM_BLOCKS * BS, (T, TOPK), generator=gen,
                                      device="cuda", dtype=torch.int32)
                ours = Ours(mod, kv, T, H, cache)
                r = dict(heads=H, tokens=T, topk=TOPK, cache=cache, call="engine", graph=graph)
                r["ours_us"] = bench(lambda: ours(ql, qpe, slots), graph)
                r["rel_err_vs_f64"] = check(ours(ql, qpe, slots), ql, qpe,
                                            kv.view(-1, kv.shape[-1]), slots, cache)
                if before is not None:
                    old = Ours(before, kv, T, H, cache)
                    r["before_us"] = bench(lambda: old(ql, qpe, slots), graph)
                if have_fm:
                    fm = FlashMLA(kv, T, H, cache, ql, qpe, slots)
                    r["flashmla_us"] = bench(fm, graph)
                    r["ours_vs_flashmla"] = r["ours_us"] / r["flashmla_us"]
                # a block stride twice the block (cross-layer layouts)
                wide = torch.empty((NUM_BLOCKS, 2, BS, kv.shape[-1]), dtype=kv.dtype,
                                   device="cuda")
                wide[:, 0] = kv
                r["stride2x_us"] = bench(lambda: ours(ql, qpe, slots, wide[:, 0]), graph)
                del wide
                if cache == "bfloat16":
                    flat = kv.view(-1, R + P)
                    r["flat_us"] = bench(lambda: ours(ql, qpe, slots, flat), graph)
                nbytes = T * TOPK * row_b + T * H * (R + P) * 2 + T * H * R * 2
                r["pct_copy_bw"] = 100 * nbytes / (r["ours_us"] * 1e-6) / (bw * 1e12)
                rows.append(r)
                print(json.dumps(r), flush=True)
                del ours
                torch.cuda.empty_cache()
    if args.sweep:
        for cache, H, T in (("fp8_ds_mla", 8, 4096), ("fp8_ds_mla", 16, 1024),
                            ("fp8_ds_mla", 32, 64), ("fp8_ds_mla", 32, 4096),
                            ("fp8_ds_mla", 64, 1024), ("fp8_ds_mla", 128, 1024)):
            kv = caches[cache]
            ql, qpe = engine_query(T, H, gen)
            slots = torch.randint(0, NUM_BLOCKS * BS, (T, TOPK), generator=gen, device="cuda",
                                  dtype=torch.int32)
            ours = Ours(mod, kv, T, H, cache)
            for bn, w, st, deq in SWEEP:
                cfg = dict(BLOCK_N=bn, num_warps=w, num_stages=st, FP8_DEQUANT=deq)
                if T >= 1024 and H >= 64 and not deq:
                    continue
                try:
                    us = bench(lambda: mod.sparse_mla_fwd(
                        ql, kv, slots, SCALE, kv_lora_rank=R, q_pe=qpe, config=cfg,
                        **ours.kw), False)
                except Exception as e:
                    us = repr(e)[:80]
                r = dict(call="sweep", cache=cache, heads=H, tokens=T, **cfg, ours_us=us)
                rows.append(r)
                print(json.dumps(r), flush=True)
    # host time of one eager call, engine form, 1 token
    for cache, kv in caches.items():
        for H in (8, 64):
            ql, qpe = engine_query(1, H, gen)
            slots = torch.randint(0, NUM_BLOCKS * BS, (1, TOPK), generator=gen, device="cuda",
                                  dtype=torch.int32)
            ours = Ours(mod, kv, 1, H, cache)
            r = dict(heads=H, tokens=1, topk=TOPK, cache=cache, call="host",
                     host_us=host_us(lambda: ours(ql, qpe, slots)))
            if before is not None:
                old = Ours(before, kv, 1, H, cache)
                r["before_host_us"] = host_us(lambda: old(ql, qpe, slots))
            rows.append(r)
            print(json.dumps(r), flush=True)
            if H == 8:  # where the host time goes (cProfile, cumulative)
                import cProfile
                import io
                import pstats

                prof = cProfile.Profile()
                prof.runcall(host_us, lambda: ours(ql, qpe, slots), 500)
                buf = io.StringIO()
                pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
                (out_dir / f"host-profile-{cache}.txt").write_text(buf.getvalue())
    res = dict(copy_tbps=bw, device=torch.cuda.get_device_name(0),
               torch=torch.__version__, triton=triton.__version__, rows=rows)
    (out_dir / "attention.json").write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()

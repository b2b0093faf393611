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
(in its favour).
fp8_ds_mla rows come twice per cell, `path` "hw" (the hardware e4m3
conversion, sm89+) and "software" (the decode sm80/86 run, forced here with
fp8_hw=False); each also times the fp8 kernel the launch table did not pick
(`fp8_kernel` is the pick; `codes_us` / `dequant_us` both kernels, one of them
the engine call's time): the table's choices measured both ways.
--extra: also the kernel file given by SMLA_TREE_BEFORE ("before"), the flat
[slots, 576] view (bf16) and a block stride twice the block ("stride2x");
--before: only the first.
--emulate 8.0 | 8.6 | 8.9 | 12.0: the launch table of that GPU (its tiles, e4m3
path, no PDL below sm90) with every dot compiled as mma.sync, as Triton compiles
for GPUs without wgmma (timing.emulate_capability): those GPUs' kernels run on
the H200's memory system and clocks, a proxy for ranking their launch choices,
not their speed; FlashMLA stays the H200's.
Timing: triton.testing.do_bench medians (L2 flushed) for eager cells; tokens
<= 64 as CUDA-graph replays (as vLLM's decode runs).  Host time per call:
bench/bench_host.py (host.json).
Copy bandwidth measured in the same run: 1 GiB device-to-device copy.
Bytes per cell: each gathered row once per token (1152 B bf16, 656 B fp8) +
q + out.  Output: attention.json {"copy_tbps", "command", "rows": [...]}.

  python bench/bench_attention.py OUT_DIR [--quick] [--prewarm N] [--extra | --before]
      [--emulate 8.0] [--heads 16,32 --tokens 1,1024]
env: SMLA_TREE (kernel file), SMLA_TREE_BEFORE (optional), SMLA_FLASHMLA_SO
"""
from __future__ import annotations

import argparse
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
from timing import copy_tbps, emulate_capability, kernel_modules, parse_args, prewarm_workers  # noqa: E402
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
    """The engine's call.  force: a launch config override (the fp8 kernel the
    launch table did not pick); scratch sized for it."""

    def __init__(self, mod, kv, T, H, cache, path=None, force=None):
        self.mod, self.kv, self.cache = mod, kv, cache
        dt = "fp8_ds_mla" if cache == "fp8_ds_mla" else "auto"
        hw = None if path is None else path == "hw"
        n = mod.sparse_mla_scratch_numel(T, H, TOPK, torch.bfloat16, torch.device("cuda"), R,
                                         config=force, kv_cache_dtype=dt, fp8_hw=hw)
        self.out = torch.empty((T, H, R), dtype=torch.bfloat16, device="cuda")
        self.scratch = torch.empty(max(1, n), dtype=torch.float32, device="cuda")
        self.kw = dict(kv_cache_dtype=dt, rope_dtype=torch.bfloat16 if dt != "auto" else None)
        if hw is not None:
            self.kw["fp8_hw"] = hw
        if force:
            self.kw["config"] = force

    def __call__(self, ql, qpe, slots, kv=None):
        return self.mod.sparse_mla_fwd(ql, self.kv if kv is None else kv, slots, SCALE,
                                       kv_lora_rank=R, out=self.out, q_pe=qpe,
                                       scratch=self.scratch, **self.kw)


def other_fp8(mod, kv, T, H, path):
    """(name, Ours) of the fp8 kernel the launch table did not pick for this
    cell, in the same tile (the codes kernel stages two code tiles: with
    64-head tiles only 32 rows fit in shared memory)."""
    cfg = mod.sparse_mla_config(H, T, TOPK, torch.bfloat16, torch.device("cuda"),
                                "fp8_ds_mla", fp8_hw=path == "hw")
    force = dict(FP8_DEQUANT=not cfg["FP8_DEQUANT"])
    if cfg["FP8_DEQUANT"] and cfg["BLOCK_H"] >= 64:
        force["BLOCK_N"] = 32
    name = "dequant" if force["FP8_DEQUANT"] else "codes"
    return name, Ours(mod, kv, T, H, "fp8_ds_mla", path, force)


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


VARIANTS = (("bfloat16", None), ("fp8_ds_mla", "hw"), ("fp8_ds_mla", "software"))
# --sweep: other tiles for 32 heads (the fp8 cache's slowest head count; the
# bf16 cache's 1.18x FlashMLA there), both fp8 kernels
SWEEP_HEADS, SWEEP_TOKENS = 32, (64, 1024, 4096)
SWEEP_FP8 = [dict(FP8_DEQUANT=d, BLOCK_H=h, BLOCK_N=n, num_warps=w, num_stages=2)
             for d, h, n, w in ((True, 64, 64, 8), (True, 32, 64, 8), (True, 32, 32, 4),
                                (False, 32, 32, 8), (False, 16, 32, 4), (False, 16, 64, 8))]
SWEEP_BF16 = [dict(BLOCK_H=h, BLOCK_N=n, num_warps=w, num_stages=st)
              for h, n, w, st in ((32, 64, 8, 2), (64, 64, 8, 2), (16, 32, 4, 2), (32, 32, 4, 3))]


# --sweep-bf16 H[,H]: the 16-bit kernel's tiles for these head counts (the
# launch table's bf16 rows held under both Tritons, issue 32), bf16 cache only,
# at --tokens (default 1024, 4096); the first config of each is today's pick
# (five stages: the gathered rows in two buffers, see SWEEP_FP8_TILES)
SWEEP_BF16_TILES = {
    16: [(16, 32, 4, 2), (16, 32, 4, 3), (16, 64, 4, 2), (16, 64, 8, 2), (16, 32, 8, 2),
         (16, 16, 4, 3), (16, 64, 4, 3), (16, 32, 2, 2), (16, 32, 4, 5)],
    32: [(32, 64, 4, 2), (32, 64, 8, 2), (32, 32, 4, 2), (32, 32, 4, 3), (32, 64, 4, 3),
         (32, 32, 8, 3), (64, 64, 8, 2), (32, 32, 4, 5)],
    64: [(64, 64, 8, 2), (64, 32, 8, 2), (64, 32, 8, 3), (64, 16, 8, 4), (64, 16, 4, 4),
         (64, 64, 8, 1), (64, 128, 16, 1), (64, 128, 8, 1)],
}


# --sweep-fp8 H[,H]: the fp8 codes kernel's tiles (BLOCK_H, BLOCK_N, warps, stages, maxnreg)
# for these head counts, both e4m3 paths, at --tokens (default 1024, 4096); the first config
# of each is the launch table's pick on ~227 KB parts. Five stages give the gathered rows two
# buffers (Triton splits num_stages - 1 over the index load and the gather that depends on
# it: below five, one buffer each, copied after the step's last dot and waited on at the
# start of the next; compile-only, sm90). Timed 2026-12-06: not faster
# (bench/results/h100-2026-12-06/).
SWEEP_FP8_TILES = {
    16: [(16, 32, 4, 2, 168), (16, 32, 4, 5, None), (16, 32, 4, 3, 168), (16, 64, 4, 5, None)],
    32: [(32, 32, 4, 2, None), (32, 32, 4, 5, None), (32, 32, 8, 5, None)],
}


def sweep_cells(bf16_heads=None, tokens=None, fp8_heads=None):
    """(heads, tokens, cache, path, config) of --sweep, --sweep-bf16 or --sweep-fp8."""
    if bf16_heads:
        return [(H, T, "bfloat16", None,
                 dict(BLOCK_H=h, BLOCK_N=n, num_warps=w, num_stages=st))
                for H in bf16_heads for T in tokens
                for h, n, w, st in SWEEP_BF16_TILES[min(SWEEP_BF16_TILES, key=lambda k: abs(k - H))]]
    if fp8_heads:
        return [(H, T, "fp8_ds_mla", path,
                 dict(FP8_DEQUANT=False, BLOCK_H=h, BLOCK_N=n, num_warps=w, num_stages=st,
                      maxnreg=reg))
                for H in fp8_heads for T in tokens for path in ("hw", "software")
                for h, n, w, st, reg in SWEEP_FP8_TILES[16 if H <= 16 else 32]]
    return [(SWEEP_HEADS, T, cache, path, cfg) for T in SWEEP_TOKENS for cache, path in VARIANTS
            for cfg in (SWEEP_BF16 if path is None else SWEEP_FP8)]


def prewarm_worker(mod, which: str, heads, tokens, sweep: list, sweep_only: bool,
                   before=None) -> None:
    """Compile every launch of the grid once on a small cache (Triton's disk
    cache then serves the timed process): cells i::n of the grid."""
    i, n = map(int, which.split("/"))
    gen = torch.Generator(device="cuda").manual_seed(i)
    nb = 64
    small = {"bfloat16": torch.randn((nb, BS, R + P), generator=gen, device="cuda"
                                     ).to(torch.bfloat16)}
    cells = [] if sweep_only else [(H, T, v) for H in heads for T in tokens for v in VARIANTS]
    cells = cells[i::n]
    for H, T, (cache, path) in cells:
        kv = small.get(cache)
        if kv is None:
            kv = small[cache] = fp8_small(gen, nb)
        ql, qpe = engine_query(T, H, gen)
        slots = torch.randint(0, nb * BS, (T, TOPK), generator=gen, device="cuda",
                              dtype=torch.int32)
        Ours(mod, kv, T, H, cache, path)(ql, qpe, slots)
        if before is not None:
            Ours(before, kv, T, H, cache, path)(ql, qpe, slots)
        if path is not None:
            other_fp8(mod, kv, T, H, path)[1](ql, qpe, slots)
    if sweep:
        # one compile per launch config: the token count changes only the grid
        once = {(H, cache, path, tuple(cfg.items())): (H, T, cache, path, cfg)
                for H, T, cache, path, cfg in reversed(sweep)}
        for H, T, cache, path, cfg in list(once.values())[::-1][i::n]:
            kv = small.get(cache)
            if kv is None:
                kv = small[cache] = fp8_small(gen, nb)
            ql, qpe = engine_query(T, H, gen)
            slots = torch.randint(0, nb * BS, (T, TOPK), generator=gen, device="cuda",
                                  dtype=torch.int32)
            try:
                Ours(mod, kv, T, H, cache, path, dict(cfg))(ql, qpe, slots)
            except Exception as e:  # noqa: BLE001 (a config that does not fit)
                print("prewarm sweep", T, cache, path, cfg, repr(e)[:100], flush=True)
    torch.cuda.synchronize()


def fp8_small(gen, nb):
    global NUM_BLOCKS
    saved, NUM_BLOCKS = NUM_BLOCKS, nb
    try:
        return fp8_cache(gen)
    finally:
        NUM_BLOCKS = saved


def extra_args(ap) -> None:
    ap.add_argument("--prewarm", type=int, default=0, help="compile in N processes first")
    ap.add_argument("--prewarm-only", action="store_true")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--extra", action="store_true",
                    help="also time before / flat view / 2x block stride")
    ap.add_argument("--heads", default=None, help="comma-separated head counts (default: the grid's)")
    ap.add_argument("--tokens", default=None, help="comma-separated token counts (default: the grid's)")
    ap.add_argument("--before", action="store_true",
                    help="also time SMLA_TREE_BEFORE's kernel file per cell (--extra includes it)")
    ap.add_argument("--emulate", default=None, metavar="MAJOR.MINOR",
                    help="the launch table of that GPU (e.g. 8.0, 8.9, 12.0) with the dots "
                         "compiled as mma.sync: a proxy of GPUs without wgmma on the H200")
    ap.add_argument("--sweep-bf16", default=None, metavar="H[,H]",
                    help="only the 16-bit kernel's tiles for these head counts, bf16 cache, at "
                         "--tokens (default 1024,4096); no engine cells")
    ap.add_argument("--sweep-fp8", default=None, metavar="H[,H]",
                    help="only the fp8 codes kernel's tiles for these head counts (<= 32), "
                         "both e4m3 paths, at --tokens (default 1024,4096); no engine cells")


def main() -> None:
    args = parse_args(__doc__, extra_args)
    out_dir = args.out_dir
    mod, before = kernel_modules("vllm/v1/attention/ops/triton_sparse_mla.py", "smla_attn")
    if args.emulate:
        emulate_capability(args.emulate, mod, before)
    heads, tokens = ([8, 32, 64], [1, 1024]) if args.quick else (HEADS, TOKENS)
    if args.heads:
        heads = [int(h) for h in args.heads.split(",")]
    if args.tokens:
        tokens = [int(t) for t in args.tokens.split(",")]
    bf16_heads = [int(h) for h in args.sweep_bf16.split(",")] if args.sweep_bf16 else None
    fp8_heads = [int(h) for h in args.sweep_fp8.split(",")] if args.sweep_fp8 else None
    if (bf16_heads or fp8_heads) and not args.tokens:
        tokens = [1024, 4096]
    sweep = (sweep_cells(bf16_heads, tokens, fp8_heads) if bf16_heads or fp8_heads
             else sweep_cells() if args.sweep else [])
    if bf16_heads or fp8_heads:
        heads = []
    if args.worker:
        prewarm_worker(mod, args.worker, heads, tokens, sweep, bool(bf16_heads or fp8_heads),
                       before if args.extra or args.before else None)
        return
    if args.prewarm:
        prewarm_workers(__file__, args.prewarm, sys.argv[1:])
        if args.prewarm_only:
            return
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
    rows = []
    for H in heads:
        for T in tokens:
            graph = T <= GRAPH_MAX_TOKENS
            ql, qpe = engine_query(T, H, gen)
            slots = torch.randint(0, NUM_BLOCKS * BS, (T, TOPK), generator=gen,
                                  device="cuda", dtype=torch.int32)
            fm_us = {}
            for cache, path in VARIANTS:
                kv = caches[cache]
                row_b = FP8_ROW if cache == "fp8_ds_mla" else 2 * (R + P)
                ours = Ours(mod, kv, T, H, cache, path)
                r = dict(heads=H, tokens=T, topk=TOPK, cache=cache, call="engine", graph=graph)
                if args.emulate:
                    r["emulate"] = args.emulate
                if path is not None:
                    r["path"] = path
                r["ours_us"] = bench(lambda: ours(ql, qpe, slots), graph)
                r["rel_err_vs_f64"] = check(ours(ql, qpe, slots), ql, qpe,
                                            kv.view(-1, kv.shape[-1]), slots, cache)
                if path is not None:
                    # the launch table's pick and the other fp8 kernel, same inputs
                    other, alt = other_fp8(mod, kv, T, H, path)
                    picked = "codes" if other == "dequant" else "dequant"
                    r["fp8_kernel"] = picked
                    r[f"{picked}_us"] = r["ours_us"]
                    r[f"{other}_us"] = bench(lambda: alt(ql, qpe, slots), graph)
                    r[f"{other}_rel_err_vs_f64"] = check(
                        alt(ql, qpe, slots), ql, qpe, kv.view(-1, kv.shape[-1]), slots, cache)
                    del alt
                if have_fm:
                    if cache not in fm_us:
                        fm = FlashMLA(kv, T, H, cache, ql, qpe, slots)
                        fm_us[cache] = bench(fm, graph)
                        del fm
                    r["flashmla_us"] = fm_us[cache]
                    r["ours_vs_flashmla"] = r["ours_us"] / r["flashmla_us"]
                if (args.extra or args.before) and before is not None:
                    old = Ours(before, kv, T, H, cache, path)
                    r["before_us"] = bench(lambda: old(ql, qpe, slots), graph)
                    r["before_rel_err_vs_f64"] = check(old(ql, qpe, slots), ql, qpe,
                                                       kv.view(-1, kv.shape[-1]), slots, cache)
                    del old
                if args.extra:
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
                ours = None  # free it before the next cell
            torch.cuda.empty_cache()
    for H, T in dict.fromkeys((c[0], c[1]) for c in sweep):
        graph = T <= GRAPH_MAX_TOKENS
        ql, qpe = engine_query(T, H, gen)
        slots = torch.randint(0, NUM_BLOCKS * BS, (T, TOPK), generator=gen,
                              device="cuda", dtype=torch.int32)
        for H_, T_, cache, path, cfg in sweep:
            if (H_, T_) != (H, T):
                continue
            kv = caches[cache]
            r = dict(call="sweep", heads=H, tokens=T, cache=cache, path=path, graph=graph,
                     **cfg)
            try:
                tuned = Ours(mod, kv, T, H, cache, path, dict(cfg))
                r["ours_us"] = bench(lambda: tuned(ql, qpe, slots), graph)
                r["rel_err_vs_f64"] = check(tuned(ql, qpe, slots), ql, qpe,
                                            kv.view(-1, kv.shape[-1]), slots, cache)
                tuned = None  # free the launch before the next config
            except Exception as e:  # noqa: BLE001 (a config that does not fit)
                r["error"] = repr(e)[:120]
            rows.append(r)
            print(json.dumps(r), flush=True)
        torch.cuda.empty_cache()
    res = dict(copy_tbps=bw, device=torch.cuda.get_device_name(0),
               torch=torch.__version__, triton=triton.__version__,
               command="python bench/bench_attention.py " + " ".join(
                   a for a in sys.argv[1:] if a != str(out_dir)), rows=rows)
    (out_dir / "attention.json").write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()

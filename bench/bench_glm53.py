#!/usr/bin/env python3
"""GLM-5.3-Flash (issue 36) in the engine's call form: ours vs upstream, same run.

Attention (NoPE sparse MLA: kv_lora_rank 512, qk_rope_head_dim 0, head 512, qk_nope 256, so
scale 256 ** -0.5), the call TRITON_MLA_SPARSE's _forward_mqa_kernel makes:
  sparse_mla_fwd(ql_nope, kv_rows, topk, scale, kv_lora_rank=512, out=, q_pe=, scratch=,
                 kv_cache_dtype=, rope_dtype=)
  ql_nope    torch.bmm's [H, T, 512] output transposed (strides (512, T * 512, 1))
  q_pe       [T, H, 0]: the empty rope slice of the [T, H, 256] query (never read)
  kv_rows    flat_kv_row_view of vLLM's block cache: [4096 blocks, 64, 512] bf16 (268 MB) or
             fp8_ds_mla [4096, 64, 656] uint8 (172 MB; the 128-byte rope space zero, as vLLM's
             writer leaves it for NoPE), both above the 60 MB L2
  topk       the pooled indexer's buffer, 2176 = round_up(2048 + 3, 128) columns: 512 pools
             expanded to 2048 token slots, the 3 tail tokens, -1 padding
  out/scratch one workspace buffer each
Upstream, same inputs: vLLM 0.26.0's FlashMLA (_flashmla_C) called as 0.33.0's
FLASHMLA_SPARSE serves GLM-5.3-Flash on sm90 (flashmla_sparse.py: get_supported_head_sizes
[576, 512]; q_head_size; forward_mqa's NoPE branch):
  bf16 cache  _bf16_flash_mla_kernel: sparse_prefill_fwd(q [T, 64, 512], kv [slots, 1, 512],
             idx [T, 1, 2176], scale, d_v 512) -- d_qk 512, the wheel's sm90
             fwd::KernelTemplate<512> (heads padded to 64, the padding copy left out of the
             time, in FlashMLA's favour)
  fp8_ds_mla  q_head_size = kv_lora_rank + 64 = 576 (q_pe zero-padded: q . 0 = 0), decode
             kernel _fp8_flash_mla_kernel: sparse_decode_fwd(q [T, 1, 64, 576], kv [blocks, 64,
             1, 656], idx [T, 1, 2176]): T one-token requests; below 32 heads the mixed
             batch, q [1, T, 64, 576] (_forward_fp8_kv_mixed_batch); scheduler metadata made
             once per shape, outside the time.  At >= 32 heads 0.33.0 serves prefill tokens
             by upconverting the gathered rows to bf16 first (not timed here): there every
             fp8 cell is timed as a decode batch of T requests.
Tokens <= 64: CUDA-graph replays (vLLM's decode), else eager do_bench medians (L2 flushed).
Error: both sides vs float64 on the first 4 tokens.

Pooled indexer (GLM-5.3-Flash's 16 index heads x 128, keys pooled 4:1 into 132-byte entries:
a page's 128-byte fp8 values, then its fp32 scales; pages of 64 and 32 pools, the kernel
block sizes 256 / 128 tokens), the decode call of sparse_attn_indexer_kpool (0.33.0 patch
0015): triton_dsa_indexer.paged_mqa_logits(q [B, 1, 16, 128] uint8 codes, kv [blocks, page, 1,
132], weights [B, 16] fp32, lens [B, 1] pool counts, block_table, max_pool_len 16384 (an
engine of max_model_len 65,536), clean_logits=False), on the fp8 tensor-core path (the sm89+
pick, ours_us) and the software decode path (what sm80/86 run, software_us); DeepGEMM
fp8_fp4_paged_mqa_logits of the same wheel on the same cache with the heads zero-padded to 32
as the model pads them for it (schedule made outside the time, as the metadata builder does).
Batch 1/16/64 x context 8k/64k tokens (ctx/4 pools).  The op is an eager break in 0.33.0's
breakable CUDA graph: eager medians (ours_us, deepgemm_us) and graph replays (*_graph_us).
Prefill: one chunk of 2,048 queries at the end of 64k tokens (16,384 pools, ke = (pos+1)//4),
mqa_logits vs fp8_fp4_mqa_logits (32 padded heads).  Logits error vs float64 per cell.

  python bench/bench_glm53.py OUT_DIR [--quick] [--prewarm N [--prewarm-only]]
         [--no-attention] [--no-indexer]
  python bench/bench_glm53.py OUT_DIR --cpu-smoke   (TRITON_INTERPRET=1, tiny shapes, ours
         only, float16 (the interpreter has no bf16 arithmetic), vs float64: glm53-cpu-smoke.json)
env: SMLA_TREE (a tree or the bundle's kern/: triton_sparse_mla.py, triton_dsa_indexer.py and
     their helpers), SMLA_FLASHMLA_SO, SMLA_DEEPGEMM_DIR (a folder holding deep_gemm/), and for
     --cpu-smoke a 0.33.0 tree with the series (kpool_compress.py: the queries are quantised by
     its fwht128_quant_fp8 through tests/gpu/test_kpool_indexer_gpu.py's loader)
Output: OUT_DIR/glm53.json {"copy_tbps", "device", "rows": [...]} (rows: "attention",
"indexer-decode", "indexer-prefill").
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

if "--cpu-smoke" in sys.argv:  # before triton is first imported
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "gpu"))
sys.path.insert(0, str(REPO / "bench"))

from fp8_ds_mla_reference import dequant_ds_mla  # noqa: E402
from sparse_mla_reference import load_tree_module, reference_sparse_mla, rel_err  # noqa: E402
from timing import copy_tbps, kernel_modules, parse_args, prewarm_workers  # noqa: E402
from timing import median_us as bench  # noqa: E402

R = 512  # kv_lora_rank = head size (NoPE)
QK_NOPE = 256
SCALE = QK_NOPE ** -0.5
FP8_ROW = 656  # fp8_ds_mla rows stay 656 B for NoPE
BS = 64  # attention block size
KPOOL, TOPK, ALIGN = 4, 2048, 128


def width(topk: int = TOPK) -> int:
    return -(-(topk + KPOOL - 1) // ALIGN) * ALIGN  # 2176 at top-k 2048


NUM_BLOCKS = 4096
HEADS = [64, 32, 16]  # GLM-5.3-Flash's 64; TP 2 / TP 4
TOKENS = [1, 64, 1024, 4096]
GRAPH_MAX_TOKENS = 64
CACHES = ("bfloat16", "fp8_ds_mla")
N_CHECK = 4

IH, ID = 16, 128  # index heads x dim
KEY_BYTES = ID + 4
MAX_MODEL_LEN = 65536
MAX_POOLS = MAX_MODEL_LEN // KPOOL
IDX_DECODE = [(B, ctx) for ctx in (8192, 65536) for B in (1, 16, 64)]
IDX_PAGES = (64, 32)
IDX_PREFILL = (65536, 2048)  # (context tokens, queries at its end)


# ---------------------------------------------------------------------------
# attention inputs (device-agnostic: the CPU smoke builds the same tensors small)
# ---------------------------------------------------------------------------

def engine_query(T: int, H: int, dtype, gen, device):
    """(ql_nope [T, H, 512] from a head-major bmm, q_pe [T, H, 0]) as MLAAttention hands them
    to forward_mqa for a NoPE model."""
    ql = (torch.randn((H, T, R), generator=gen, device=device) * 0.25).to(dtype)
    q = torch.randn((T, H, QK_NOPE), generator=gen, device=device).to(dtype)
    return ql.transpose(0, 1), q.split([QK_NOPE, 0], dim=-1)[1]


def kv_cache(cache: str, blocks: int, gen, device):
    """vLLM's block cache for a NoPE layer: [blocks, 64, 512] in the model dtype (cache
    "bfloat16" / "float16"), or fp8_ds_mla [blocks, 64, 656]: finite e4m3 codes, fp32 tile
    scales 2**-4..2**0, the rope space zero."""
    rows = blocks * BS
    if cache != "fp8_ds_mla":
        return torch.randn((rows, R), generator=gen, device=device).to(
            getattr(torch, cache)).view(blocks, BS, R)
    codes = torch.randint(0, 256, (rows, R), generator=gen, device=device, dtype=torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x3C  # no NaN codes
    scales = torch.exp2(-4 * torch.rand((rows, R // 128), generator=gen, device=device))
    rope = torch.zeros((rows, FP8_ROW - R - 16), dtype=torch.uint8, device=device)
    return torch.cat([codes, scales.view(torch.uint8).view(rows, -1), rope], dim=1).view(
        blocks, BS, FP8_ROW)


def flat_rows(kv: torch.Tensor) -> torch.Tensor:
    """flat_kv_row_view (vllm/v1/attention/backends/mla/sparse_utils.py) of a dense cache."""
    return kv.as_strided(((kv.shape[0] - 1) * (kv.stride(0) // kv.shape[-1]) + kv.shape[1],
                          kv.shape[-1]), (kv.shape[-1], 1))


def topk_buffer(T: int, n_slots: int, gen, device, topk: int = TOPK) -> torch.Tensor:
    """[T, width] int32: topk // 4 random pools expanded to their 4 token slots, the 3 tail
    tokens (the request's unfinished pool), -1 for the rest of the row."""
    slots = torch.full((T, width(topk)), -1, dtype=torch.int32, device=device)
    pools = torch.randint(0, n_slots // KPOOL, (T, topk // KPOOL), generator=gen, device=device,
                          dtype=torch.int32)
    slots[:, :topk] = (pools[..., None] * KPOOL
                       + torch.arange(KPOOL, dtype=torch.int32, device=device)).view(T, -1)
    slots[:, topk:topk + KPOOL - 1] = torch.randint(0, n_slots, (T, KPOOL - 1), generator=gen,
                                                    device=device, dtype=torch.int32)
    return slots


class Ours:
    """TRITON_MLA_SPARSE's call (out and split-K scratch from the workspace)."""

    def __init__(self, mod, kv, T, H, cache, dtype, K):
        self.mod, self.rows = mod, flat_rows(kv)
        self.dt = "fp8_ds_mla" if cache == "fp8_ds_mla" else "auto"
        n = mod.sparse_mla_scratch_numel(T, H, K, dtype, kv.device, R, kv_cache_dtype=self.dt)
        self.out = torch.empty((T, H, R), dtype=dtype, device=kv.device)
        self.scratch = torch.empty(max(1, n), dtype=torch.float32, device=kv.device)
        self.splits_scratch = n

    def __call__(self, ql, qpe, slots):
        return self.mod.sparse_mla_fwd(
            ql, self.rows, slots, SCALE, kv_lora_rank=R, out=self.out, q_pe=qpe,
            scratch=self.scratch, kv_cache_dtype=self.dt,
            rope_dtype=torch.bfloat16 if self.dt == "fp8_ds_mla" else None)


class FlashMLA:
    """vLLM 0.26.0's FlashMLA ops as 0.33.0's FLASHMLA_SPARSE calls them for NoPE on sm90."""

    def __init__(self, kv, T, H, cache, ql, slots):
        self.ops = torch.ops._flashmla_C
        self.H, self.cache = H, cache
        self.hp = hp = 64 if H <= 64 else 128
        if cache == "fp8_ds_mla":
            # below MIN_HEADS_FOR_BF16_PREFILL (32) heads the mixed batch: every token one query
            # row of one batch entry, [1, T, ..]; else the decode path: T one-token requests
            b, s_q = (1, T) if H < 32 else (T, 1)
            self.shape = f"[{b}, {s_q}, {hp}, 576]"
            q = torch.zeros((T, hp, R + 64), dtype=torch.bfloat16, device="cuda")
            q[:, :H, :R] = ql  # q_pe zero-padded to the 576 layout
            self.q, self.kv = q.view(b, s_q, hp, R + 64), kv.view(torch.uint8).unsqueeze(-2)
            self.idx = slots.view(b, s_q, -1)  # kv: [blocks, 64, 1, 656]
            out = self.ops.sparse_decode_fwd(self.q, self.kv, self.idx, None, None, None, None,
                                             None, None, None, R, SCALE, None)
            self.sched, self.nsplit = out[2], out[3]
            self.out = torch.empty_like(out[0])
        else:
            q = torch.zeros((T, hp, R), dtype=torch.bfloat16, device="cuda")
            q[:, :H] = ql
            self.q, self.kv = q, kv.view(-1, 1, R)  # d_qk 512
            self.shape = f"[{T}, {hp}, 512]"
            self.idx = slots.view(T, 1, -1)
            self.out = torch.empty((T, hp, R), dtype=torch.bfloat16, device="cuda")

    def __call__(self):
        if self.cache == "fp8_ds_mla":
            return self.ops.sparse_decode_fwd(self.q, self.kv, self.idx, None, None, self.sched,
                                              self.nsplit, None, None, None, R, SCALE,
                                              self.out)[0]
        return self.ops.sparse_prefill_fwd(self.q, self.kv, self.idx, SCALE, R, None, None,
                                           self.out)[0]

    def result(self):
        return self().reshape(-1, self.hp, R)[:, : self.H]  # [T, H, 512]


def attention_err(out, ql, kv, slots, cache, n=N_CHECK) -> float:
    """rel. error of out[:n] vs float64 over the rows the n tokens gather."""
    n = min(n, out.shape[0])
    rows = flat_rows(kv)
    sl = slots[:n]
    picked = rows[sl.clamp(min=0).long().reshape(-1)]
    if cache == "fp8_ds_mla":
        picked = dequant_ds_mla(picked, torch.bfloat16)[:, :R]
    local = torch.arange(picked.shape[0], device=picked.device, dtype=torch.int32).view(n, -1)
    local = torch.where(sl >= 0, local, -1)
    ref = reference_sparse_mla(ql[:n], picked, local, SCALE, R, token_chunk=1)
    return rel_err(out[:n], ref)


# ---------------------------------------------------------------------------
# pooled indexer inputs
# ---------------------------------------------------------------------------

def pooled_cache(pools: list[int], page: int, gen, device):
    """(kv [blocks, page, 132] uint8 in the kpool page layout, block table [B, max_blocks]
    int32, shuffled): finite e4m3 codes, scales 2**-6..2**0."""
    per = max(-(-n // page) for n in pools)
    nb = len(pools) * per + 1
    kv = torch.empty((nb, page, KEY_BYTES), dtype=torch.uint8, device=device)
    flat = kv.view(nb, -1)
    codes = torch.randint(0, 256, (nb, page * ID), generator=gen, device=device,
                          dtype=torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x38
    flat[:, : page * ID] = codes
    flat[:, page * ID:] = torch.exp2(-6 * torch.rand((nb, page), generator=gen, device=device)
                                     ).view(torch.uint8).view(nb, -1)
    bt = torch.randperm(nb, generator=gen, device=device)[: len(pools) * per]
    return kv, bt.view(len(pools), per).to(torch.int32)


def cache_views(kv):
    page = kv.shape[1]
    flat = kv.view(kv.shape[0], -1)
    return flat[:, : page * ID].view(-1, page, ID), flat[:, page * ID:].view(torch.float32)


def index_query(rows: int, gen, device, quant=None):
    """(q codes uint8 [rows, 16, 128], weights fp32 [rows, 16]).  quant: kpool_compress's
    fwht128_quant_fp8 (the model's rotate + quantise; its scale folded into the weights)."""
    w = torch.randn((rows, IH), generator=gen, device=device) * (ID ** -0.5 * IH ** -0.5)
    if quant is not None:
        q = torch.randn((rows * IH, ID), generator=gen, device=device).to(torch.bfloat16)
        q_fp8, q_scale = quant(q)
        return q_fp8.view(torch.uint8).view(rows, IH, ID), w * q_scale.view(rows, IH).float()
    q = torch.randint(0, 256, (rows, IH, ID), generator=gen, device=device, dtype=torch.uint8)
    q[(q & 0x7F) == 0x7F] = 0x38
    return q, w


def e4m3(codes: torch.Tensor) -> torch.Tensor:
    return codes.view(torch.float8_e4m3fn).to(torch.float64)


def ref_paged(q, kv, w, lens, bt, rows=None):
    """float64 logits [rows, max(lens)] (-inf past each row's pools)."""
    codes, scales = cache_views(kv)
    page = kv.shape[1]
    lens = lens.reshape(-1).long().tolist()
    rows = range(len(lens)) if rows is None else rows
    out = torch.full((len(rows), max(lens)), float("-inf"), dtype=torch.float64,
                     device=kv.device)
    for i, r in enumerate(rows):
        n = lens[r]
        j = torch.arange(n, device=kv.device)
        phys = bt[r, j // page].long()
        s = (e4m3(q[r]) @ e4m3(codes[phys, j % page]).T).clamp(min=0)
        out[i, :n] = (w[r].double()[:, None] * s).sum(0) * scales[phys, j % page].double()
    return out


def logits_err(out, ref, rows=None) -> float:
    out = out.double() if rows is None else out[list(rows)].double()
    m = torch.isfinite(ref)
    return float((out[:, : ref.shape[1]][m] - ref[m]).abs().max() / ref[m].abs().max())


class DeepGemm:
    """DeepGEMM of vLLM 0.26.0's wheel, as sparse_attn_indexer_kpool calls it: 16 heads
    zero-padded to 32 (Indexer._pad_indexer_heads), weights with them; 64 where that DeepGEMM
    refuses 32 (recorded as deepgemm_heads)."""

    def __init__(self, mod):
        self.m = mod
        self.sms = torch.cuda.get_device_properties(0).multi_processor_count

    @staticmethod
    def pad(q_codes, w, heads):
        z = heads - q_codes.shape[-2]
        q = torch.cat([q_codes, q_codes.new_zeros(*q_codes.shape[:-2], z, ID)], dim=-2)
        return q.view(torch.float8_e4m3fn), torch.cat([w, w.new_zeros(w.shape[0], z)], dim=-1)

    def paged_call(self, q, kv, w, lens2d, bt, max_pools, heads=32):
        q32, w32 = self.pad(q, w, heads)
        q32 = q32.view(q.shape[0], 1, heads, ID)
        kv4 = kv.unsqueeze(-2)
        sched = self.m.get_paged_mqa_logits_metadata(lens2d, kv.shape[1], self.sms)

        def call():
            return self.m.fp8_fp4_paged_mqa_logits((q32, None), kv4, w32, lens2d, bt, sched,
                                                   max_pools, clean_logits=False)
        return call

    def prefill_call(self, q, k_codes, k_scale, w, ks, ke, heads=32):
        q32, w32 = self.pad(q, w, heads)
        k = (k_codes.view(torch.float8_e4m3fn), k_scale)
        return lambda: self.m.fp8_fp4_mqa_logits((q32, None), k, w32, ks, ke, clean_logits=False)

    @staticmethod
    def first_working(make, r):
        """make(heads) -> call; the call at 32 heads, else at 64 (r["deepgemm_heads"]); the
        first failure is kept in r["deepgemm_error_32"]."""
        for heads in (32, 64):
            try:
                fn = make(heads)
                fn()
                torch.cuda.synchronize()
                r["deepgemm_heads"] = heads
                return fn
            except Exception as e:  # noqa: BLE001
                r[f"deepgemm_error_{heads}"] = repr(e)[:300]
        return None


def load_deepgemm():
    d = os.environ.get("SMLA_DEEPGEMM_DIR")
    if not d or not (Path(d) / "deep_gemm" / "__init__.py").is_file():
        return None
    sys.path.insert(0, d)
    import deep_gemm

    return DeepGemm(deep_gemm)


def prefill_inputs(ctx: int, M: int, gen, device, quant=None):
    """One request's pools gathered contiguous (the prefill chunk's k), queries at positions
    ctx - M .. ctx - 1 over the complete pools before them."""
    n = ctx // KPOOL
    k = torch.randint(0, 256, (n, ID), generator=gen, device=device, dtype=torch.uint8)
    k[(k & 0x7F) == 0x7F] = 0x38
    k_scale = torch.exp2(-6 * torch.rand((n,), generator=gen, device=device))
    q, w = index_query(M, gen, device, quant)
    ks = torch.zeros((M,), dtype=torch.int32, device=device)
    ke = ((torch.arange(ctx - M, ctx, device=device) + 1) // KPOOL).to(torch.int32)
    return q, k, k_scale, w, ks, ke


def ref_prefill(q, k, k_scale, w, ks, ke, rows):
    out = []
    for r in rows:
        s = (e4m3(q[r]) @ e4m3(k[: int(ke[r])]).T).clamp(min=0)
        row = torch.full((k.shape[0],), float("-inf"), dtype=torch.float64, device=k.device)
        row[: int(ke[r])] = (w[r].double()[:, None] * s).sum(0) * k_scale[: int(ke[r])].double()
        out.append(row)
    return torch.stack(out)


# ---------------------------------------------------------------------------
# GPU benchmark
# ---------------------------------------------------------------------------

def attention_cells(heads, tokens):
    return [(H, T, c) for H in heads for T in tokens for c in CACHES]


def prewarm_worker(mod, which: str, heads, tokens) -> None:
    """Compile the grid's launches on a small cache (Triton's disk cache serves the timed
    process): cells i::n."""
    i, n = map(int, which.split("/"))
    gen = torch.Generator(device="cuda").manual_seed(i)
    small = {c: kv_cache(c, 64, gen, "cuda") for c in CACHES}
    for H, T, cache in attention_cells(heads, tokens)[i::n]:
        ql, qpe = engine_query(T, H, torch.bfloat16, gen, "cuda")
        Ours(mod, small[cache], T, H, cache, torch.bfloat16, width())(
            ql, qpe, topk_buffer(T, 64 * BS, gen, "cuda"))
    torch.cuda.synchronize()


class Grid:
    """Sizes and device of a run: the H200 benchmark, or the CPU smoke (tiny, one untimed call
    per side: timer returns 0)."""

    def __init__(self, device="cuda", blocks=NUM_BLOCKS, topk=TOPK, dtype=torch.bfloat16,
                 caches=CACHES, max_pools=MAX_POOLS, prefill=IDX_PREFILL, timer=bench,
                 quant=None):
        self.device, self.blocks, self.topk, self.dtype, self.caches = (device, blocks, topk,
                                                                        dtype, caches)
        self.max_pools, self.prefill, self.timer, self.quant = max_pools, prefill, timer, quant


def run_attention(mod, heads, tokens, emit, bw, g: Grid | None = None) -> None:
    g = g or Grid()
    have_fm = bool(os.environ.get("SMLA_FLASHMLA_SO")) and g.device == "cuda"
    if have_fm:
        torch.ops.load_library(os.environ["SMLA_FLASHMLA_SO"])
    gen = torch.Generator(device=g.device).manual_seed(0)
    caches = {c: kv_cache(c, g.blocks, gen, g.device) for c in g.caches}
    K = width(g.topk)
    for H in heads:
        for T in tokens:
            graph = T <= GRAPH_MAX_TOKENS and g.device == "cuda"
            ql, qpe = engine_query(T, H, g.dtype, gen, g.device)
            slots = topk_buffer(T, g.blocks * BS, gen, g.device, g.topk)
            for cache in g.caches:
                kv = caches[cache]
                ours = Ours(mod, kv, T, H, cache, g.dtype, K)
                r = dict(call="attention", heads=H, tokens=T, topk_width=K, cache=cache,
                         graph=graph, splits_scratch=ours.splits_scratch)
                try:
                    r["ours_us"] = g.timer(lambda: ours(ql, qpe, slots), graph)
                    out = ours(ql, qpe, slots)
                    r["in_place"] = out is ours.out
                    r["rel_err_vs_f64"] = attention_err(out, ql, kv, slots, cache)
                except Exception as e:  # noqa: BLE001 (recorded, the run goes on)
                    r["error"] = repr(e)[:300]
                if have_fm:
                    try:
                        fm = FlashMLA(kv, T, H, cache, ql, slots)
                        r["flashmla_call"] = ("sparse_decode_fwd q " if cache == "fp8_ds_mla"
                                              else "sparse_prefill_fwd q ") + fm.shape
                        r["flashmla_us"] = g.timer(fm, graph)
                        r["flashmla_rel_err_vs_f64"] = attention_err(fm.result(), ql, kv, slots,
                                                                     cache)
                        if "ours_us" in r:
                            r["ours_vs_flashmla"] = r["ours_us"] / r["flashmla_us"]
                        fm = None
                    except Exception as e:  # noqa: BLE001
                        r["flashmla_error"] = repr(e)[:300]
                row_b = FP8_ROW if cache == "fp8_ds_mla" else 2 * R
                nbytes = T * (g.topk + KPOOL - 1) * row_b + 2 * T * H * R * 2
                if r.get("ours_us"):
                    r["pct_copy_bw"] = 100 * nbytes / (r["ours_us"] * 1e-6) / (bw * 1e12)
                emit(r)
                ours = None
            if g.device == "cuda":
                torch.cuda.empty_cache()


def run_indexer(idx, decode, pages, emit, bw, g: Grid | None = None) -> None:
    g = g or Grid()
    dev = g.device
    dg = load_deepgemm() if dev == "cuda" else None
    gen = torch.Generator(device=dev).manual_seed(1)
    for page in pages:
        for B, ctx in decode:
            pools = [ctx // KPOOL] * B
            kv, bt = pooled_cache(pools, page, gen, dev)
            q, w = index_query(B, gen, dev, g.quant)
            lens2d = torch.tensor(pools, dtype=torch.int32, device=dev).view(B, 1)
            q4, kv4 = q.view(B, 1, IH, ID), kv.unsqueeze(-2)
            check_rows = range(min(B, 2))
            ref = ref_paged(q, kv, w, lens2d, bt, check_rows)
            nbytes = sum(pools) * KEY_BYTES + B * (IH * ID + 4 * g.max_pools)
            r = dict(call="indexer-decode", heads=IH, page_pools=page, batch=B, context=ctx,
                     pools=sum(pools), max_pool_len=g.max_pools)
            # ours: the engine's call (fp8_mma None: the tensor-core path on sm89+);
            # software: the sm80/86 decode forced
            for name, mma in (("ours", None), ("software", False)):
                def fn(mma=mma):
                    return idx.paged_mqa_logits(q4, kv4, w, lens2d, bt, g.max_pools,
                                                clean_logits=False, fp8_mma=mma)
                try:
                    r[f"{name}_us"] = g.timer(fn)
                    if dev == "cuda":
                        r[f"{name}_graph_us"] = g.timer(fn, graph=True)
                    r[f"{name}_rel_err_vs_f64"] = logits_err(fn(), ref, check_rows)
                except Exception as e:  # noqa: BLE001
                    r[f"{name}_error"] = repr(e)[:300]
            fn = None if dg is None else dg.first_working(
                lambda h: dg.paged_call(q, kv, w, lens2d, bt, g.max_pools, h), r)
            if fn is not None:
                try:
                    r["deepgemm_us"] = g.timer(fn)
                    r["deepgemm_graph_us"] = g.timer(fn, graph=True)
                    r["deepgemm_rel_err_vs_f64"] = logits_err(fn(), ref, check_rows)
                    if "ours_us" in r:
                        r["ours_vs_deepgemm"] = r["ours_us"] / r["deepgemm_us"]
                    if "ours_graph_us" in r:
                        r["ours_vs_deepgemm_graph"] = r["ours_graph_us"] / r["deepgemm_graph_us"]
                except Exception as e:  # noqa: BLE001
                    r["deepgemm_error"] = repr(e)[:300]
            if r.get("ours_us"):
                r["pct_copy_bw"] = 100 * nbytes / (r["ours_us"] * 1e-6) / (bw * 1e12)
            emit(r)
            kv = bt = fn = None  # freed before the next cell
            if dev == "cuda":
                torch.cuda.empty_cache()
    ctx, M = g.prefill
    q, k, k_scale, w, ks, ke = prefill_inputs(ctx, M, gen, dev, g.quant)
    rows = sorted({0, M // 2, M - 1})
    ref = ref_prefill(q, k, k_scale, w, ks, ke, rows)
    r = dict(call="indexer-prefill", heads=IH, queries=M, context=ctx, pools=k.shape[0])
    # the engine passes the float8 query (q_slice_cast); the interpreter takes the codes
    q_arg = q.view(torch.float8_e4m3fn) if dev == "cuda" else q
    for name, mma in (("ours", None), ("software", False)):
        def fn(mma=mma):
            return idx.mqa_logits(q_arg, k, k_scale, w, ks, ke, clean_logits=False, fp8_mma=mma)
        try:
            r[f"{name}_us"] = g.timer(fn)
            r[f"{name}_rel_err_vs_f64"] = logits_err(fn(), ref, rows)
        except Exception as e:  # noqa: BLE001
            r[f"{name}_error"] = repr(e)[:300]
    fn = None if dg is None else dg.first_working(
        lambda h: dg.prefill_call(q, k, k_scale, w, ks, ke, h), r)
    if fn is not None:
        try:
            r["deepgemm_us"] = g.timer(fn)
            r["deepgemm_rel_err_vs_f64"] = logits_err(fn(), ref, rows)
            if "ours_us" in r:
                r["ours_vs_deepgemm"] = r["ours_us"] / r["deepgemm_us"]
        except Exception as e:  # noqa: BLE001
            r["deepgemm_error"] = repr(e)[:300]
    emit(r)


# ---------------------------------------------------------------------------
# CPU smoke (TRITON_INTERPRET=1)
# ---------------------------------------------------------------------------

SMOKE_BOUND = 2e-3
SMOKE_LOGITS_BOUND = 1e-5  # software fp8 products in fp32 vs float64


def cpu_smoke(out_dir: Path) -> int:
    """The benchmark's own cell code (run_attention, run_indexer) on tiny CPU shapes under the
    interpreter, each call once and untimed, ours only, against float64; the indexer's queries
    quantised by kpool_compress's fwht128_quant_fp8, loaded as tests/gpu/test_kpool_indexer_gpu.py
    loads it on the GPU machine (its stand-ins for vLLM's helpers)."""
    from test_kpool_indexer_gpu import load_kpool_modules

    tree = Path(os.environ.get("SMLA_TREE") or REPO / "work" / "0.33.0" / "vllm")
    mod = load_tree_module(tree, "vllm/v1/attention/ops/triton_sparse_mla.py", "smla_glm53",
                           interpret=True)
    kc, idx = load_kpool_modules(tree)
    rows = []
    g = Grid(device="cpu", blocks=4, topk=64, dtype=torch.float16,
             caches=("float16", "fp8_ds_mla"), max_pools=128, prefill=(256, 8),
             timer=lambda fn, graph=False: (fn(), 0.0)[1], quant=kc.fwht128_quant_fp8)
    run_attention(mod, [16], [2], rows.append, 1.0, g)
    run_indexer(idx, [(2, 280)], IDX_PAGES, rows.append, 1.0, g)
    bad = 0
    for r in rows:
        print(json.dumps(r), flush=True)
        if r["call"] == "attention":
            bad += not (r.get("in_place") and r.get("rel_err_vs_f64", 1) < SMOKE_BOUND)
        else:
            bad += not all(r.get(f"{n}_rel_err_vs_f64", 1) < SMOKE_LOGITS_BOUND
                           for n in ("ours", "software"))
    (out_dir / "glm53-cpu-smoke.json").write_text(json.dumps(dict(rows=rows), indent=1) + "\n")
    return 1 if bad else 0


def extra_args(ap) -> None:
    ap.add_argument("--cpu-smoke", action="store_true", help="TRITON_INTERPRET=1, tiny shapes")
    ap.add_argument("--prewarm", type=int, default=0, help="compile in N processes first")
    ap.add_argument("--prewarm-only", action="store_true")
    ap.add_argument("--worker", default=None, help="(internal) prewarm cells i/n")
    ap.add_argument("--no-attention", action="store_true")
    ap.add_argument("--no-indexer", action="store_true")


def main() -> None:
    args = parse_args(__doc__, extra_args)
    if args.cpu_smoke:
        sys.exit(cpu_smoke(args.out_dir))
    heads, tokens = ([64], [1, 1024]) if args.quick else (HEADS, TOKENS)
    mod, _ = kernel_modules("vllm/v1/attention/ops/triton_sparse_mla.py", "smla_attn")
    if args.worker:
        prewarm_worker(mod, args.worker, heads, tokens)
        return
    if args.prewarm:
        prewarm_workers(__file__, args.prewarm, sys.argv[1:])
        if args.prewarm_only:
            return
    bw = copy_tbps()
    print(f"copy {bw:.2f} TB/s  device {torch.cuda.get_device_name(0)}", flush=True)
    rows = []

    def emit(r):
        rows.append(r)
        print(json.dumps(r), flush=True)

    def save():
        res = dict(copy_tbps=bw, device=torch.cuda.get_device_name(0), torch=torch.__version__,
                   triton=triton.__version__,
                   command="python bench/bench_glm53.py " + " ".join(
                       a for a in sys.argv[1:] if a != str(args.out_dir)), rows=rows)
        (args.out_dir / "glm53.json").write_text(json.dumps(res, indent=1) + "\n")

    if not args.no_indexer:  # first: short, and its figures come back even if attention runs out
        idx, _ = kernel_modules("vllm/v1/attention/ops/triton_dsa_indexer.py", "smla_idx")
        decode = IDX_DECODE[:2] if args.quick else IDX_DECODE
        run_indexer(idx, decode, IDX_PAGES[:1] if args.quick else IDX_PAGES, emit, bw)
        save()
    if not args.no_attention:
        run_attention(mod, heads, tokens, lambda r: (emit(r), save()), bw)
    save()


if __name__ == "__main__":
    main()

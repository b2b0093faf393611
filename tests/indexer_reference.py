"""Test helpers for the Triton DSA-indexer kernels (issue 12).

- `load_indexer_module(tree, interpret)` loads
  vllm/v1/attention/ops/triton_dsa_indexer.py from a vLLM tree by file path
  (no `import vllm`); a tree without it fails the test with a clear message.
- float64 / plain-PyTorch references, written from the semantics of
  DeepGEMM's `fp8_fp4_mqa_logits` / `fp8_fp4_paged_mqa_logits` and of vLLM
  0.26.0's `indexer_k_quant_and_cache` cache layout:
    logits[t, n] = k_scale[n] * sum_h w[t, h] * relu(q[t, h] . k[n])
  on the raw fp8 codes (the query scale is folded into w by the caller).
- `ref_indexer_k_quant_and_cache` is a PyTorch writer of that cache layout
  (the GPU test checks it against vLLM's own compiled op when available).
- `ref_dsa_attention` is plain-PyTorch DSA attention (indexer -> top-k ->
  sparse MLA over the selected latent rows) for the toy block test.
"""
from __future__ import annotations

from pathlib import Path

import torch

from sparse_mla_reference import load_tree_module

MODULE_REL = "vllm/v1/attention/ops/triton_dsa_indexer.py"
FP8_MAX = 448.0


def load_indexer_module(tree: Path, interpret: bool = False):
    """The indexer kernel module (see sparse_mla_reference.load_tree_module)."""
    return load_tree_module(tree, MODULE_REL, "smla_triton_dsa_indexer", interpret,
                            missing="the indexer patch (Triton indexer kernels) is not applied there")


# ---------------------------------------------------------------------------
# fp8 helpers
# ---------------------------------------------------------------------------

def fp8_values(codes: torch.Tensor) -> torch.Tensor:
    """float64 values of e4m3fn codes (uint8 or float8_e4m3fn) via torch."""
    if codes.dtype == torch.uint8:
        codes = codes.view(torch.float8_e4m3fn)
    return codes.to(torch.float32).to(torch.float64)


def to_fp8(x: torch.Tensor) -> torch.Tensor:
    """Saturating round-to-nearest-even to e4m3fn (what __NV_SATFINITE does)."""
    return x.float().clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def ue8m0(scale: torch.Tensor) -> torch.Tensor:
    return torch.exp2(torch.ceil(torch.log2(scale)))


def quant_q(q: torch.Tensor, weights: torch.Tensor, softmax_scale: float, head_scale: float):
    """Per-(token, head) ue8m0 quantisation of the indexer query, the way
    vLLM's unfused Indexer path does it (per_token_group_quant_fp8 with one
    128-group per head, eps 1e-10): returns (q_fp8 [T,H,D], weights fp32 with
    q_scale * softmax_scale * head_scale folded in)."""
    amax = q.float().abs().amax(dim=-1).clamp(min=1e-10)
    scale = ue8m0(amax / FP8_MAX)
    q_fp8 = to_fp8(q.float() / scale[..., None])
    w = weights.float() * scale * softmax_scale * head_scale
    return q_fp8, w


def quant_k(k: torch.Tensor):
    """Per-token ue8m0 quantisation of the indexer key as
    indexer_k_quant_and_cache does it (amax floor 1e-4): (k_fp8 [N,D], scale fp32 [N])."""
    amax = k.float().abs().amax(dim=-1).clamp(min=1e-4)
    scale = ue8m0(amax / FP8_MAX)
    return to_fp8(k.float() / scale[:, None]), scale.float()


def ref_indexer_k_quant_and_cache(k: torch.Tensor, kv_cache: torch.Tensor,
                                  slot_mapping: torch.Tensor) -> None:
    """PyTorch writer of the indexer cache (uint8 [num_blocks, block_size, D+4]):
    block b holds block_size*D fp8 codes (slot o at byte o*D) followed by
    block_size fp32 scales (slot o at byte block_size*D + 4*o). slot < 0 skipped."""
    nb, bs, width = kv_cache.shape
    D = width - 4
    k_fp8, scale = quant_k(k)
    keep = slot_mapping >= 0
    slot = slot_mapping[keep].long()
    if slot.numel() == 0:
        return
    blk, off = slot // bs, slot % bs
    flat = kv_cache.view(-1)  # block stride = bs * width bytes (dense cache)
    base = blk * (bs * width)
    d = torch.arange(D, device=kv_cache.device)
    flat[(base + off * D)[:, None] + d[None, :]] = k_fp8[keep].view(torch.uint8)
    b4 = torch.arange(4, device=kv_cache.device)
    flat[(base + bs * D + 4 * off)[:, None] + b4[None, :]] = (
        scale[keep].contiguous().view(torch.uint8).view(-1, 4))


def read_paged_cache(kv_cache: torch.Tensor):
    """(codes uint8 [nb, bs, D], scales fp32 [nb, bs]) views of the packed cache."""
    nb, bs, width = kv_cache.shape[0], kv_cache.shape[1], kv_cache.shape[-1]
    D = width - 4
    flat = kv_cache.reshape(nb, bs * width)
    codes = flat[:, : bs * D].reshape(nb, bs, D)
    scales = flat[:, bs * D:].contiguous().view(torch.float32).reshape(nb, bs)
    return codes, scales


# ---------------------------------------------------------------------------
# logits references (float64)
# ---------------------------------------------------------------------------

def ref_mqa_logits(q_fp8, k_fp8, k_scale, weights, ks, ke) -> torch.Tensor:
    """float64 [M, N]; -inf outside [ks[m], ke[m])."""
    q = fp8_values(q_fp8)  # [M,H,D]
    k = fp8_values(k_fp8)  # [N,D]
    s = torch.einsum("mhd,nd->mhn", q, k).clamp(min=0)
    logits = torch.einsum("mhn,mh->mn", s, weights.double()) * k_scale.double().reshape(1, -1)
    n = torch.arange(k.shape[0], device=q.device)
    inside = (n[None, :] >= ks.long()[:, None]) & (n[None, :] < ke.long()[:, None])
    return logits.masked_fill(~inside, float("-inf"))


def row_lengths(context_lens: torch.Tensor, next_n: int) -> torch.Tensor:
    """Per-row key counts [B*next_n]: 2-D lens as given, 1-D lens causal."""
    if context_lens.dim() == 2:
        return context_lens.reshape(-1).long()
    i = torch.arange(next_n, device=context_lens.device)
    return (context_lens.long()[:, None] - next_n + i[None, :] + 1).reshape(-1)


def ref_paged_mqa_logits(q_fp8, kv_cache, weights, context_lens, block_tables,
                         max_model_len: int) -> torch.Tensor:
    """float64 [B*next_n, max_model_len]; row (b, i) over keys [0, L) with L
    from `row_lengths`; -inf elsewhere."""
    B, next_n, H, D = q_fp8.shape
    codes, scales = read_paged_cache(kv_cache)
    bs = codes.shape[1]
    lens = row_lengths(context_lens, next_n)
    out = torch.full((B * next_n, max_model_len), float("-inf"), dtype=torch.float64,
                     device=q_fp8.device)
    for b in range(B):
        L_max = int(lens[b * next_n:(b + 1) * next_n].max())
        if L_max <= 0:
            continue
        pos = torch.arange(L_max, device=q_fp8.device)
        phys = block_tables[b, pos // bs].long()
        k = fp8_values(codes[phys, pos % bs])  # [L, D]
        sc = scales[phys, pos % bs].double()
        for i in range(next_n):
            r = b * next_n + i
            L = int(lens[r])
            if L <= 0:
                continue
            q = fp8_values(q_fp8[b, i])  # [H, D]
            s = (q @ k[:L].T).clamp(min=0)  # [H, L]
            out[r, :L] = (weights[r].double()[:, None] * s).sum(0) * sc[:L]
    return out


# ---------------------------------------------------------------------------
# top-k and DSA attention references
# ---------------------------------------------------------------------------

def topk_rows(logits: torch.Tensor, k: int) -> torch.Tensor:
    """int32 [M, k] indices of the k largest finite logits per row, -1 padded
    (ties broken by torch.topk; callers compare sets)."""
    M, N = logits.shape
    kk = min(k, N)
    vals, idx = torch.topk(logits, kk, dim=-1)
    idx = torch.where(torch.isfinite(vals), idx, torch.full_like(idx, -1)).to(torch.int32)
    if kk < k:
        idx = torch.cat([idx, torch.full((M, k - kk), -1, dtype=torch.int32, device=idx.device)], 1)
    return idx


def set_overlap(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per row |A ∩ B| / max(|A|, |B|) over the non-negative entries (1.0 if both empty)."""
    res = []
    for ra, rb in zip(a.tolist(), b.tolist()):
        sa, sb = {x for x in ra if x >= 0}, {x for x in rb if x >= 0}
        den = max(len(sa), len(sb))
        res.append(1.0 if den == 0 else len(sa & sb) / den)
    return torch.tensor(res, dtype=torch.float64)


def ref_dsa_attention(q_lat: torch.Tensor, kv_rows: torch.Tensor, topk_pos: torch.Tensor,
                      sm_scale: float, kv_lora_rank: int = 512) -> torch.Tensor:
    """Plain DSA attention (float64): token t, head h attends to the latent
    rows kv_rows[p] for p in its top-k list (p >= 0): softmax(sm_scale * q.k)
    weighted sum of the first kv_lora_rank dims; zeros for an empty list."""
    T, H, _ = q_lat.shape
    out = torch.zeros((T, H, kv_lora_rank), dtype=torch.float64, device=q_lat.device)
    for t in range(T):
        sel = topk_pos[t][topk_pos[t] >= 0].long()
        if sel.numel() == 0:
            continue
        kv = kv_rows[sel].double()  # [K, 576]
        s = (q_lat[t].double() @ kv.T) * sm_scale  # [H, K]
        out[t] = torch.softmax(s, dim=-1) @ kv[:, :kv_lora_rank]
    return out


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref| over finite reference entries."""
    m = torch.isfinite(ref)
    if not m.any():
        return 0.0
    d = (out.double()[m] - ref.double()[m]).abs().max()
    return float(d / ref.double()[m].abs().max().clamp(min=1e-30))


# ---------------------------------------------------------------------------
# compile-only check per arch (CPU; Triton ships ptxas)
# ---------------------------------------------------------------------------

# Opt-in shared memory per block (bytes) by compute capability.
SMEM_LIMIT = {80: 166912, 86: 101376, 89: 101376, 90: 232448, 100: 232448,
              120: 101376, 121: 101376}


ALIGNED_STRIDES = {"stride_qm", "stride_qh", "stride_kn", "stride_wm", "stride_qb", "stride_qn",
                   "stride_kvb"}


def compile_report(tree: Path, arch: int, configs: list[dict] | None = None) -> list[dict]:
    """Compile the logits kernels for `arch` with the wrappers' default launch
    configs (or `configs`); one dict per kernel with its static shared memory.
    Must run in a process without TRITON_INTERPRET."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    mod = load_indexer_module(tree, interpret=False)
    target = GPUTarget("cuda", arch, 32)
    if configs is None:
        # The wrappers' launch configs, for each path this arch can run: the
        # software decode everywhere, fp8 tensor-core dots on sm89 and newer.
        configs = []
        for mma in (False, True) if arch >= 89 else (False,):
            configs.append(dict(kernel="prefill", FP8_MMA=mma, NEXT_N=1, **mod._PREFILL_CFG))
            for next_n in (1, 2):
                configs.append(dict(kernel="decode", FP8_MMA=mma, NEXT_N=next_n,
                                    **mod._DECODE_CFG))
    ptr_types = {"q_ptr": "u8", "k_ptr": "u8", "kv_ptr": "u8", "k_scale_ptr": "fp32",
                 "w_ptr": "fp32", "ks_ptr": "i32", "ke_ptr": "i32", "ctx_ptr": "i32",
                 "bt_ptr": "i32", "out_ptr": "fp32"}
    out = []
    for cfg in configs:
        fn = mod._mqa_logits_kernel if cfg["kernel"] == "prefill" else mod._paged_mqa_logits_kernel
        cst = dict(H=64, D=128, BLOCK_N=cfg["BLOCK_N"], CLEAN=False, FP8_MMA=cfg["FP8_MMA"],
                   PACKED=True)
        if cfg["kernel"] == "prefill":
            cst["QROWS"] = cfg["QROWS"]
        else:
            cst.update(NEXT_N=cfg["NEXT_N"], ROWS=triton.next_power_of_2(cfg["NEXT_N"]),
                       CTX_2D=True, PAGE=64)
        sig = {a: ("constexpr" if a in cst else "*" + ptr_types[a] if a in ptr_types else "i32")
               for a in fn.arg_names}
        opts = dict(num_warps=cfg["num_warps"], num_stages=cfg.get("num_stages", 2))
        # what the JIT specializes at run time for vLLM's tensors: 16-byte aligned
        # pointers, strides that are multiples of 16 (128-wide heads, 64-slot blocks)
        attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names)
                 if a in ptr_types or a in ALIGNED_STRIDES}
        k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=cst, attrs=attrs),
                           target=target, options=opts)
        out.append(dict(arch=arch, **cfg, shared=int(k.metadata.shared),
                        smem_limit=SMEM_LIMIT.get(arch),
                        has_cubin=len(k.asm.get("cubin", b"")) > 0))
    return out


if __name__ == "__main__":  # python tests/indexer_reference.py --compile TREE ARCH
    import json
    import os
    import sys

    os.environ.pop("TRITON_INTERPRET", None)
    if sys.argv[1] == "--compile":
        print(json.dumps(compile_report(Path(sys.argv[2]), int(sys.argv[3]))))


# ---------------------------------------------------------------------------
# GPU comparison helpers (tests/gpu/test_indexer_gpu.py, bench/indexer/)
# ---------------------------------------------------------------------------

class VllmOps:
    """vLLM 0.26.0's compiled ops from `_C_stable_libtorch.abi3.so` (loaded with
    torch.ops.load_library, no `import vllm`); None members if missing."""

    def __init__(self, so_path: str):
        torch.ops.load_library(so_path)

        def find(name, spaces=("_C", "_C_cache_ops")):
            for ns in spaces:
                try:
                    return getattr(getattr(torch.ops, ns), name)
                except (AttributeError, RuntimeError):
                    continue
            return None

        self.group_quant = find("per_token_group_fp8_quant")
        self.cache_write = find("indexer_k_quant_and_cache")
        self.cache_gather = find("cp_gather_indexer_k_quant_cache")
        self.topk_prefill = find("top_k_per_row_prefill")
        self.topk_decode = find("top_k_per_row_decode")
        self.persistent_topk = find("persistent_topk")


def quant_q_vllm(ops: VllmOps, q: torch.Tensor, weights: torch.Tensor,
                 softmax_scale: float, head_scale: float):
    """The Indexer's unfused query path with vLLM's own kernel
    (per_token_group_fp8_quant, group 128 = one head, ue8m0)."""
    T, H, D = q.shape
    x = q.reshape(T * H, D).contiguous()
    q_fp8 = torch.empty_like(x, dtype=torch.float8_e4m3fn)
    s = torch.empty((T * H, 1), dtype=torch.float32, device=q.device)
    ops.group_quant(x, q_fp8, s, D, 1e-10, -FP8_MAX, FP8_MAX, True, False, False)
    w = weights.float() * s.view(T, H) * softmax_scale * head_scale
    return q_fp8.view(T, H, D), w


def write_cache(ops: VllmOps | None, k: torch.Tensor, kv: torch.Tensor,
                slots: torch.Tensor) -> None:
    if ops is not None and ops.cache_write is not None:
        ops.cache_write(k.contiguous(), kv, slots.to(torch.int64), 128, "ue8m0")
    else:
        ref_indexer_k_quant_and_cache(k, kv, slots)


def build_paged_case(device, lens, next_n: int, H: int, D: int, bs: int, seed: int,
                     ops: VllmOps | None = None, dtype=torch.bfloat16, spare: float = 1.25,
                     max_model_len: int = 0):
    """A decode batch on a shuffled paged indexer cache (unused blocks between
    requests' blocks). Returns dict(q_fp8 [B,next_n,H,D], w [B*next_n,H] fp32,
    kv uint8 [nb,bs,D+4], bt int32 [B,max_blocks], lens2d int32 [B,next_n],
    lens list); keys of request b are bf16 randn written by `write_cache`."""
    g = torch.Generator(device=device).manual_seed(seed)
    B = len(lens)
    need = [-(-L // bs) for L in lens]
    nb = int(sum(need) * spare) + 2
    max_blocks = max(max(need), -(-max_model_len // bs), 1)  # vLLM: cdiv(max_model_len, bs)
    perm = torch.randperm(nb, generator=g, device=device).to(torch.int32)
    bt = torch.zeros((B, max_blocks), dtype=torch.int32, device=device)
    kv = torch.zeros((nb, bs, D + 4), dtype=torch.uint8, device=device)
    used = 0
    slot_chunks = []
    for b, n in enumerate(need):
        bt[b, :n] = perm[used:used + n]
        used += n
        pos = torch.arange(lens[b], device=device)
        slot_chunks.append(bt[b, pos // bs].long() * bs + pos % bs)
    slots = torch.cat(slot_chunks) if slot_chunks else torch.zeros(0, dtype=torch.long)
    k = torch.randn((slots.numel(), D), generator=g, device=device).to(dtype)
    if slots.numel():
        write_cache(ops, k, kv, slots)
    q = torch.randn((B * next_n, H, D), generator=g, device=device).to(dtype)
    w = torch.randn((B * next_n, H), generator=g, device=device).to(dtype)
    if ops is not None and ops.group_quant is not None:
        q_fp8, wq = quant_q_vllm(ops, q, w, D ** -0.5, H ** -0.5)
    else:
        q_fp8, wq = quant_q(q, w, D ** -0.5, H ** -0.5)
    L = torch.tensor(lens, dtype=torch.int32, device=device)
    lens2d = (L[:, None] - next_n + 1 + torch.arange(next_n, device=device, dtype=torch.int32)
              ).clamp(min=0).to(torch.int32).contiguous()
    return dict(q_fp8=q_fp8.view(B, next_n, H, D), w=wq.contiguous(), kv=kv, bt=bt,
                lens2d=lens2d, lens=list(lens))


def gather_request_keys(ops: VllmOps | None, kv: torch.Tensor, bt_row: torch.Tensor, L: int):
    """(k_fp8 codes uint8 [L, D], k_scale fp32 [L]) of one request, through
    vLLM's cp_gather_indexer_k_quant_cache when loaded (the prefill path)."""
    D = kv.shape[-1] - 4
    if ops is not None and ops.cache_gather is not None:
        dst_k = torch.empty((L, D), dtype=torch.uint8, device=kv.device)
        dst_s = torch.empty((L, 4), dtype=torch.uint8, device=kv.device)
        cu = torch.tensor([0, L], dtype=torch.int32, device=kv.device)
        ops.cache_gather(kv, dst_k.view(torch.float8_e4m3fn), dst_s, bt_row[None].contiguous(), cu)
        return dst_k, dst_s.view(torch.float32).reshape(L)
    codes, scales = read_paged_cache(kv)
    bs = kv.shape[1]
    pos = torch.arange(L, device=kv.device)
    phys = bt_row[pos // bs].long()
    return codes[phys, pos % bs].contiguous(), scales[phys, pos % bs].contiguous()


def topk_prefill(ops: VllmOps | None, logits, ks, ke, k: int) -> torch.Tensor:
    """int32 [M, k] row-local (relative to ks) top-k, -1 padded; vLLM's
    top_k_per_row_prefill when loaded, else torch.topk on the masked row."""
    M = logits.shape[0]
    out = torch.full((M, k), -1, dtype=torch.int32, device=logits.device)
    if ops is not None and ops.topk_prefill is not None:
        ops.topk_prefill(logits, ks, ke, out, M, logits.stride(0), logits.stride(1), k)
        return out
    n = torch.arange(logits.shape[1], device=logits.device)
    inside = (n[None] >= ks[:, None]) & (n[None] < ke[:, None])
    idx = topk_rows(logits.masked_fill(~inside, float("-inf")), k)
    return torch.where(idx >= 0, idx - ks[:, None].to(torch.int32), idx)


def topk_decode(ops: VllmOps | None, logits, next_n: int, lens2d, k: int) -> torch.Tensor:
    """int32 [rows, k] top-k over [0, L_row); vLLM's top_k_per_row_decode when loaded."""
    R = logits.shape[0]
    out = torch.full((R, k), -1, dtype=torch.int32, device=logits.device)
    if ops is not None and ops.topk_decode is not None:
        ops.topk_decode(logits, next_n, lens2d, out, R, logits.stride(0), logits.stride(1), k)
        return out
    n = torch.arange(logits.shape[1], device=logits.device)
    inside = n[None] < lens2d.reshape(-1, 1)
    return topk_rows(logits.masked_fill(~inside, float("-inf")), k)


def finite_rel_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    """max |a - b| / max |b| over `mask`."""
    if not mask.any():
        return 0.0
    d = (a[mask].double() - b[mask].double()).abs().max()
    return float(d / b[mask].double().abs().max().clamp(min=1e-30))

"""CPU tests (TRITON_INTERPRET=1) of the Triton DSA-indexer kernels (issue 12).

The kernels live in the vLLM tree (vllm/v1/attention/ops/triton_dsa_indexer.py,
added by the indexer patch) and are loaded by file path; SMLA_TREE picks
the tree. fp32 accumulation and fp16 tensor-core operands only: the
interpreter has no bf16, so bf16 models are covered by the GPU test
(tests/gpu/test_indexer_gpu.py), not here.
"""
from __future__ import annotations

import ast
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (see test_kernel_interpret.py)

import pytest  # noqa: E402

import lineproofs  # noqa: E402
import torch  # noqa: E402

from indexer_reference import (  # noqa: E402
    MODULE_REL,
    load_indexer_module,
    quant_k,
    quant_q,
    read_paged_cache,
    ref_dsa_attention,
    ref_indexer_k_quant_and_cache,
    ref_mqa_logits,
    ref_paged_mqa_logits,
    rel_err,
    row_lengths,
    topk_rows,
)
from sparse_mla_reference import load_sparse_mla_module  # noqa: E402

TOL = 2e-6  # fp32 accumulation of exact fp8 products vs float64


@pytest.fixture(scope="module")
def mod(vllm_tree):
    return load_indexer_module(vllm_tree, interpret=True)


def gen(seed):
    return torch.Generator().manual_seed(seed)


def assert_logits(out, ref, clean=True):
    """Finite reference entries match to TOL; with `clean`, the -inf pattern is exact."""
    fin = torch.isfinite(ref)
    assert not torch.isnan(out[fin]).any()
    assert rel_err(out, ref) < TOL, rel_err(out, ref)
    if clean:
        assert torch.equal(torch.isneginf(out), torch.isneginf(ref))


# ---------------------------------------------------------------------------
# fp8 e4m3fn software decode
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def decode(vllm_tree, mod):
    from e4m3_decode import decoder

    return decoder(vllm_tree)


def test_fp8_decode_all_256_codes_bit_exact(decode):
    codes = torch.arange(256, dtype=torch.uint8)
    out = decode(codes)
    ref = codes.view(torch.float8_e4m3fn).to(torch.float32)
    # bit patterns equal: covers +-0, all subnormals, 448 and both NaN codes
    assert torch.equal(out.view(torch.int32), ref.view(torch.int32))
    assert torch.isnan(out[0x7F]) and torch.isnan(out[0xFF])
    # the float8 dtype is accepted as-is, any shape
    out2 = decode(codes.view(torch.float8_e4m3fn).reshape(16, 16))
    assert torch.equal(out2.reshape(-1).view(torch.int32), ref.view(torch.int32))


def test_fp8_roundtrip_through_quantised_values(decode):
    """encode (torch, saturating RNE) -> our decode == torch decode."""
    x = torch.cat([torch.randn(4000, generator=gen(1)) * 100,
                   torch.tensor([0.0, -0.0, 1e-9, 500.0, -500.0, 448.0, 2.0 ** -9])])
    q = x.clamp(-448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(decode(q), q.to(torch.float32))


# ---------------------------------------------------------------------------
# prefill logits (contiguous keys, row bounds)
# ---------------------------------------------------------------------------

def make_prefill(seed, M, N, H, D):
    g = gen(seed)
    q = torch.randn(M, H, D, generator=g)
    k = torch.randn(N, D, generator=g) * torch.rand(N, 1, generator=g) * 4
    w = torch.randn(M, H, generator=g)
    q_fp8, wq = quant_q(q, w, D ** -0.5, H ** -0.5)
    k_fp8, k_scale = quant_k(k)
    return q_fp8, k_fp8, k_scale, wq


@pytest.mark.parametrize("fp8_mma", [False, True], ids=["software", "fp8-mma"])
@pytest.mark.parametrize("qrows,block_n", [(4, 32), (1, 64), (2, 16)])
def test_mqa_logits_ragged_rows(mod, qrows, block_n, fp8_mma):
    M, N, H, D = 9, 150, 16, 32
    q_fp8, k_fp8, k_scale, w = make_prefill(2, M, N, H, D)
    # empty rows, single keys, full range, bounds on and off tile edges
    ks = torch.tensor([0, 0, 10, 20, 149, 5, 32, 64, 0], dtype=torch.int32)
    ke = torch.tensor([1, 150, 60, 20, 150, 140, 64, 65, 0], dtype=torch.int32)
    ref = ref_mqa_logits(q_fp8, k_fp8, k_scale, w, ks, ke)
    out = mod.mqa_logits(q_fp8, k_fp8, k_scale, w, ks, ke, clean_logits=True,
                         config=dict(QROWS=qrows, BLOCK_N=block_n), fp8_mma=fp8_mma)
    assert out.shape == (M, N) and out.dtype == torch.float32
    assert_logits(out, ref)
    assert torch.isneginf(out[3]).all() and torch.isneginf(out[8]).all()
    # clean_logits=False: inside [ks, ke) identical, outside unspecified
    out_nc = mod.mqa_logits(q_fp8, k_fp8, k_scale, w, ks, ke, clean_logits=False,
                            config=dict(QROWS=qrows, BLOCK_N=block_n), fp8_mma=fp8_mma)
    fin = torch.isfinite(ref)
    assert torch.equal(out_nc[fin], out[fin])


def test_mqa_logits_causal_multi_request(mod):
    """Bounds as vLLM's prefill chunk builds them: request r's keys start at
    its offset in the gathered K and query j of it sees ctx_r - q_r + j + 1 keys."""
    H, D = 16, 32
    ctx, qlen = [37, 70, 5], [5, 70, 2]
    ks, ke, off = [], [], 0
    for c, ql in zip(ctx, qlen):
        for j in range(ql):
            ks.append(off)
            ke.append(off + c - ql + j + 1)
        off += c
    M, N = len(ks), off
    ks = torch.tensor(ks, dtype=torch.int32)
    ke = torch.tensor(ke, dtype=torch.int32)
    q_fp8, k_fp8, k_scale, w = make_prefill(3, M, N, H, D)
    ref = ref_mqa_logits(q_fp8, k_fp8, k_scale, w, ks, ke)
    out = mod.mqa_logits(q_fp8, k_fp8, k_scale, w, ks, ke, config=dict(QROWS=8, BLOCK_N=64))
    assert_logits(out, ref)


def test_mqa_logits_real_head_geometry(mod):
    """64 heads x 128 dims (GLM-5 / DeepSeek-V3.2 indexer), small N."""
    M, N, H, D = 3, 70, 64, 128
    q_fp8, k_fp8, k_scale, w = make_prefill(4, M, N, H, D)
    ks = torch.tensor([0, 3, 60], dtype=torch.int32)
    ke = torch.tensor([70, 40, 61], dtype=torch.int32)
    ref = ref_mqa_logits(q_fp8, k_fp8, k_scale, w, ks, ke)
    assert_logits(mod.mqa_logits(q_fp8, k_fp8, k_scale, w, ks, ke, config=dict(BLOCK_N=64)), ref)


def test_mqa_logits_relu_and_weight_signs(mod):
    """A key anti-aligned with every head scores 0 (ReLU), never negative;
    negative weights make logits negative."""
    H, D = 16, 32
    q = torch.ones(1, H, D)
    k = torch.stack([torch.ones(D), -torch.ones(D)])
    q_fp8, _ = quant_q(q, torch.ones(1, H), 1.0, 1.0)
    k_fp8, k_scale = quant_k(k)
    w = -torch.ones(1, H)
    ks, ke = torch.tensor([0], dtype=torch.int32), torch.tensor([2], dtype=torch.int32)
    out = mod.mqa_logits(q_fp8, k_fp8, k_scale, w, ks, ke, config=dict(BLOCK_N=16))
    ref = ref_mqa_logits(q_fp8, k_fp8, k_scale, w, ks, ke)
    assert out[0, 1] == 0 and out[0, 0] < 0
    assert_logits(out, ref)


# ---------------------------------------------------------------------------
# paged decode logits
# ---------------------------------------------------------------------------

def make_paged(seed, lens_per_req, next_n, H, D, bs, num_blocks, max_blocks):
    """Cache with garbage everywhere, requests' keys written through the
    reference writer into shuffled physical blocks (holes between them),
    block-table tails filled with out-of-range ids."""
    g = gen(seed)
    B = len(lens_per_req)
    kv = torch.randint(0, 256, (num_blocks, bs, D + 4), dtype=torch.uint8, generator=g)
    # garbage scales must stay finite: they are read only past the bounds
    _, sc = read_paged_cache(kv)
    sc.copy_(torch.rand(sc.shape, generator=g))
    bt = torch.full((B, max_blocks), 10 ** 6, dtype=torch.int32)
    perm = torch.randperm(num_blocks, generator=g).tolist()
    for b, L in enumerate(lens_per_req):
        nblk = -(-L // bs)
        bt[b, :nblk] = torch.tensor([perm.pop() for _ in range(nblk)], dtype=torch.int32)
        if L:
            k = torch.randn(L, D, generator=g) * (1 + 3 * torch.rand(L, 1, generator=g))
            pos = torch.arange(L)
            ref_indexer_k_quant_and_cache(k, kv, bt[b, pos // bs].long() * bs + pos % bs)
    q = torch.randn(B * next_n, H, D, generator=g)
    w = torch.randn(B * next_n, H, generator=g)
    q_fp8, wq = quant_q(q, w, D ** -0.5, H ** -0.5)
    return q_fp8.reshape(B, next_n, H, D), kv, wq, bt


def test_cache_writer_layout(decode):
    """The reference writer's bytes decode back to k within fp8 precision
    (the GPU test compares the writer with vLLM's compiled op)."""
    g = gen(5)
    D, bs = 32, 16
    kv = torch.zeros(4, bs, D + 4, dtype=torch.uint8)
    k = torch.randn(5, D, generator=g)
    slots = torch.tensor([3, 17, -1, 63, 48])
    ref_indexer_k_quant_and_cache(k, kv, slots)
    codes, scales = read_paged_cache(kv)
    for t, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        back = decode(codes[s // bs, s % bs]) * scales[s // bs, s % bs]
        assert (back - k[t]).abs().max() <= k[t].abs().max() * 2 ** -4
    assert (kv.view(4, -1)[:, :bs * D].reshape(-1, D)[[1, 2]] == 0).all()  # slot -1 untouched


@pytest.mark.parametrize("fp8_mma", [False, True], ids=["software", "fp8-mma"])
@pytest.mark.parametrize("block_n", [16, 64])
def test_paged_decode_holes_next_n_1(mod, block_n, fp8_mma):
    H, D, bs = 16, 32, 16
    lens = [40, 1, 0, 97, 16]
    q_fp8, kv, w, bt = make_paged(6, lens, 1, H, D, bs, num_blocks=24, max_blocks=8)
    ctx = torch.tensor(lens, dtype=torch.int32)[:, None]  # (B, 1), as vLLM passes it
    max_model_len = 128
    ref = ref_paged_mqa_logits(q_fp8, kv, w, ctx, bt, max_model_len)
    out = mod.paged_mqa_logits(q_fp8, kv, w, ctx, bt, max_model_len, config=dict(BLOCK_N=block_n),
                               fp8_mma=fp8_mma)
    assert out.shape == (len(lens), max_model_len)
    assert_logits(out, ref)
    assert torch.isneginf(out[2]).all()  # padded request (ctx 0)
    # DeepGEMM's 4-D view of the cache is accepted too
    out4 = mod.paged_mqa_logits(q_fp8, kv.unsqueeze(2), w, ctx, bt, max_model_len,
                                config=dict(BLOCK_N=block_n), fp8_mma=fp8_mma)
    assert torch.equal(out4, out)


@pytest.mark.parametrize("fp8_mma", [False, True], ids=["software", "fp8-mma"])
def test_paged_decode_mtp_2d_context_lens(mod, fp8_mma):
    """next_n = 3 with per-position (2-D) lengths, incl. a non-causal-looking
    pattern and a row whose length is 0."""
    H, D, bs, next_n = 16, 32, 16, 3
    lens2d = torch.tensor([[30, 31, 32], [0, 1, 2], [50, 50, 70]], dtype=torch.int32)
    q_fp8, kv, w, bt = make_paged(7, lens2d.max(1).values.tolist(), next_n, H, D, bs,
                                  num_blocks=16, max_blocks=6)
    ref = ref_paged_mqa_logits(q_fp8, kv, w, lens2d, bt, 96)
    out = mod.paged_mqa_logits(q_fp8, kv, w, lens2d, bt, 96, config=dict(BLOCK_N=32),
                               fp8_mma=fp8_mma)
    assert_logits(out, ref)
    for programs in (1, 2, 5):  # each request's tiles shared by 1 / 2 / 5 programs
        several = mod.paged_mqa_logits(q_fp8, kv, w, lens2d, bt, 96, fp8_mma=fp8_mma,
                                       config=dict(BLOCK_N=16, programs=programs))
        assert torch.equal(several, out), programs
    assert torch.isneginf(out[3]).all()
    for r, L in enumerate(row_lengths(lens2d, next_n).tolist()):
        assert torch.isfinite(out[r, :L]).all() and torch.isneginf(out[r, L:]).all()


def test_paged_decode_mtp_1d_context_lens(mod):
    """next_n = 2 with one length per request: row i sees L - next_n + i + 1
    keys (DeepGEMM's 1-D convention); (B, 1) lengths mean the same."""
    H, D, bs, next_n = 16, 32, 16, 2
    lens = [33, 2, 64]
    q_fp8, kv, w, bt = make_paged(8, lens, next_n, H, D, bs, num_blocks=12, max_blocks=5)
    ctx = torch.tensor(lens, dtype=torch.int32)
    ref = ref_paged_mqa_logits(q_fp8, kv, w, ctx, bt, 80)
    out = mod.paged_mqa_logits(q_fp8, kv, w, ctx, bt, 80, config=dict(BLOCK_N=16))
    assert_logits(out, ref)
    out_b1 = mod.paged_mqa_logits(q_fp8, kv, w, ctx[:, None], bt, 80, config=dict(BLOCK_N=16))
    assert torch.equal(out_b1, out)
    # a request's tiles (and the -inf fill past its longest row) shared by 1..7
    # programs: several tiles per program, programs with nothing below the length
    for programs in (1, 3, 7):
        out_t = mod.paged_mqa_logits(q_fp8, kv, w, ctx, bt, 80,
                                     config=dict(BLOCK_N=16, programs=programs))
        assert torch.equal(out_t, out), programs
    # clean_logits=False: inside the bounds identical
    out_nc = mod.paged_mqa_logits(q_fp8, kv, w, ctx, bt, 80, config=dict(BLOCK_N=16), clean_logits=False)
    fin = torch.isfinite(ref)
    assert torch.equal(out_nc[fin], out[fin])


def test_paged_decode_real_geometry_block_64(mod):
    """64 heads x 128 dims, vLLM's indexer block size 64."""
    H, D, bs = 64, 128, 64
    lens = [130, 64]
    q_fp8, kv, w, bt = make_paged(9, lens, 1, H, D, bs, num_blocks=8, max_blocks=4)
    ctx = torch.tensor(lens, dtype=torch.int32)[:, None]
    ref = ref_paged_mqa_logits(q_fp8, kv, w, ctx, bt, 256)
    assert_logits(mod.paged_mqa_logits(q_fp8, kv, w, ctx, bt, 256, config=dict(BLOCK_N=64)), ref)


def test_decode_wrapper_has_no_host_sync(vllm_tree):
    """The decode wrapper must not read device values on the host (CUDA graphs)."""
    src = (vllm_tree / MODULE_REL).read_text()
    fn = next(n for n in ast.parse(src).body
              if isinstance(n, ast.FunctionDef) and n.name == "paged_mqa_logits")
    calls = {n.func.attr for n in ast.walk(fn)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    assert not calls & {"item", "tolist", "cpu", "numpy", "synchronize", "nonzero"}


# ---------------------------------------------------------------------------
# toy DSA block: indexer -> top-k -> sparse MLA (the series' sparse_mla_fwd)
# ---------------------------------------------------------------------------

def check_topk(ours, ref_logits, k):
    """Each row's chosen set equals the float64 top-k up to near-ties at the
    k-th value (the only place fp32 rounding may reorder)."""
    ref_idx = topk_rows(ref_logits, k)
    for r in range(ours.shape[0]):
        a = {x for x in ours[r].tolist() if x >= 0}
        b = {x for x in ref_idx[r].tolist() if x >= 0}
        assert len(a) == len(b)
        if a == b:
            continue
        row = ref_logits[r]
        kth = row[list(b)].min()
        tol = 1e-5 * row[torch.isfinite(row)].abs().max()
        assert all(abs(row[x] - kth) <= tol for x in a ^ b)


def test_toy_dsa_block_decode_and_prefill(mod, vllm_tree):
    # float16: the attention kernel takes the 16-bit dtypes MLA backends run (bfloat16 is
    # checked on the GPU: Triton's interpreter returns garbage for it)
    dtype = torch.float16
    smla = load_sparse_mla_module(vllm_tree, interpret=True)
    g = gen(10)
    H_idx, D_idx, bs, topk = 16, 32, 16, 24
    H_attn, dl, dpe = 4, 512, 64
    lens = [45, 20, 64]
    B = len(lens)
    q_fp8, kv_idx, w, bt = make_paged(11, lens, 1, H_idx, D_idx, bs, num_blocks=10,
                                      max_blocks=4)
    num_slots = kv_idx.shape[0] * bs
    latent = (torch.randn(num_slots, dl + dpe, generator=g) * 0.5).to(dtype)
    sm_scale = (dl + dpe) ** -0.5

    # decode: one query per request
    ctx = torch.tensor(lens, dtype=torch.int32)[:, None]
    logits = mod.paged_mqa_logits(q_fp8, kv_idx, w, ctx, bt, 64, config=dict(BLOCK_N=32))
    ref_logits = ref_paged_mqa_logits(q_fp8, kv_idx, w, ctx, bt, 64)
    top = topk_rows(logits, topk)  # stands in for vLLM's top_k_per_row_decode (a _C op)
    check_topk(top, ref_logits, topk)
    req = torch.arange(B, dtype=torch.int32)
    slots = smla.convert_req_local_to_slots(req, bt, top, bs)
    q_lat = (torch.randn(B, H_attn, dl + dpe, generator=g) * 0.5).to(dtype)
    out = smla.sparse_mla_fwd(q_lat, latent, slots, sm_scale, kv_lora_rank=dl)
    # plain PyTorch DSA: float64 top-k over the float64 logits, gather, softmax
    ref_top = topk_rows(ref_logits, topk)
    ref_slots = torch.where(ref_top >= 0, bt.gather(1, ref_top.clamp(min=0).long() // bs).long()
                            * bs + ref_top.clamp(min=0).long() % bs, -1)
    ref = ref_dsa_attention(q_lat, latent, ref_slots, sm_scale, dl)
    tol = 3e-3
    assert rel_err(out, ref) < tol, rel_err(out, ref)

    # prefill of request 0's last 6 tokens against its gathered keys
    codes, scales = read_paged_cache(kv_idx)
    L, T = lens[0], 6
    pos = torch.arange(L)
    phys = bt[0, pos // bs].long()
    k_fp8, k_scale = codes[phys, pos % bs].contiguous(), scales[phys, pos % bs].contiguous()
    qp = torch.randn(T, H_idx, D_idx, generator=g)
    qp_fp8, wp = quant_q(qp, torch.randn(T, H_idx, generator=g), D_idx ** -0.5, H_idx ** -0.5)
    ks = torch.zeros(T, dtype=torch.int32)
    ke = torch.arange(L - T + 1, L + 1, dtype=torch.int32)
    pl = mod.mqa_logits(qp_fp8, k_fp8, k_scale, wp, ks, ke, config=dict(BLOCK_N=32))
    ref_pl = ref_mqa_logits(qp_fp8, k_fp8, k_scale, wp, ks, ke)
    ptop = topk_rows(pl, topk)
    check_topk(ptop, ref_pl, topk)
    pslots = smla.convert_req_local_to_slots(torch.zeros(T, dtype=torch.int32), bt, ptop, bs)
    qp_lat = (torch.randn(T, H_attn, dl + dpe, generator=g) * 0.5).to(dtype)
    pout = smla.sparse_mla_fwd(qp_lat, latent, pslots, sm_scale, kv_lora_rank=dl)
    rtop = topk_rows(ref_pl, topk)
    rslots = torch.where(rtop >= 0, phys[rtop.clamp(min=0).long()] * bs
                         + rtop.clamp(min=0).long() % bs, -1)
    pref = ref_dsa_attention(qp_lat, latent, rslots, sm_scale, dl)
    assert rel_err(pout, pref) < tol, rel_err(pout, pref)
    # causality: no query picked a key after its own position
    for t in range(T):
        assert int(ptop[t].max()) < int(ke[t])


# ---------------------------------------------------------------------------
# compile-only: the logits kernels build for every target arch and fit its
# shared memory (the interpreter does not see Triton's compile-time rules)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("arch", [80, 86, 89, 90, 100, 120, 121])
def test_logits_kernels_compile_for_arch(vllm_tree, arch):
    import json
    import subprocess
    import sys
    from pathlib import Path

    import triton

    binp = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    names = ["ptxas-blackwell", "ptxas"] if arch >= 100 else ["ptxas"]
    if not any((binp / n).exists() and f"sm_{arch}" in subprocess.run(
            [str(binp / n), "--help"], capture_output=True, text=True).stdout for n in names):
        pytest.skip(f"bundled ptxas does not list sm_{arch}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    here = Path(__file__).resolve().parent
    r = subprocess.run([sys.executable, str(here / "indexer_reference.py"), "--compile",
                        str(vllm_tree), str(arch)], capture_output=True, text=True, env=env,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    recs = json.loads(r.stdout.strip().splitlines()[-1])
    # the software path on every arch, fp8 tensor-core dots from sm89 on
    assert sorted({r["FP8_MMA"] for r in recs}) == ([False, True] if arch >= 89 else [False])
    assert len(recs) == (6 if arch >= 89 else 3)
    for rec in recs:
        assert rec["has_cubin"], rec
        assert rec["shared"] <= rec["smem_limit"], rec


# tests/lines/<line>/indexer/: 0.33.0's sparse_attn_indexer op (compressed prefill logits, the new top-k
# call, MTP padded decode) at capability 8.0 against float64, and its fused cache / query kernels on the
# software e4m3 encode bit for bit; the least number of tests each file must pass.
LINE_PROOFS = {
    "0.33.0": [("indexer", "test_indexer_op.py", 3),
               ("indexer", "test_fused_fp8_encode.py", 5),
               # GLM-5.3-Flash's pooled indexer op (Triton logits over the 132-byte pooled cache,
               # pool top-k, expansion with the tail; mixed batches at 2-3k and past 8k tokens, MTP
               # padded decode) and its kpool kernels' software e4m3 encode, bit for bit
               ("indexer", "test_kpool_indexer_op.py", 4),
               ("indexer", "test_kpool_fp8_encode.py", 5)],
}


@pytest.mark.parametrize("case", lineproofs.cases(LINE_PROOFS, "its indexer op is checked by "
                                                 "tests/test_backend_interpret.py and the GPU tests"))
def test_line_indexer_proof(vllm_tree, case):
    lineproofs.check(case, vllm_tree)

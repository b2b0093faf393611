"""vLLM 0.33.0's DSA indexer op (sparse_attn_indexer, the function
SparseAttnIndexer.forward_cuda and the deepseek_v32 CUDA model call) on the
Triton logits path (capability 8.0), under Triton's interpreter, against the
float64 references of the 0.26.0 line (tests/indexer_reference.py).

What runs for real: the op's Python (chunk loop, row bounds, DCP/PCP-free
branches, the logits dispatch, the top-k calls, the padded-decode pack and
unpack, both Triton kernels and vLLM's pack/unpack Triton kernels). Stood in:
the compiled gather and top-k ops (torch implementations in
indexer_op_standins.py, from the CUDA sources' semantics: top_k_per_row_prefill
returns indices relative to its row start, csrc/sampler.cu), the forward
context and the workspace manager.
"""
from __future__ import annotations

import pytest
import torch

from indexer_op_standins import Recorder, Workspace, forward_context, make_queries
from indexer_reference import (
    read_paged_cache,
    ref_indexer_k_quant_and_cache,
    ref_mqa_logits,
    ref_paged_mqa_logits,
    rel_err,
    topk_rows,
)

import vllm._custom_ops as custom_ops
import vllm.model_executor.layers.sparse_attn_indexer as sai
from vllm.v1.attention.backends.mla import indexer as idx
from vllm.v1.attention.backends.mla.indexer import (
    DeepseekV32IndexerMetadata,
    DeepseekV32IndexerPrefillChunkMetadata,
    DeepseekV32IndexerPrefillMetadata,
    DeepSeekV32IndexerDecodeMetadata,
)

H, D, BS, TOPK, MAX_LEN = 16, 128, 16, 16, 128
PREFIX = "model.layers.0.self_attn.indexer.k_cache"
LOGITS_TOL = 2e-6  # fp32 accumulation of exact fp8 products vs float64


@pytest.fixture
def rec(monkeypatch):
    r = Recorder(BS)
    monkeypatch.setattr(custom_ops, "cp_gather_indexer_k_quant_cache", r.gather)
    monkeypatch.setattr(custom_ops, "top_k_per_row_prefill", r.topk_prefill)
    monkeypatch.setattr(custom_ops, "top_k_per_row_decode", r.topk_decode)
    monkeypatch.setattr(sai, "current_workspace_manager", Workspace)
    idx.select_sparse_indexer_logits.cache_clear()
    yield r
    idx.select_sparse_indexer_logits.cache_clear()


def make_cache(lens, seed):
    """Paged indexer cache (garbage outside the requests' slots), requests'
    keys written by the reference writer into shuffled blocks."""
    g = torch.Generator().manual_seed(seed)
    max_blocks = MAX_LEN // BS
    nblocks = len(lens) * max_blocks + 3
    kv = torch.randint(0, 256, (nblocks, BS, D + 4), dtype=torch.uint8, generator=g)
    _, sc = read_paged_cache(kv)
    sc.copy_(torch.rand(sc.shape, generator=g))
    perm = torch.randperm(nblocks, generator=g).tolist()
    bt = torch.zeros(len(lens), max_blocks, dtype=torch.int32)
    for b, L in enumerate(lens):
        bt[b] = torch.tensor([perm.pop() for _ in range(max_blocks)], dtype=torch.int32)
        k = torch.randn(L, D, generator=g) * (1 + 3 * torch.rand(L, 1, generator=g))
        pos = torch.arange(L)
        ref_indexer_k_quant_and_cache(k, kv, bt[b, pos // BS].long() * BS + pos % BS)
    return kv, bt


def run_op(meta, kv, q_fp8, w, topk_buffer):
    with forward_context(sai, PREFIX, meta):
        return sai.sparse_attn_indexer(
            torch.empty(q_fp8.shape[0], 8), PREFIX, kv, q_fp8, None, None, w,
            128, "ue8m0", TOPK, D, MAX_LEN, 4096, topk_buffer,
            True, False, False, "",  # skip_k_cache_insert, use_pcp, pcp_shard, dense_mha
        )


def check_topk(ours, ref_logits, k):
    """Each row's set equals the float64 top-k up to near-ties at the k-th value."""
    ref_idx = topk_rows(ref_logits, k)
    for r in range(ours.shape[0]):
        a = {x for x in ours[r].tolist() if x >= 0}
        b = {x for x in ref_idx[r].tolist() if x >= 0}
        assert len(a) == len(b), (r, a, b)
        if a == b:
            continue
        row = ref_logits[r]
        kth = row[list(b)].min()
        tol = 1e-5 * row[torch.isfinite(row)].abs().max()
        assert all(abs(row[x] - kth) <= tol for x in a ^ b), (r, a ^ b)


def overlap(ours, ref_logits, k) -> float:
    ref_idx = topk_rows(ref_logits, k)
    hit = tot = 0
    for a, b in zip(ours.tolist(), ref_idx.tolist()):
        sa, sb = {x for x in a if x >= 0}, {x for x in b if x >= 0}
        hit += len(sa & sb)
        tot += max(len(sa), len(sb))
    return hit / max(tot, 1)


def test_capability_80_takes_triton(rec):
    assert idx.select_sparse_indexer_logits("auto") == (
        "triton", "DeepGEMM has no MQA-logits kernels for sm80")


def test_mixed_batch_prefill_compressed_contract_and_paged_decode(rec):
    # 3 decode requests (one shorter than top-k), then 2 prefill requests
    # (a chunked prefill of 6 tokens over 45, a full prefill of 30) in one chunk
    dec_lens = [37, 60, 5]
    pre_ctx, pre_q = [45, 30], [6, 30]
    lens = dec_lens + pre_ctx
    kv, bt = make_cache(lens, seed=1)
    nd = len(dec_lens)
    T = nd + sum(pre_q)
    q_fp8, w = make_queries(T, seed=2, heads=H, dim=D)
    ks, ke, off = [], [], 0
    for c, ql in zip(pre_ctx, pre_q):
        for j in range(ql):
            ks.append(off)
            ke.append(off + c - ql + j + 1)
        off += c
    ks = torch.tensor(ks, dtype=torch.int32)
    ke = torch.tensor(ke, dtype=torch.int32)
    cu = torch.tensor([0, pre_ctx[0], sum(pre_ctx)], dtype=torch.int32)
    chunk = DeepseekV32IndexerPrefillChunkMetadata(
        block_table=bt[nd:], cu_seqlen_ks=ks, cu_seqlen_ke=ke, cu_seq_lens=cu,
        token_to_seq=torch.zeros(off, dtype=torch.int32), total_seq_lens=off,
        max_seqlen_k=max(pre_ctx), token_start=nd, token_end=T, num_reqs=2,
        local_cu_seq_lens=cu, local_total_seq_lens=off, max_local_total_seq_lens=off)
    decode = DeepSeekV32IndexerDecodeMetadata(
        block_table=bt[:nd], seq_lens=torch.tensor(dec_lens, dtype=torch.int32)[:, None],
        decode_lens=torch.ones(nd, dtype=torch.int32), requires_padding=False,
        schedule_metadata=torch.empty(0, 2, dtype=torch.int32))
    meta = DeepseekV32IndexerMetadata(
        seq_lens=torch.tensor(lens, dtype=torch.int32), max_seq_len=max(lens),
        slot_mapping=torch.zeros(T, dtype=torch.int64), num_decodes=nd,
        num_decode_tokens=nd, num_prefills=2, num_prefill_tokens=T - nd,
        prefill=DeepseekV32IndexerPrefillMetadata([chunk]), decode=decode)
    buf = torch.full((T, TOPK), 7, dtype=torch.int32)
    out = run_op(meta, kv, q_fp8, w, buf)
    assert out is buf

    # prefill: what the top-k consumed is the compressed logits' content,
    # each row starting at its ks (float64 reference of the gathered keys)
    codes, scales = read_paged_cache(kv)
    k_rows, s_rows = [], []
    for r in range(2):
        pos = torch.arange(pre_ctx[r])
        phys = bt[nd + r, pos // BS].long()
        k_rows.append(codes[phys, pos % BS])
        s_rows.append(scales[phys, pos % BS])
    k_all, s_all = torch.cat(k_rows), torch.cat(s_rows)
    ref = ref_mqa_logits(q_fp8[nd:], k_all, s_all, w[nd:], ks, ke)
    (logits, rs, re_), = rec.prefill
    assert torch.equal(rs, ks) and torch.equal(re_, ke)
    width = int((ke - ks).max())
    comp = torch.full((T - nd, width), float("-inf"), dtype=torch.float64)
    comp_ref = torch.full_like(comp, float("-inf"))
    for r in range(T - nd):
        n = int(ke[r] - ks[r])
        comp[r, :n] = logits[r, ks[r]:ke[r]].double()
        comp_ref[r, :n] = ref[r, ks[r]:ke[r]]
    assert rel_err(comp, comp_ref) < LOGITS_TOL, rel_err(comp, comp_ref)
    # request-local top-k indices, as DeepGEMM's compressed rows give them
    check_topk(buf[nd:], comp_ref, TOPK)
    assert overlap(buf[nd:], comp_ref, TOPK) >= 0.99
    for r in range(T - nd):
        assert int(buf[nd + r].max()) < int(ke[r] - ks[r])  # causal, local

    # decode: paged logits against the float64 paged reference
    (dlogits, dlens), = rec.decode
    assert dlogits.shape == (nd, MAX_LEN)
    dref = ref_paged_mqa_logits(q_fp8[:nd].reshape(nd, 1, H, D), kv, w[:nd],
                                torch.tensor(dec_lens, dtype=torch.int32)[:, None],
                                bt[:nd], MAX_LEN)
    masked = torch.where(torch.isfinite(dref), dlogits.double(), dref)
    assert rel_err(masked, dref) < LOGITS_TOL, rel_err(masked, dref)
    check_topk(buf[:nd], dref, TOPK)
    assert overlap(buf[:nd], dref, TOPK) >= 0.99
    assert (buf[2, 5:] == -1).all() and set(buf[2, :5].tolist()) == set(range(5))


def test_padded_mtp_decode_packs_fp8_codes_as_bytes(rec):
    """next_n = 2 with one request decoding a single token: requires_padding,
    the query is packed as uint8 codes (vLLM's pack_seq_triton under the
    interpreter), logits per row over seq_lens (B, 2), top-k unpacked back."""
    dec_lens_tok = [2, 1, 2]
    ctx = [40, 33, 70]
    kv, bt = make_cache(ctx, seed=3)
    B = len(ctx)
    T = sum(dec_lens_tok)
    q_fp8, w = make_queries(T, seed=4, heads=H, dim=D)
    seq2d = torch.tensor([[c - 2 + j + 1 for j in range(2)] for c in ctx], dtype=torch.int32)
    decode = DeepSeekV32IndexerDecodeMetadata(
        block_table=bt, seq_lens=seq2d,
        decode_lens=torch.tensor(dec_lens_tok, dtype=torch.int32), requires_padding=True,
        schedule_metadata=torch.empty(0, 2, dtype=torch.int32))
    meta = DeepseekV32IndexerMetadata(
        seq_lens=torch.tensor(ctx, dtype=torch.int32), max_seq_len=max(ctx),
        slot_mapping=torch.zeros(T, dtype=torch.int64), num_decodes=B,
        num_decode_tokens=T, num_prefills=0, num_prefill_tokens=0, decode=decode)
    # weights are indexed per padded row (B * next_n)
    w_pad = torch.zeros(B * 2, H)
    q_pad = torch.zeros(B, 2, H, D, dtype=torch.float8_e4m3fn)
    t = 0
    for b, n in enumerate(dec_lens_tok):
        q_pad[b, :n] = q_fp8[t:t + n]
        t += n
    w_pad[:T] = w  # the op reads weights[:B * next_n] in token order
    buf = torch.full((B * 2, TOPK), 7, dtype=torch.int32)
    run_op(meta, kv, torch.cat([q_fp8, torch.zeros(1, H, D, dtype=q_fp8.dtype)]),
           w_pad, buf)
    (dlogits, dlens), = rec.decode
    assert torch.equal(dlens, seq2d.reshape(-1))
    dref = ref_paged_mqa_logits(q_pad, kv, w_pad[:B * 2], seq2d, bt, MAX_LEN)
    masked = torch.where(torch.isfinite(dref), dlogits.double(), dref)
    assert rel_err(masked, dref) < LOGITS_TOL, rel_err(masked, dref)
    # unpacked: token order, the padded slot dropped
    rows = [0, 1, 2, 4, 5]  # padded rows of the real tokens, in token order
    check_topk(buf[:T], dref[rows], TOPK)
    assert overlap(buf[:T], dref[rows], TOPK) >= 0.99

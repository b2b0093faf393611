"""GLM-5.3-Flash's pooled indexer op (sparse_attn_indexer_kpool in
vllm/models/glm5next/nvidia/sparse_indexer.py) on the Triton logits path
(capability 8.0, no DeepGEMM), under Triton's interpreter, against float64.

The pooled cache (one 132-byte entry per 4 tokens: a page's fp8 values,
then its fp32 scales) is written by vLLM's own kpool writer on the software
e4m3 encode; the op runs as the model calls it, with 16 index heads (no
padding on this path) and the kpool block size (32 pools per 128-token
block), index_topk 2048 (512 pools) into the 2176-wide top-k buffer: mixed
batches of decodes and a chunked prefill at 2-3k tokens and past 8k tokens
(up to 9,998: the top-512 pools of 2,000-2,500), and a padded MTP decode.
What runs for real: the op's Python (chunk loop, pool-granular row
bounds, the logits dispatch, the top-k calls, the padded-decode pack and
unpack), the Triton logits kernels, the pool expansion with the tail
(expand_pools_and_append_tail) and vLLM's pack/unpack kernels. Stood in: the
compiled gather and top-k ops (torch implementations in
indexer_op_standins.py, from the CUDA sources' semantics: top_k_per_row_prefill
returns indices relative to its row start, persistent_topk reads one length
per row), the forward context and the workspace manager.
"""
from __future__ import annotations

import pytest
import torch

from indexer_op_standins import Recorder, Workspace, forward_context, make_queries
from indexer_reference import (
    read_paged_cache,
    ref_mqa_logits,
    ref_paged_mqa_logits,
    rel_err,
    topk_rows,
)

import vllm._custom_ops as custom_ops
import vllm.models.glm5next.nvidia.sparse_indexer as ksi
from vllm.model_executor.layers import indexer_topk
from vllm.models.glm5next.nvidia.ops import kpool_compress as K
from vllm.v1.attention.backends.mla import indexer as idx
from vllm.v1.attention.backends.mla.indexer import (
    DeepseekV32IndexerMetadata,
    DeepseekV32IndexerPrefillChunkMetadata,
    DeepseekV32IndexerPrefillMetadata,
    DeepSeekV32IndexerDecodeMetadata,
)

H, D, KPOOL = 16, 128, 4
PAGE = 32  # pools per kernel block: the 128-token block at kpool 4
TOPK = 2048  # index_topk: 512 pools are selected
SELECT = TOPK // KPOOL
WIDTH = 2176  # the top-k buffer: round_up(TOPK + KPOOL - 1, 128)
MAX_POOLS = 1024  # max_model_len 4096 tokens
LONG_MAX_POOLS = 2560  # max_model_len 10240 tokens: the requests past 8k tokens
PREFIX = "model.layers.0.self_attn.indexer.k_cache"
LOGITS_TOL = 2e-6  # fp32 accumulation of exact fp8 products vs float64


@pytest.fixture
def rec(monkeypatch):
    r = Recorder(PAGE)
    monkeypatch.setattr(custom_ops, "cp_gather_indexer_k_quant_cache", r.gather)
    monkeypatch.setattr(torch.ops._C, "top_k_per_row_prefill", r.topk_prefill, raising=False)
    monkeypatch.setattr(torch.ops._C, "persistent_topk", r.persistent_topk, raising=False)
    monkeypatch.setattr(ksi, "current_workspace_manager", Workspace)
    monkeypatch.setattr(indexer_topk, "current_workspace_manager", Workspace)
    idx.select_sparse_indexer_logits.cache_clear()
    indexer_topk.get_indexer_topk.cache_clear()
    yield r
    idx.select_sparse_indexer_logits.cache_clear()
    indexer_topk.get_indexer_topk.cache_clear()


WRITTEN = 40  # pools per request written by vLLM's kpool writer


def cache_views(kv):
    """Writable (codes [nb, PAGE, D] uint8, scales [nb, PAGE] fp32) views of
    the pooled cache: a page holds its PAGE * D codes, then PAGE scales."""
    flat = kv.view(kv.shape[0], -1)
    codes = flat[:, :PAGE * D].view(kv.shape[0], PAGE, D)
    return codes, flat[:, PAGE * D:].view(torch.float32)


def make_pooled_cache(lens, seed, max_pools=MAX_POOLS):
    """The pooled indexer cache (garbage outside the requests' entries),
    each request's complete pools in shuffled blocks: its first WRITTEN pools
    written by vLLM's kpool writer (software e4m3 encode), the others random
    finite fp8 codes and scales (the interpreter runs one writer program per
    pool); returns (cache, block table)."""
    g = torch.Generator().manual_seed(seed)
    max_blocks = max_pools // PAGE
    nblocks = len(lens) * max_blocks + 3
    kv = torch.randint(0, 256, (nblocks, PAGE, D + 4), dtype=torch.uint8, generator=g)
    codes, scales = cache_views(kv)
    scales.copy_(torch.rand(scales.shape, generator=g))
    perm = torch.randperm(nblocks, generator=g).tolist()
    bt = torch.zeros(len(lens), max_blocks, dtype=torch.int32)
    for b, L in enumerate(lens):
        bt[b] = torch.tensor([perm.pop() for _ in range(max_blocks)], dtype=torch.int32)
        j = torch.arange(L // KPOOL)
        phys, slot = bt[b, j // PAGE].long(), j % PAGE
        mag = torch.randint(0, 0x7F, (j.numel(), D), dtype=torch.uint8, generator=g)
        codes[phys, slot] = mag | (torch.randint(0, 2, mag.shape, generator=g) * 0x80).to(torch.uint8)
        scales[phys, slot] = torch.rand(j.numel(), generator=g) * 1e-2
        n = min(WRITTEN, L // KPOOL)
        keys = torch.randn(n, KPOOL, D, generator=g) * (1 + 3 * torch.rand(n, 1, 1, generator=g))
        gate = torch.randn(n, KPOOL, D, generator=g)
        ape = torch.randn(KPOOL, D, generator=g)
        j = torch.arange(n)
        loc = bt[b, j // PAGE].long() * PAGE + j % PAGE
        K.kpool_compress_and_write_cache(kv, keys.to(torch.bfloat16), gate.to(torch.bfloat16),
                                         ape, loc, KPOOL)
    return kv, bt


def request_pools(kv, bt_row, n):
    """(codes [n, D], scales [n]) of a request's first n pools."""
    codes, scales = read_paged_cache(kv)
    j = torch.arange(n)
    phys = bt_row[j // PAGE].long()
    return codes[phys, j % PAGE], scales[phys, j % PAGE]


def run_op(meta, kv, q_fp8, w, positions, buf, max_pools=MAX_POOLS):
    with forward_context(ksi, PREFIX, meta):
        return ksi.sparse_attn_indexer_kpool(
            torch.empty(q_fp8.shape[0], 8), PREFIX, kv, q_fp8, None, None, w,
            128, "ue8m0", TOPK, D, max_pools, 4 * max_pools, buf,
            True,  # skip_k_cache_insert: the cache is written above
            index_kpool=KPOOL, positions=positions, logits_backend="auto",
        )


def check_row(row, ref_logits, seq_len):
    """One top-k buffer row against the float64 pool logits of its query
    (finite over its complete pools): the expanded tokens of the SELECT best
    pools (set equality up to near-ties at the SELECT-th value), then the
    tail tokens [4 * (seq_len // 4), seq_len), then -1 to the buffer's end."""
    hist = row[:TOPK].tolist()
    got = {x for x in hist if x >= 0}
    assert len(got) == len(hist) - hist.count(-1)
    pools = {x // KPOOL for x in got}
    assert got == {p * KPOOL + i for p in pools for i in range(KPOOL)}, "whole pools"
    want = {x for x in topk_rows(ref_logits[None], SELECT)[0].tolist() if x >= 0}
    assert len(pools) == len(want)
    if pools != want:
        kth = ref_logits[list(want)].min()
        tol = 1e-5 * ref_logits[torch.isfinite(ref_logits)].abs().max()
        assert all(abs(ref_logits[p] - kth) <= tol for p in pools ^ want), pools ^ want
    start = seq_len // KPOOL * KPOOL
    tail = list(range(start, seq_len)) + [-1] * (KPOOL - 1 - (seq_len - start))
    assert row[TOPK:TOPK + KPOOL - 1].tolist() == tail
    assert (row[TOPK + KPOOL - 1:] == -1).all()


def test_capability_80_takes_triton(rec):
    assert idx.select_sparse_indexer_logits("auto") == (
        "triton", "DeepGEMM has no MQA-logits kernels for sm80")


def run_mixed_batch(rec, dec_lens, pre_ctx, pre_q, seed, max_pools=MAX_POOLS):
    """Decode requests of dec_lens tokens (one query each), then prefill
    requests in one chunk: the last pre_q[i] tokens of a pre_ctx[i]-token
    context each; the op's top-k buffer, every row checked against float64.
    Returns the buffer (decode rows first)."""
    lens = dec_lens + pre_ctx
    kv, bt = make_pooled_cache(lens, seed=seed, max_pools=max_pools)
    nd = len(dec_lens)
    T = nd + sum(pre_q)
    q_fp8, w = make_queries(T, seed=seed + 1, heads=H, dim=D)
    positions = [L - 1 for L in dec_lens]
    ks, ke, off, cu = [], [], 0, [0]
    for c, ql in zip(pre_ctx, pre_q):
        for p in range(c - ql, c):
            positions.append(p)
            ks.append(off)
            ke.append(off + (p + 1) // KPOOL)  # the pools complete at p
        off += c // KPOOL
        cu.append(off)
    positions = torch.tensor(positions, dtype=torch.int64)
    ks = torch.tensor(ks, dtype=torch.int32)
    ke = torch.tensor(ke, dtype=torch.int32)
    cu = torch.tensor(cu, dtype=torch.int32)
    chunk = DeepseekV32IndexerPrefillChunkMetadata(
        block_table=bt[nd:], cu_seqlen_ks=ks, cu_seqlen_ke=ke, cu_seq_lens=cu,
        token_to_seq=torch.zeros(off, dtype=torch.int32), total_seq_lens=off,
        max_seqlen_k=int((ke - ks).max()), token_start=nd, token_end=T, num_reqs=len(pre_ctx),
        local_cu_seq_lens=cu, local_total_seq_lens=off, max_local_total_seq_lens=off)
    decode = DeepSeekV32IndexerDecodeMetadata(
        block_table=bt[:nd],
        seq_lens=torch.tensor([L // KPOOL for L in dec_lens], dtype=torch.int32)[:, None],
        decode_lens=torch.ones(nd, dtype=torch.int32), requires_padding=False,
        schedule_metadata=torch.empty(0, 2, dtype=torch.int32))
    meta = DeepseekV32IndexerMetadata(
        seq_lens=torch.tensor(lens, dtype=torch.int32), max_seq_len=max(lens),
        slot_mapping=torch.zeros(T, dtype=torch.int64), num_decodes=nd,
        num_decode_tokens=nd, num_prefills=len(pre_ctx), num_prefill_tokens=T - nd,
        prefill=DeepseekV32IndexerPrefillMetadata([chunk], max_prefill_seq_len=max(pre_ctx)),
        decode=decode)
    buf = torch.full((T, WIDTH), 7, dtype=torch.int32)
    out = run_op(meta, kv, q_fp8, w, positions, buf, max_pools)
    assert out is buf

    # prefill: the logits the top-k read, by absolute pool column, bounded
    # by each row's [ks, ke), against the float64 logits of the gathered pools
    k_rows, s_rows = zip(*(request_pools(kv, bt[nd + r], c // KPOOL)
                           for r, c in enumerate(pre_ctx)))
    ref = ref_mqa_logits(q_fp8[nd:], torch.cat(k_rows), torch.cat(s_rows), w[nd:], ks, ke)
    (logits, rs, re_), = rec.prefill
    assert torch.equal(rs, ks) and torch.equal(re_, ke)
    masked = torch.where(torch.isfinite(ref), logits.double(), ref)
    assert rel_err(masked, ref) < LOGITS_TOL, rel_err(masked, ref)
    for r in range(T - nd):
        check_row(buf[nd + r], ref[r, ks[r]:ke[r]], int(positions[nd + r]) + 1)

    # decode: the paged pooled logits against the float64 paged reference
    (dlogits, dlens), = rec.decode
    assert dlogits.shape == (nd, max_pools)
    assert dlens.tolist() == [L // KPOOL for L in dec_lens]
    dref = ref_paged_mqa_logits(q_fp8[:nd].reshape(nd, 1, H, D), kv, w[:nd],
                                decode.seq_lens, bt[:nd], max_pools)
    masked = torch.where(torch.isfinite(dref), dlogits.double(), dref)
    assert rel_err(masked, dref) < LOGITS_TOL, rel_err(masked, dref)
    for r, L in enumerate(dec_lens):
        check_row(buf[r], dref[r, :L // KPOOL], L)
    return buf


def test_mixed_batch_pooled_prefill_and_paged_decode(rec):
    # 3 decode requests (3001, 2300 and 93 tokens), then 2 prefill requests
    # in one chunk: the last 6 tokens of a 2203-token context (chunked
    # prefill) and a whole 90-token prompt (its first rows see no pool)
    run_mixed_batch(rec, [3001, 2300, 93], [2203, 90], [6, 90], seed=1)


def test_past_8k_tokens_the_pool_topk_drops_pools(rec):
    """Requests past 8k tokens (max_model_len 10240: 2560 pools a row): a
    decode at 8,203 tokens (2,050 complete pools, 3 tail tokens) and one at
    9,998 (2,499 pools, 2 tail tokens), where the top-512 pools leave most
    pools out, and a 517-token decode (129 pools: all taken, then -1 holes);
    a chunk of a 41-token context's last 3 tokens, then the last 7 tokens of
    an 8,195-token context (chunked prefill: its rows' pool counts 2,047 ->
    2,048 across token 8,192, their tails 0-3 tokens, its columns starting
    at the first request's 10 pools)."""
    dec_lens, pre_ctx, pre_q = [8203, 9998, 517], [41, 8195], [3, 7]
    buf = run_mixed_batch(rec, dec_lens, pre_ctx, pre_q, seed=5, max_pools=LONG_MAX_POOLS)
    rows = {"decode 8203": (buf[0], 8203), "decode 9998": (buf[1], 9998)}
    rows.update({f"prefill row {p}": (buf[len(dec_lens) + 3 + i], p + 1)
                 for i, p in enumerate(range(8188, 8195))})
    for what, (row, L) in rows.items():
        hist = row[:TOPK]
        # the selection drops pools: 512 of more than 2,000, each expanded to
        # its 4 tokens, no hole; some reach past token 4096 (the old window)
        assert L // KPOOL > 3 * SELECT and (hist >= 0).all(), what
        assert int(hist.max()) >= 4096, what
    small = buf[2, :TOPK]  # 129 pools < 512: every pool, then holes
    assert sorted(small[small >= 0].tolist()) == list(range(4 * 129))
    assert (small[4 * 129:] == -1).all()


def test_padded_mtp_decode_packs_fp8_codes_as_bytes(rec):
    """next_n = 2 with one request verifying a single token: requires_padding,
    the query packed as uint8 codes and the weights packed (vLLM's
    pack_seq_triton under the interpreter), per-row pool counts (B, 2), the
    pool top-k expanded with each token's own tail and unpacked back."""
    n_tok = [2, 1, 2]
    ctx = [2170, 2133, 3054]  # tokens, the step's included
    B, T = len(ctx), sum(n_tok)
    kv, bt = make_pooled_cache(ctx, seed=3)
    q_fp8, w = make_queries(T, seed=4, heads=H, dim=D)
    positions, seq2d = [], []
    for c, n in zip(ctx, n_tok):
        pos = [c - n + j for j in range(n)]
        positions += pos
        # padded rows (past the request's tokens) repeat its last length
        seq2d.append([(p + 1) // KPOOL for p in pos] + [c // KPOOL] * (2 - n))
    positions = torch.tensor(positions, dtype=torch.int64)
    seq2d = torch.tensor(seq2d, dtype=torch.int32)
    decode = DeepSeekV32IndexerDecodeMetadata(
        block_table=bt, seq_lens=seq2d,
        decode_lens=torch.tensor(n_tok, dtype=torch.int32), requires_padding=True,
        schedule_metadata=torch.empty(0, 2, dtype=torch.int32))
    meta = DeepseekV32IndexerMetadata(
        seq_lens=torch.tensor(ctx, dtype=torch.int32), max_seq_len=max(ctx),
        slot_mapping=torch.zeros(T, dtype=torch.int64), num_decodes=B,
        num_decode_tokens=T, num_prefills=0, num_prefill_tokens=0, decode=decode)
    q_pad = torch.zeros(B, 2, H, D, dtype=torch.float8_e4m3fn)
    w_pad = torch.zeros(B * 2, H)
    rows, t = [], 0  # padded rows of the real tokens, in token order
    for b, n in enumerate(n_tok):
        q_pad[b, :n] = q_fp8[t:t + n]
        w_pad[2 * b:2 * b + n] = w[t:t + n]
        rows += [2 * b + j for j in range(n)]
        t += n
    buf = torch.full((T, WIDTH), 7, dtype=torch.int32)
    run_op(meta, kv, q_fp8, w, positions, buf)
    (dlogits, dlens), = rec.decode
    assert torch.equal(dlens, seq2d.reshape(-1))
    dref = ref_paged_mqa_logits(q_pad, kv, w_pad, seq2d, bt, MAX_POOLS)
    masked = torch.where(torch.isfinite(dref), dlogits.double(), dref)
    assert rel_err(masked, dref) < LOGITS_TOL, rel_err(masked, dref)
    for t, r in enumerate(rows):
        L = int(positions[t]) + 1
        check_row(buf[t], dref[r, :L // KPOOL], L)

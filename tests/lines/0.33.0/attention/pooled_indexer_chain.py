"""GLM-5.3-Flash's pooled indexer op filling the layer-level check's top-k buffer (layer_interpret_033.py,
case glm-5.3-flash): the chain the model runs before its DSA attention, pooled logits -> top-512 pools ->
expand_pools_and_append_tail -> the buffer the attention reads.

Imported by layer_interpret_033.py after the toolkit's stand-ins (capability 8.6): vLLM 0.33.0's
sparse_attn_indexer_kpool (vllm/models/glm5next/nvidia/sparse_indexer.py) runs as the model calls it,
on our Triton logits (no DeepGEMM below sm90), under Triton's interpreter: the paged pooled logits of the
decode rows (the spec-decode row padded to next_n 3, the fp8 codes packed as bytes), the top-k dispatch,
the pool expansion with each token's tail, the unpack; the prefill (160 tokens, within index_topk) takes
the op's causal fill, as it does in the model.  Stood in, as in tests/lines/0.33.0/indexer/
test_kpool_indexer_op.py: the compiled top-k (persistent_topk: torch.topk over each row's length), the
forward context and the workspace; vllm.models.glm5next as a bare package (its __init__ imports the whole
model, whose multimodal part needs torchvision).  The pooled cache holds random finite fp8 codes and
scales (vLLM's kpool writer is checked bit for bit by the indexer proofs); every decode row's pools are
checked against the float64 pooled logits (tests/indexer_reference.py), its tail and -1 entries exactly.
"""
from __future__ import annotations

import sys
import types
from pathlib import Path

import torch

from indexer_reference import quant_q, ref_paged_mqa_logits, topk_rows

H, D, PAGE = 16, 128, 32  # index heads, index head dim, pools per 128-token kernel block
PREFIX = "model.layers.0.self_attn.indexer.k_cache"


def _import_op(tree: str):
    import vllm.models

    if "vllm.models.glm5next" not in sys.modules:
        pkg = types.ModuleType("vllm.models.glm5next")
        pkg.__path__ = [str(Path(tree) / "vllm" / "models" / "glm5next")]
        sys.modules[pkg.__name__] = vllm.models.glm5next = pkg
    import vllm.models.glm5next.nvidia.sparse_indexer as ksi
    from vllm.model_executor.layers import indexer_topk

    return ksi, indexer_topk


def _persistent_topk(logits, lengths, out, workspace, k, max_seq_len):
    """torch stand-in for torch.ops._C.persistent_topk (csrc/topk.cu): per row, the indices of the k
    largest of logits[r, :lengths[r]], -1 past a short row's length."""
    lens = lengths.reshape(-1)
    assert lens.numel() == logits.shape[0], "one length per row"
    for r in range(logits.shape[0]):
        n = int(lens[r])
        out[r] = -1
        if n > 0:
            out[r, : min(k, n)] = torch.topk(logits[r, :n], min(k, n)).indices.to(torch.int32)


def _unreached(*args, **kwargs):
    raise AssertionError("a scored prefill: not in this batch (its prefill is within index_topk)")


class _Workspace:
    def get_simultaneous(self, *specs):
        return [torch.empty(shape, dtype=dtype) for shape, dtype in specs]


def indexer_topk_buffer(tree, requests, geom, gen, decode_max_query, rows=512):
    """Run the op on this batch (decodes first: query length <= decode_max_query) and return its top-k
    buffer [rows, width] after checking it; also a summary line."""
    ksi, indexer_topk = _import_op(tree)
    from vllm.config import CUDAGraphMode
    from vllm.v1.attention.backends.mla.indexer import (
        DeepseekV32IndexerMetadata,
        DeepseekV32IndexerPrefillMetadata,
        DeepSeekV32IndexerDecodeMetadata,
    )

    topk_tokens, width, kpool = geom["index_topk"], geom["width"], geom["kpool"]
    max_pools = geom["max_model_len"] // kpool
    select = topk_tokens // kpool
    torch.ops._C.persistent_topk = _persistent_topk
    torch.ops._C.top_k_per_row_prefill = _unreached
    ksi.current_workspace_manager = _Workspace
    indexer_topk.current_workspace_manager = _Workspace
    assert ksi.select_sparse_indexer_logits("auto")[0] == "triton"

    # the pooled cache: each request's complete pools in shuffled 32-pool blocks
    max_blocks = max_pools // PAGE
    nblocks = len(requests) * max_blocks + 3
    kv = torch.randint(0, 256, (nblocks, PAGE, D + 4), dtype=torch.uint8, generator=gen)
    flat = kv.view(nblocks, -1)
    codes = flat[:, : PAGE * D].view(nblocks, PAGE, D)
    scales = flat[:, PAGE * D:].view(torch.float32)
    scales.copy_(torch.rand(scales.shape, generator=gen))
    perm = torch.randperm(nblocks, generator=gen).tolist()
    bt = torch.zeros(len(requests), max_blocks, dtype=torch.int32)
    for r, (_, sl) in enumerate(requests):
        bt[r] = torch.tensor([perm.pop() for _ in range(max_blocks)], dtype=torch.int32)
        j = torch.arange(sl // kpool)
        phys, slot = bt[r, j // PAGE].long(), j % PAGE
        mag = torch.randint(0, 0x7F, (j.numel(), D), dtype=torch.uint8, generator=gen)
        sign = (torch.randint(0, 2, mag.shape, generator=gen) * 0x80).to(torch.uint8)
        codes[phys, slot] = mag | sign
        scales[phys, slot] = torch.rand(j.numel(), generator=gen) * 1e-2

    dec = [(r, ql, sl) for r, (ql, sl) in enumerate(requests) if ql <= decode_max_query]
    pre = [(r, ql, sl) for r, (ql, sl) in enumerate(requests) if ql > decode_max_query]
    assert [r for r, *_ in dec] == list(range(len(dec))), "decodes first"
    T = sum(ql for ql, _ in requests)
    nd_tok = sum(ql for _, ql, _ in dec)
    next_n = max(ql for _, ql, _ in dec)
    positions = torch.tensor([sl - ql + i for ql, sl in requests for i in range(ql)], dtype=torch.int64)
    q_fp8, w = quant_q(torch.randn(T, H, D, generator=gen), torch.randn(T, H, generator=gen),
                       D ** -0.5, H ** -0.5)
    seq2d = torch.tensor([[(sl - ql + i + 1) // kpool for i in range(ql)] + [sl // kpool] * (next_n - ql)
                          for _, ql, sl in dec], dtype=torch.int32)
    decode_lens = torch.tensor([ql for _, ql, _ in dec], dtype=torch.int32)
    decode = DeepSeekV32IndexerDecodeMetadata(
        block_table=bt[: len(dec)], seq_lens=seq2d, decode_lens=decode_lens,
        requires_padding=bool((decode_lens != next_n).any()),
        schedule_metadata=torch.empty(0, 2, dtype=torch.int32))
    prefill = DeepseekV32IndexerPrefillMetadata([], max_prefill_seq_len=max(sl for *_, sl in pre))
    meta = DeepseekV32IndexerMetadata(
        seq_lens=torch.tensor([sl for _, sl in requests], dtype=torch.int32),
        max_seq_len=max(sl for _, sl in requests), slot_mapping=torch.zeros(T, dtype=torch.int64),
        num_decodes=len(dec), num_decode_tokens=nd_tok, num_prefills=len(pre),
        num_prefill_tokens=T - nd_tok, prefill=prefill, decode=decode)
    buf = torch.full((rows, width), 7, dtype=torch.int32)
    buf[T:] = -1  # rows past the batch: -1 as the model's buffer is made
    ctx = types.SimpleNamespace(attn_metadata={PREFIX: meta}, cudagraph_runtime_mode=CUDAGraphMode.NONE)
    ksi.get_forward_context = lambda: ctx
    out = ksi.sparse_attn_indexer_kpool(
        torch.empty(T, 8), PREFIX, kv, q_fp8, None, None, w, 128, "ue8m0", topk_tokens, D, max_pools,
        4 * max_pools, buf, True,  # skip_k_cache_insert: the cache is filled above
        index_kpool=kpool, positions=positions, logits_backend="auto")
    assert out is buf

    # decode rows against the float64 pooled logits (padded rows of the real tokens)
    q_pad = torch.zeros(len(dec), next_n, H, D, dtype=torch.float8_e4m3fn)
    w_pad = torch.zeros(len(dec) * next_n, H)
    t, pad_rows = 0, []
    for b, (_, ql, _) in enumerate(dec):
        q_pad[b, :ql] = q_fp8[t:t + ql]
        w_pad[b * next_n: b * next_n + ql] = w[t:t + ql]
        pad_rows += [b * next_n + i for i in range(ql)]
        t += ql
    ref = ref_paged_mqa_logits(q_pad, kv, w_pad, seq2d, bt[: len(dec)], max_pools)
    dropped = tails = holes = 0
    for t, pr in enumerate(pad_rows):
        seq_len = int(positions[t]) + 1
        n = seq_len // kpool
        row = buf[t]
        hist = row[:topk_tokens].tolist()
        got = [x for x in hist if x >= 0]
        pools = {x // kpool for x in got}
        assert set(got) == {p * kpool + i for p in pools for i in range(kpool)}, "whole pools"
        assert hist[: len(got)] == got and len(got) == kpool * min(n, select), "pools first, then -1"
        want = set(topk_rows(ref[pr, :n][None], select)[0].tolist()) - {-1}
        if pools != want:  # near-ties at the select-th value only
            kth = ref[pr, list(want)].min()
            tol = 1e-5 * ref[pr, :n].abs().max()
            assert all(abs(ref[pr, p] - kth) <= tol for p in pools ^ want), pools ^ want
        start = n * kpool
        tail = list(range(start, seq_len)) + [-1] * (kpool - 1 - (seq_len - start))
        assert row[topk_tokens: topk_tokens + kpool - 1].tolist() == tail
        assert (row[topk_tokens + kpool - 1:] == -1).all()
        dropped = max(dropped, n - len(pools))
        tails += int(seq_len > start)
        holes += int(seq_len > start and len(got) < topk_tokens)
    # prefill rows: the op's causal fill (the prefill is within index_topk)
    for t in range(nd_tok, T):
        pos = int(positions[t])
        assert buf[t, : pos + 1].tolist() == list(range(pos + 1)) and (buf[t, pos + 1:] == -1).all()
    L = requests[0][1]
    line = (f"width {width}, index_topk {topk_tokens}; the {L}-token decode: {select} of {L // kpool} "
            f"pools (float64 top-{select}) + {L % kpool} tail tokens; {tails} decode rows with tail "
            f"tokens past index_topk, {holes} of them after -1 holes; the {pre[0][2]}-token prefill's "
            f"rows causal")
    assert dropped == L // kpool - select > 0 and holes > 0
    return buf, line

"""GPU test of the TRITON_MLA_SPARSE backend through vLLM's metadata builder.

Drives TritonMLASparseMetadataBuilder.build and TritonMLASparseImpl.forward_mqa
on a synthetic batch that mixes decode and prefill requests (the
CommonAttentionMetadata is built by hand) and compares with the float64
reference of tests/sparse_mla_reference.py.

Stand-ins (this test relies on them; see tools/selection.py):
- vllm._C and vllm.vllm_flash_attn are stood in for by import_vllm_tree()
  (neither is called on this path);
- the VllmConfig handed to the builder is a SimpleNamespace with only the
  fields the builder reads (model_config.hf_config.index_topk,
  scheduler_config.max_num_batched_tokens), the KV-cache spec is a
  SimpleNamespace(block_size=64), and the DSA indexer is a SimpleNamespace
  holding topk_indices_buffer, filled by the test instead of by the indexer.
Run in a pytest process without TRITON_INTERPRET (make test-gpu).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sparse_mla_reference import (  # noqa: E402
    reference_convert,
    reference_sparse_mla,
    rel_err,
)
from tools.selection import import_vllm_tree  # noqa: E402

pytestmark = pytest.mark.gpu

BLOCK = 64
TOPK = 2048
LORA, ROPE = 512, 64
BOUNDS = {torch.float16: 1e-3, torch.bfloat16: 5e-3}
# (query_len, seq_len) per request; decodes first as vLLM orders them, then
# a chunked prefill with context, a fresh short prefill and a long prefill.
REQUESTS = [(1, 3000), (1, 700), (1, 2049), (5, 2100), (4, 4), (37, 2600)]


@pytest.fixture(scope="module")
def backend_mod(vllm_tree):
    if os.environ.get("TRITON_INTERPRET", "0") not in ("0", ""):
        pytest.skip("TRITON_INTERPRET is set in this process")
    import_vllm_tree(vllm_tree)
    from vllm.v1.attention.backends.mla import triton_mla_sparse

    return triton_mla_sparse


def _batch(dtype, heads, device, gen):
    num_reqs = len(REQUESTS)
    q_lens = [q for q, _ in REQUESTS]
    seq_lens = [s for _, s in REQUESTS]
    T = sum(q_lens)
    max_blocks = max((s + BLOCK - 1) // BLOCK for s in seq_lens)
    num_blocks = num_reqs * max_blocks + 3
    perm = torch.randperm(num_blocks, generator=gen)
    block_table = perm[: num_reqs * max_blocks].view(num_reqs, max_blocks)
    block_table = block_table.to(torch.int32)

    kv_cache = (torch.randn(num_blocks, BLOCK, LORA + ROPE, generator=gen) * 0.5)
    q = torch.randn(T, heads, LORA + ROPE, generator=gen) * 0.5

    # Request-local top-k per token: causal positions, -1 padded.
    topk = torch.full((T, TOPK), -1, dtype=torch.int32)
    req_id = []
    slot_mapping = []
    t = 0
    for r, (ql, sl) in enumerate(REQUESTS):
        for i in range(ql):
            pos = sl - ql + i  # absolute position of this query token
            n = min(TOPK, pos + 1)
            sel = torch.randperm(pos + 1, generator=gen)[:n].to(torch.int32)
            topk[t, :n] = sel
            req_id.append(r)
            blk = int(block_table[r, pos // BLOCK])
            slot_mapping.append(blk * BLOCK + pos % BLOCK)
            t += 1

    qsl = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    return dict(
        q=q.to(device, dtype), kv_cache=kv_cache.to(device, dtype),
        block_table=block_table.to(device), topk=topk, T=T,
        query_start_loc_cpu=qsl, seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        req_id=torch.tensor(req_id, dtype=torch.int32),
        slot_mapping=torch.tensor(slot_mapping, dtype=torch.int64),
        max_query_len=max(q_lens), max_seq_len=max(seq_lens),
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16],
                         ids=["float16", "bfloat16"])
@pytest.mark.parametrize("heads", [16, 64, 128])
def test_forward_mqa_mixed_batch_with_stand_ins(backend_mod, dtype, heads):
    from vllm.v1.attention.backend import CommonAttentionMetadata

    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(1234 + heads)
    b = _batch(dtype, heads, device, gen)
    max_tokens = 256

    vllm_config = SimpleNamespace(
        model_config=SimpleNamespace(hf_config=SimpleNamespace(index_topk=TOPK)),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=max_tokens),
    )
    builder = backend_mod.TritonMLASparseMetadataBuilder(
        SimpleNamespace(block_size=BLOCK), ["layer.0"], vllm_config, device)
    cm = CommonAttentionMetadata(
        query_start_loc=b["query_start_loc_cpu"].to(device),
        query_start_loc_cpu=b["query_start_loc_cpu"],
        seq_lens=b["seq_lens"].to(device),
        num_reqs=len(REQUESTS),
        num_actual_tokens=b["T"],
        max_query_len=b["max_query_len"],
        max_seq_len=b["max_seq_len"],
        block_table_tensor=b["block_table"],
        slot_mapping=b["slot_mapping"].to(device),
    )
    md = builder.build(common_prefix_len=0, common_attn_metadata=cm)
    assert torch.equal(md.req_id_per_token.cpu(), b["req_id"])

    topk_buffer = torch.full((max_tokens, TOPK), -1, dtype=torch.int32,
                             device=device)
    topk_buffer[: b["T"]] = b["topk"].to(device)
    indexer = SimpleNamespace(topk_indices_buffer=topk_buffer)
    scale = (192 + ROPE) ** -0.5
    impl = backend_mod.TritonMLASparseImpl(
        num_heads=heads, head_size=LORA + ROPE, scale=scale, num_kv_heads=1,
        alibi_slopes=None, sliding_window=None, kv_cache_dtype="auto",
        logits_soft_cap=None, attn_type="decoder",
        kv_sharing_target_layer_name=None,
        q_lora_rank=2048, kv_lora_rank=LORA, qk_nope_head_dim=192,
        qk_rope_head_dim=ROPE, qk_head_dim=192 + ROPE, v_head_dim=256,
        kv_b_proj=None, indexer=indexer,
    )
    q = b["q"]
    out, lse = impl.forward_mqa((q[..., :LORA], q[..., LORA:]), b["kv_cache"],
                                md, layer=None)
    assert lse is None
    assert out.shape == (b["T"], heads, LORA) and out.dtype == dtype

    slots = reference_convert(b["req_id"], b["block_table"].cpu(), b["topk"],
                              BLOCK).to(device)
    ref = reference_sparse_mla(q, b["kv_cache"], slots, scale,
                               kv_lora_rank=LORA, token_chunk=8)
    err = rel_err(out, ref)
    assert err < BOUNDS[dtype], f"rel_err {err:.3e}"

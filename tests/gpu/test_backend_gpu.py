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
from smla.selection import import_vllm_tree  # noqa: E402

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


def _make_impl(backend_mod, heads, scale, indexer):
    """TritonMLASparseImpl with GLM-5's MLA geometry; `indexer` is a stand-in
    holding only topk_indices_buffer."""
    return backend_mod.TritonMLASparseImpl(
        num_heads=heads, head_size=LORA + ROPE, scale=scale, num_kv_heads=1,
        alibi_slopes=None, sliding_window=None, kv_cache_dtype="auto",
        logits_soft_cap=None, attn_type="decoder",
        kv_sharing_target_layer_name=None,
        q_lora_rank=2048, kv_lora_rank=LORA, qk_nope_head_dim=192,
        qk_rope_head_dim=ROPE, qk_head_dim=192 + ROPE, v_head_dim=256,
        kv_b_proj=None, indexer=indexer,
    )


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
    impl = _make_impl(backend_mod, heads, scale, indexer)
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


# --- CUDA graphs -----------------------------------------------------------
# TritonMLASparseMetadataBuilder declares AttentionCGSupport.ALWAYS.  The test
# below captures forward_mqa once on a mixed batch and replays it after
# writing new contents (q, KV cache, block table, top-k with -1 holes, a
# different request layout of the same token count, padded requests as the
# model runner pads them) into the same persistent buffers.
GRAPH_T = 49  # tokens per step (the capture size); every layout sums to it
GRAPH_MAX_REQS = 8
GRAPH_MAX_BLOCKS = 80  # persistent block-table width (seq_len <= 5120)
# Each round: (query_len, seq_len) per real request, and padding tokens at
# the end (vLLM: query_start_loc repeats its last value for the padded
# requests, their block-table rows are -1, padding tokens map to request 0).
GRAPH_ROUNDS = [
    (REQUESTS, 0),  # the capture layout
    ([(1, 1500), (1, 5000), (1, 90), (1, 2048), (45, 3000)], 0),
    ([(20, 2500), (7, 7), (1, 1), (18, 2070)], 3),
    ([(46, 4100)], 3),
]


def _graph_step_inputs(layout, pad, heads, gen):
    """Host-side contents for one graph step (see GRAPH_ROUNDS)."""
    num_reqs = len(layout)
    q_lens = [q for q, _ in layout]
    real = sum(q_lens)
    assert real + pad == GRAPH_T and num_reqs < GRAPH_MAX_REQS
    num_blocks = GRAPH_MAX_REQS * GRAPH_MAX_BLOCKS + 3
    bt = torch.randperm(num_blocks, generator=gen)[: GRAPH_MAX_REQS * GRAPH_MAX_BLOCKS]
    bt = bt.view(GRAPH_MAX_REQS, GRAPH_MAX_BLOCKS).to(torch.int32)
    num_reqs_padded = num_reqs + (1 if pad else 0)
    bt[num_reqs:num_reqs_padded] = -1  # as _get_block_table pads
    topk = torch.full((GRAPH_T, TOPK), -1, dtype=torch.int32)
    req_id, slot_mapping = [], []
    t = 0
    for r, (ql, sl) in enumerate(layout):
        for i in range(ql):
            pos = sl - ql + i
            n = min(TOPK, pos + 1)
            row = torch.full((TOPK,), -1, dtype=torch.int32)
            row[:n] = torch.randperm(pos + 1, generator=gen)[:n].to(torch.int32)
            # -1 holes anywhere in the row, not only a -1 tail
            holes = torch.rand(TOPK, generator=gen) < 0.15
            row[holes] = -1
            topk[t] = row[torch.randperm(TOPK, generator=gen)]
            req_id.append(r)
            slot_mapping.append(int(bt[r, pos // BLOCK]) * BLOCK + pos % BLOCK)
            t += 1
    if real > 2:
        topk[real // 2] = -1  # one token with no valid slot: output zeros
    # Padding tokens: whatever the indexer left there (random positions).
    topk[real:] = torch.randint(-1, 4096, (pad, TOPK), generator=gen,
                                dtype=torch.int32)
    slot_mapping += [-1] * pad
    qsl = [0] + torch.tensor(q_lens).cumsum(0).tolist() + [real] * (num_reqs_padded - num_reqs)
    seq_lens = [s for _, s in layout] + [0] * (num_reqs_padded - num_reqs)
    return dict(
        num_reqs=num_reqs_padded, real=real, block_table=bt, topk=topk,
        req_id=torch.tensor(req_id, dtype=torch.int32),
        slot_mapping=torch.tensor(slot_mapping, dtype=torch.int64),
        qsl=torch.tensor(qsl, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        max_query_len=max(q_lens), max_seq_len=max(s for _, s in layout),
        q=torch.randn(GRAPH_T, heads, LORA + ROPE, generator=gen) * 0.5,
        kv=torch.randn(num_blocks, BLOCK, LORA + ROPE, generator=gen) * 0.5,
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16],
                         ids=["float16", "bfloat16"])
@pytest.mark.parametrize("heads", [16, 64])
def test_cuda_graph_capture_replay_mixed_batch_with_stand_ins(backend_mod, dtype, heads):
    from vllm.v1.attention.backend import AttentionCGSupport, CommonAttentionMetadata

    builder_cls = backend_mod.TritonMLASparseMetadataBuilder
    assert builder_cls._cudagraph_support == AttentionCGSupport.ALWAYS
    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(4321 + heads)
    max_tokens = 256
    num_blocks = GRAPH_MAX_REQS * GRAPH_MAX_BLOCKS + 3

    # Persistent buffers (what the model runner / model own in vLLM).
    q_buf = torch.zeros(GRAPH_T, heads, LORA + ROPE, dtype=dtype, device=device)
    kv_buf = torch.zeros(num_blocks, BLOCK, LORA + ROPE, dtype=dtype, device=device)
    bt_buf = torch.zeros(GRAPH_MAX_REQS, GRAPH_MAX_BLOCKS, dtype=torch.int32, device=device)
    qsl_buf = torch.zeros(GRAPH_MAX_REQS + 1, dtype=torch.int32, device=device)
    seq_buf = torch.zeros(GRAPH_MAX_REQS, dtype=torch.int32, device=device)
    slot_buf = torch.zeros(max_tokens, dtype=torch.int64, device=device)
    topk_buf = torch.full((max_tokens, TOPK), -1, dtype=torch.int32, device=device)

    vllm_config = SimpleNamespace(
        model_config=SimpleNamespace(hf_config=SimpleNamespace(index_topk=TOPK)),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=max_tokens),
    )
    builder = builder_cls(SimpleNamespace(block_size=BLOCK), ["layer.0"], vllm_config, device)
    scale = (192 + ROPE) ** -0.5
    impl = _make_impl(backend_mod, heads, scale, SimpleNamespace(topk_indices_buffer=topk_buf))

    def load_step(s):
        """Write step `s` into the persistent buffers and rebuild metadata."""
        q_buf.copy_(s["q"].to(dtype))
        kv_buf.copy_(s["kv"].to(dtype))
        bt_buf.copy_(s["block_table"])
        n = s["num_reqs"]
        qsl_buf.zero_()
        qsl_buf[: n + 1].copy_(s["qsl"])
        seq_buf.zero_()
        seq_buf[:n].copy_(s["seq_lens"])
        slot_buf.fill_(-1)
        slot_buf[:GRAPH_T].copy_(s["slot_mapping"])
        topk_buf[:GRAPH_T].copy_(s["topk"])
        cm = CommonAttentionMetadata(
            query_start_loc=qsl_buf[: n + 1],
            query_start_loc_cpu=s["qsl"],
            seq_lens=seq_buf[:n],
            num_reqs=n,
            num_actual_tokens=GRAPH_T,  # padded count, as with FULL graphs
            max_query_len=s["max_query_len"],
            max_seq_len=s["max_seq_len"],
            block_table_tensor=bt_buf[:n],
            slot_mapping=slot_buf[:GRAPH_T],
        )
        md = builder.build(common_prefix_len=0, common_attn_metadata=cm)
        # The builder refills its persistent buffer in place.
        assert md.req_id_per_token.data_ptr() == builder.req_id_per_token_buffer.data_ptr()
        want = torch.zeros(GRAPH_T, dtype=torch.int32)
        want[: s["real"]] = s["req_id"]
        assert torch.equal(md.req_id_per_token.cpu(), want)
        return md

    def run(md):
        return impl.forward_mqa((q_buf[..., :LORA], q_buf[..., LORA:]), kv_buf, md,
                                layer=None)[0]

    def check(s, out, what):
        real = s["real"]
        slots = reference_convert(s["req_id"], s["block_table"], s["topk"][:real],
                                  BLOCK).to(device)
        ref = reference_sparse_mla(q_buf[:real], kv_buf, slots, scale,
                                   kv_lora_rank=LORA, token_chunk=8)
        err = rel_err(out[:real], ref)
        assert err < BOUNDS[dtype], f"{what}: rel_err {err:.3e}"
        assert torch.isfinite(out).all(), f"{what}: non-finite output (padding rows?)"
        zero_row = real // 2 if real > 2 else None
        if zero_row is not None:
            assert out[zero_row].abs().max().item() == 0.0, what

    steps = [_graph_step_inputs(layout, pad, heads, gen) for layout, pad in GRAPH_ROUNDS]
    md = load_step(steps[0])
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm-up: compile and autotune outside the capture
            eager = run(md)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    check(steps[0], eager, "eager")

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # captures on its own side stream
        graph_out = run(md)
    assert graph_out.shape == (GRAPH_T, heads, LORA) and graph_out.dtype == dtype

    for i, s in enumerate(steps):
        graph_out.fill_(float("nan"))  # the replay must rewrite every row
        load_step(s)  # metadata object unused by the graph: only buffers matter
        graph.replay()
        torch.cuda.synchronize()
        check(s, graph_out, f"replay {i} (layout {len(s['qsl']) - 1} reqs, {GRAPH_T - s['real']} pad)")
        # same kernels, same launch config: bit-identical to an eager run
        eager = run(load_step(s))
        torch.cuda.synchronize()
        assert torch.equal(graph_out, eager), f"replay {i}: graph != eager"
    graph.reset()

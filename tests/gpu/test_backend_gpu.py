"""GPU test of the TRITON_MLA_SPARSE backend through vLLM's metadata builder.

Drives TritonMLASparseMetadataBuilder.build (vLLM's SparseMLACommonMetadataBuilder)
and TritonMLASparseImpl.forward_mqa on a synthetic batch that mixes decode and
prefill requests (the CommonAttentionMetadata is built by hand) and compares
with the float64 reference of tests/sparse_mla_reference.py.

How vLLM is imported (`backend_mod`):
- native, when the tree holds vLLM's compiled ops
  (vllm/_C_stable_libtorch.abi3.so from the official wheel of the pinned
  release; tests/gpu/device-run.sh puts it there) and CUDA is available: the
  only stand-ins are empty modules for FlashAttention's compiled extensions
  (vllm.vllm_flash_attn._vllm_fa2_C/_fa3_C, 440 MiB, imported on vLLM's
  attention import path, never called on the sparse-MLA path) and, if it is
  not installed, openai_harmony (import-only, see IMPORT_ONLY); the KV-cache
  write is vLLM's own concat_and_cache_mla (test_real_cache_write_then_attend);
- otherwise through smla.selection.import_vllm_tree, which stands in for
  vllm._C and the other compiled modules (never called on this path); the
  real-op test then skips.
Stand-ins in every mode: the VllmConfig handed to the builder is a
SimpleNamespace with only the fields vLLM's builder reads (vllm_config_stand_in
below), the KV-cache spec is SimpleNamespace(block_size=64), and the DSA
indexer is a SimpleNamespace holding topk_indices_buffer, filled by the test
instead of by the indexer.
Run in a pytest process without TRITON_INTERPRET (make test-gpu).
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
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

pytestmark = pytest.mark.gpu

BLOCK = 64
TOPK = 2048
LORA, ROPE = 512, 64
BOUNDS = {torch.float16: 1e-3, torch.bfloat16: 5e-3}
# (query_len, seq_len) per request; decodes first as vLLM orders them, then
# a chunked prefill with context, a fresh short prefill and a long prefill.
REQUESTS = [(1, 3000), (1, 700), (1, 2049), (5, 2100), (4, 4), (37, 2600)]


NATIVE_OPS = "vllm/_C_stable_libtorch.abi3.so"
# FlashAttention's compiled extensions of the official wheel (290 + 146 MiB:
# they cannot travel to the device).  vLLM imports vllm.vllm_flash_attn on the
# attention import path (fa_utils); nothing on the sparse-MLA path calls it.
FA_EXTENSIONS = ("vllm.vllm_flash_attn._vllm_fa2_C", "vllm.vllm_flash_attn._vllm_fa3_C")


# openai_harmony (3 MB wheel, left out of the device bundle): imported by
# vllm/entrypoints/mcp (reached through vllm.config.reasoning) for its server
# tool classes, which nothing on the sparse-MLA path uses.
IMPORT_ONLY = ("openai_harmony",)


class _StandInClass:
    def __init__(self, *args, **kwargs):
        raise RuntimeError(f"{type(self).__name__} is a test stand-in")


class _AnyClassModule(types.ModuleType):
    """Any public attribute is a class that raises when instantiated (usable
    in annotations such as `X | None`, unlike a function)."""

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        cls = type(attr, (_StandInClass,), {"__module__": self.__name__})
        setattr(self, attr, cls)
        return cls


class _EmptyExtensions(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Stand-ins, only when no real module is found (appended to
    sys.meta_path, so a real one always wins): empty modules for
    FA_EXTENSIONS, any-class modules for IMPORT_ONLY.  `used` names them."""

    used: list[str] = []

    def find_spec(self, name, path=None, target=None):
        if name in FA_EXTENSIONS or name in IMPORT_ONLY:
            self.used.append(name)
            return importlib.machinery.ModuleSpec(name, self)
        return None

    def create_module(self, spec):
        if spec.name in IMPORT_ONLY:
            return _AnyClassModule(spec.name)
        return types.ModuleType(spec.name)

    def exec_module(self, module):
        pass


def import_vllm(tree) -> str:
    """Make `import vllm` resolve to `tree`: natively when its compiled ops
    are there and CUDA is available (FlashAttention's extensions stood in),
    else with the harness's stand-ins."""
    tree = Path(tree)
    # both routes: the stand-in import reaches openai_harmony too (vllm.config.reasoning)
    if not any(isinstance(f, _EmptyExtensions) for f in sys.meta_path):
        sys.meta_path.append(_EmptyExtensions())
    if (tree / NATIVE_OPS).is_file() and torch.cuda.is_available():
        if str(tree) not in sys.path:
            sys.path.insert(0, str(tree))
        import vllm.platforms  # noqa: F401

        from vllm.platforms import current_platform

        assert current_platform.is_cuda(), current_platform
        import vllm._custom_ops  # noqa: F401  (registers torch.ops._C*)

        return "native"
    from smla.selection import import_vllm_tree

    import_vllm_tree(tree)
    return "stand-ins"


@pytest.fixture(scope="module")
def backend_mod(vllm_tree):
    if os.environ.get("TRITON_INTERPRET", "0") not in ("0", ""):
        pytest.skip("TRITON_INTERPRET is set in this process")
    mode = import_vllm(vllm_tree)
    from vllm.v1.attention.backends.mla import triton_mla_sparse

    triton_mla_sparse.IMPORT_MODE = mode
    print(f"vLLM import: {mode}; stand-ins served so far: {_EmptyExtensions.used}")
    return triton_mla_sparse


def vllm_config_stand_in(heads, dtype, max_tokens, layer_names=("layer.0",),
                         max_num_seqs=8, topk=None, max_model_len=8192):
    """The VllmConfig fields vLLM 0.26's SparseMLACommonMetadataBuilder and
    our builder read, with GLM-5's MLA geometry; no prefill backend (as when
    vLLM finds none: every token then takes forward_mqa)."""
    hf = SimpleNamespace(index_topk=TOPK if topk is None else topk, kv_lora_rank=LORA,
                         qk_nope_head_dim=192, qk_rope_head_dim=ROPE,
                         v_head_dim=256, q_lora_rank=2048)
    return SimpleNamespace(
        model_config=SimpleNamespace(
            hf_config=hf, hf_text_config=hf, dtype=dtype, max_model_len=max_model_len,
            get_num_attention_heads=lambda parallel_config: heads),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=max_tokens,
                                         max_num_seqs=max_num_seqs),
        cache_config=SimpleNamespace(block_size=BLOCK),
        parallel_config=SimpleNamespace(prefill_context_parallel_size=1,
                                        decode_context_parallel_size=1,
                                        cp_kv_cache_interleave_size=1),
        compilation_config=SimpleNamespace(static_forward_context={
            name: SimpleNamespace(prefill_backend=None) for name in layer_names}),
        speculative_config=None,
    )


def make_builder(backend_mod, heads, dtype, max_tokens, device, cache_dtype_str=None, **kw):
    return backend_mod.TritonMLASparseMetadataBuilder(
        SimpleNamespace(block_size=BLOCK, cache_dtype_str=cache_dtype_str), ["layer.0"],
        vllm_config_stand_in(heads, dtype, max_tokens, **kw), device)


def small_decode_case(backend_mod, dtype, device, heads=16, max_tokens=32):
    """A small all-decode batch of REQUESTS / TOPK (the CPU smoke scripts set
    them smaller), its metadata built by our builder: (batch, metadata)."""
    b = _batch(dtype, heads, device, torch.Generator().manual_seed(0))
    builder = make_builder(backend_mod, heads, dtype, max_tokens, device)
    md = builder.build(0, _common_metadata(b, device))
    assert md.num_decode_tokens == b["T"] and md.num_prefills == 0, md
    return b, md


def ensure_workspace(device) -> None:
    """vLLM's workspace manager on `device`, as the GPU worker sets it up before it builds the
    model: forward_mqa's output, slot ids and split-K partials are views of it."""
    from vllm.v1.worker import workspace as ws

    if not ws.is_workspace_manager_initialized():
        ws.init_workspace_manager(torch.device(device))


def _make_impl(backend_mod, heads, scale, indexer):
    """TritonMLASparseImpl with GLM-5's MLA geometry; `indexer` is a stand-in
    holding only topk_indices_buffer (the workspace manager on its device)."""
    ensure_workspace(indexer.topk_indices_buffer.device)
    return backend_mod.TritonMLASparseImpl(
        num_heads=heads, head_size=LORA + ROPE, scale=scale, num_kv_heads=1,
        alibi_slopes=None, sliding_window=None, kv_cache_dtype="auto",
        logits_soft_cap=None, attn_type="decoder",
        kv_sharing_target_layer_name=None,
        q_lora_rank=2048, kv_lora_rank=LORA, qk_nope_head_dim=192,
        qk_rope_head_dim=ROPE, qk_head_dim=192 + ROPE, v_head_dim=256,
        kv_b_proj=None, indexer=indexer,
    )


def _batch(dtype, heads, device, gen, requests=None):
    requests = REQUESTS if requests is None else requests
    num_reqs = len(requests)
    q_lens = [q for q, _ in requests]
    seq_lens = [s for _, s in requests]
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
    for r, (ql, sl) in enumerate(requests):
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
        max_query_len=max(q_lens), max_seq_len=max(seq_lens), num_reqs=num_reqs,
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16],
                         ids=["float16", "bfloat16"])
@pytest.mark.parametrize("heads", [16, 64, 128])
def test_forward_mqa_mixed_batch_with_stand_ins(backend_mod, dtype, heads):
    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(1234 + heads)
    b = _batch(dtype, heads, device, gen)
    max_tokens = 256

    builder = make_builder(backend_mod, heads, dtype, max_tokens, device)
    md = builder.build(common_prefix_len=0,
                       common_attn_metadata=_common_metadata(b, device))
    assert torch.equal(md.req_id_per_token.cpu(), b["req_id"])
    # Every request is at most 37 tokens: all are "decodes" for the layer
    # (reorder threshold 128/256), so the whole batch takes forward_mqa.
    assert md.num_decode_tokens == b["T"] and md.num_prefills == 0
    assert md.topk_tokens == TOPK and md.prefill is None

    topk_buffer = torch.full((max_tokens, TOPK), -1, dtype=torch.int32,
                             device=device)
    topk_buffer[: b["T"]] = b["topk"].to(device)
    indexer = SimpleNamespace(topk_indices_buffer=topk_buffer)
    scale = (192 + ROPE) ** -0.5
    impl = _make_impl(backend_mod, heads, scale, indexer)
    q = b["q"]
    # As vLLM's MLA layer passes them: ql_nope is the transposed bmm output
    # (head stride T*512), q_pe a view of the projected query.
    ql_nope = q[..., :LORA].transpose(0, 1).contiguous().transpose(0, 1)
    out, lse = impl.forward_mqa((ql_nope, q[..., LORA:]), b["kv_cache"],
                                md, layer=None)
    assert lse is None
    assert out.shape == (b["T"], heads, LORA) and out.dtype == dtype

    slots = reference_convert(b["req_id"], b["block_table"].cpu(), b["topk"],
                              BLOCK).to(device)
    ref = reference_sparse_mla(q, b["kv_cache"], slots, scale,
                               kv_lora_rank=LORA, token_chunk=8)
    err = rel_err(out, ref)
    assert err < BOUNDS[dtype], f"rel_err {err:.3e}"


def _common_metadata(b, device):
    from vllm.v1.attention.backend import CommonAttentionMetadata

    return CommonAttentionMetadata(
        query_start_loc=b["query_start_loc_cpu"].to(device),
        query_start_loc_cpu=b["query_start_loc_cpu"],
        seq_lens=b["seq_lens"].to(device),
        num_reqs=b["num_reqs"],
        num_actual_tokens=b["T"],
        max_query_len=b["max_query_len"],
        max_seq_len=b["max_seq_len"],
        block_table_tensor=b["block_table"],
        slot_mapping=b["slot_mapping"].to(device),
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16],
                         ids=["float16", "bfloat16"])
def test_real_cache_write_then_attend(backend_mod, dtype):
    """vLLM's own compiled concat_and_cache_mla (through the impl's
    do_kv_cache_update, as the MLA layer calls it) writes the batch's new
    latent + rope rows into a paged cache; forward_mqa then attends over them.
    Needs the native import (vLLM's compiled ops in the tree)."""
    if backend_mod.IMPORT_MODE != "native":
        pytest.skip("vLLM's compiled ops are not in the tree (stand-in import)")
    device = torch.device("cuda")
    heads = 64
    gen = torch.Generator().manual_seed(77)
    b = _batch(dtype, heads, device, gen)
    T = b["T"]
    kv_cache = b["kv_cache"].clone()
    slot_mapping = b["slot_mapping"].to(device)
    kv_c = (torch.randn(T, LORA, generator=gen) * 0.5).to(device, dtype)
    k_pe = (torch.randn(T, 1, ROPE, generator=gen) * 0.5).to(device, dtype)
    untouched = torch.ones(kv_cache.shape[0] * BLOCK, dtype=torch.bool)
    untouched[b["slot_mapping"]] = False

    topk_buffer = torch.full((256, TOPK), -1, dtype=torch.int32, device=device)
    topk_buffer[:T] = b["topk"].to(device)
    scale = (192 + ROPE) ** -0.5
    impl = _make_impl(backend_mod, heads, scale,
                      SimpleNamespace(topk_indices_buffer=topk_buffer))
    before = kv_cache.clone()
    impl.do_kv_cache_update(kv_c, k_pe, kv_cache, slot_mapping, "auto",
                            torch.ones((), dtype=torch.float32, device=device))
    torch.cuda.synchronize()
    flat = kv_cache.view(-1, LORA + ROPE)
    want = torch.cat([kv_c, k_pe.squeeze(1)], dim=-1)
    assert torch.equal(flat[slot_mapping], want)
    assert torch.equal(flat[untouched.to(device)], before.view(-1, LORA + ROPE)[untouched.to(device)])

    builder = make_builder(backend_mod, heads, dtype, 256, device)
    md = builder.build(common_prefix_len=0, common_attn_metadata=_common_metadata(b, device))
    q = b["q"]
    out, _ = impl.forward_mqa((q[..., :LORA], q[..., LORA:]), kv_cache, md, layer=None)
    slots = reference_convert(b["req_id"], b["block_table"].cpu(), b["topk"],
                              BLOCK).to(device)
    ref = reference_sparse_mla(q, kv_cache, slots, scale, kv_lora_rank=LORA, token_chunk=8)
    err = rel_err(out, ref)
    assert err < BOUNDS[dtype], f"rel_err {err:.3e}"


# Decodes (<= 128 new tokens) first, then prefills (the builder's order): with
# a 4096-row context buffer (max_model_len) the 2600- and 700-token prefills
# share one 16-bit copy, the 5000-token one is longer and reads the fp8 rows.
FP8_PREFILL_REQUESTS = [(1, 3000), (5, 2100), (300, 2600), (200, 700), (150, 5000)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16],
                         ids=["float16", "bfloat16"])
@pytest.mark.parametrize("heads", [16, 64])
def test_fp8_prefills_attend_through_a_16bit_context_copy(backend_mod, dtype, heads,
                                                          monkeypatch):
    """fp8_ds_mla cache, a batch of decodes and long prefills: the builder
    plans the prefills' context copies (one chunk copied, one request too long
    for the buffer read directly), forward_mqa dequantises the chunk's context
    once and runs the 16-bit kernel over it, and every token matches the
    float64 reference of the dequantised cache."""
    from fp8_ds_mla_reference import dequant_ds_mla, write_ds_mla

    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(4321 + heads)
    b = _batch(dtype, heads, device, gen, requests=FP8_PREFILL_REQUESTS)
    nb = b["kv_cache"].shape[0]
    cache = torch.zeros((nb, BLOCK, 656), dtype=torch.uint8, device=device)
    rows = b["kv_cache"].reshape(-1, LORA + ROPE).to(torch.bfloat16)
    write_ds_mla(rows[:, :LORA].contiguous(), rows[:, LORA:].contiguous(), cache,
                 torch.arange(nb * BLOCK, device=device))
    max_tokens = 1024
    builder = make_builder(backend_mod, heads, dtype, max_tokens, device,
                           cache_dtype_str="fp8_ds_mla", max_model_len=4096)
    md = builder.build(common_prefix_len=0, common_attn_metadata=_common_metadata(b, device))
    assert (md.num_decodes, md.num_prefills, md.num_decode_tokens) == (2, 3, 6)
    ctx = md.fp8_prefill_context
    assert [(c.tokens, c.reqs, c.num_rows, c.direct) for c in ctx.chunks] == [
        ((6, 506), (2, 4), 3300, False), ((506, 656), (4, 5), 0, True)]
    assert ctx.req_row_starts.tolist() == [0, 2600, 0]
    assert ctx.token_row_starts.tolist() == [0] * 300 + [2600] * 200 + [0] * 150

    from vllm.v1.attention.ops import triton_sparse_mla as ops

    copies = []
    dequantize = ops.dequantize_ds_mla_context
    monkeypatch.setattr(ops, "dequantize_ds_mla_context",
                        lambda *a, **k: copies.append(a[4].dtype) or dequantize(*a, **k))
    topk_buffer = torch.full((max_tokens, TOPK), -1, dtype=torch.int32, device=device)
    topk_buffer[: b["T"]] = b["topk"].to(device)
    scale = (192 + ROPE) ** -0.5
    impl = _make_impl(backend_mod, heads, scale, SimpleNamespace(topk_indices_buffer=topk_buffer))
    impl.kv_cache_dtype = "fp8_ds_mla"  # as the layer passes it (the helper builds "auto")
    q = b["q"]
    ql_nope = q[..., :LORA].transpose(0, 1).contiguous().transpose(0, 1)
    out, lse = impl.forward_mqa((ql_nope, q[..., LORA:]), cache, md, layer=None)
    assert lse is None and out.dtype == dtype
    assert copies == [dtype]  # one chunk copied, in the model dtype
    slots = reference_convert(b["req_id"], b["block_table"].cpu(), b["topk"], BLOCK).to(device)
    kv_ref = dequant_ds_mla(cache.view(-1, 656), torch.bfloat16).view(nb, BLOCK, -1)
    for name, sl in (("decodes", slice(0, 6)), ("copied", slice(6, 506)),
                     ("direct", slice(506, 656))):
        ref = reference_sparse_mla(q[sl], kv_ref, slots[sl], scale, kv_lora_rank=LORA,
                                   token_chunk=8)
        err = rel_err(out[sl], ref)
        assert err < BOUNDS[dtype], f"{name}: rel_err {err:.3e}"


@pytest.mark.parametrize("heads", [16, 128])
def test_workspace_reserved_no_per_layer_allocation(backend_mod, heads):
    """With vLLM's workspace manager (as the GPU worker sets it up before the
    model is built), the impl reserves the worst case when it is constructed
    under the model's config (model build time, before vLLM's memory
    profiling), the workspace is then locked (it may not grow any
    more) and forward_mqa runs without a single CUDA caching-allocator
    allocation: output, slot ids and split-K scratch are views of the shared
    workspace (what FLASHMLA_SPARSE / TRITON_MLA do for their scratch)."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.worker import workspace as ws

    device = torch.device("cuda")
    dtype = torch.bfloat16
    gen = torch.Generator().manual_seed(5 + heads)
    max_tokens = 256
    ws.init_workspace_manager(device)
    try:
        cfg = vllm_config_stand_in(heads, dtype, max_tokens)
        topk_buffer = torch.full((max_tokens, TOPK), -1, dtype=torch.int32, device=device)
        scale = (192 + ROPE) ** -0.5
        before = ws.current_workspace_manager()._current_workspaces[0]
        before = 0 if before is None else before.numel()
        with set_current_vllm_config(cfg):
            impl = _make_impl(backend_mod, heads, scale,
                              SimpleNamespace(topk_indices_buffer=topk_buffer))
        reserved = ws.current_workspace_manager()._current_workspaces[0].numel()
        assert reserved > before, "the impl reserved nothing at construction"
        ws.lock_workspace()
        builder = make_builder(backend_mod, heads, dtype, max_tokens, device)
        # Decode (1 token: the split-K worst case), a mixed batch and a full
        # max_tokens step.
        for requests in ([(1, 3000)], REQUESTS, [(max_tokens, 4000)]):
            b = _batch(dtype, heads, device, gen, requests=requests)
            topk_buffer[: b["T"]] = b["topk"].to(device)
            md = builder.build(0, _common_metadata(b, device))
            q = b["q"]
            impl.forward_mqa((q[..., :LORA], q[..., LORA:]), b["kv_cache"], md, None)
            torch.cuda.synchronize()
            n0 = torch.cuda.memory_stats()["allocation.all.allocated"]
            out, _ = impl.forward_mqa((q[..., :LORA], q[..., LORA:]), b["kv_cache"], md, None)
            torch.cuda.synchronize()
            n1 = torch.cuda.memory_stats()["allocation.all.allocated"]
            assert n1 == n0, f"{n1 - n0} allocations in forward_mqa ({len(requests)} reqs)"
            ws_buf = ws.current_workspace_manager()._current_workspaces[0]
            base = ws_buf.data_ptr()
            assert base <= out.data_ptr() < base + ws_buf.numel() * ws_buf.element_size()
            slots = reference_convert(b["req_id"], b["block_table"].cpu(), b["topk"],
                                      BLOCK).to(device)
            ref = reference_sparse_mla(q, b["kv_cache"], slots, scale,
                                       kv_lora_rank=LORA, token_chunk=8)
            err = rel_err(out, ref)
            assert err < BOUNDS[dtype], f"rel_err {err:.3e}"
    finally:
        ws.reset_workspace_manager()


# --- CUDA graphs -----------------------------------------------------------
# TritonMLASparseMetadataBuilder declares AttentionCGSupport.UNIFORM_BATCH
# (vLLM 0.26's shared sparse-MLA layer may send long prefills to the dense MHA
# prefill backend, which is not captured).  The forward_mqa path itself is
# capture-safe for any layout: the test below captures it once on a mixed
# batch (all requests under the decode threshold) and replays it after
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
    assert builder_cls._cudagraph_support == AttentionCGSupport.UNIFORM_BATCH
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

    builder = make_builder(backend_mod, heads, dtype, max_tokens, device)
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

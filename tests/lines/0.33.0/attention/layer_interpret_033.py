"""Layer-level CPU check of TRITON_MLA_SPARSE on vLLM 0.33.0, under Triton's interpreter.

Usage: TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES= python layer_interpret_033.py TREE STANDINS_PY CASE
CASE: deepseek-v3.2 | glm-5 | glm-5.2 (an index group: one index layer, two IndexCache skip layers)
| glm-5.3-flash (NoPE: qk_rope_head_dim 0, head size 512), each with kv cache "auto" (the fp16 model
dtype) and "fp8_ds_mla".  Prints "ok <what>" lines and "rel_err <case> <kv> <layer> <x>" lines; exits
non-zero on any failure.  The geometries, the batch and the float64 reference are
tests/layer_interpret_common.py's, shared with the 0.26.0 line's check
(tests/lines/0.26.0/attention/layer_interpret_026.py).

What is vLLM 0.33.0's own code here (TREE, unmodified but for the series):
- the cache writer: fused_norm_rope of vllm/models/deepseek_v32/common/kernels.py, the Triton kernel
  that writes the MLA cache (16-bit or fp8_ds_mla) for DeepSeek-V3.2 / GLM-5.x on CUDA in 0.33.0
  (RMSNorm of kv_c, RoPE of k_pe, quantisation, store at slot_mapping); GLM-5.3-Flash's cache is
  written by concat_and_cache_mla (CUDA only), so its rows come from the toolkit's reference
  writer here (tests/fp8_ds_mla_reference.py: 512 e4m3 codes, 4 scales, the 128-byte rope space
  zeroed, as 0.33.0's writer leaves NoPE rows; 16-bit rows: the 512 latent values);
- TritonMLASparseMetadataBuilder.build = SparseMLACommonMetadataBuilder.build on a
  CommonAttentionMetadata of a mixed batch (decodes, a 3-token spec-decode row, a 130-token
  prefill with context: num_decodes 3, num_prefills 1);
- MLAAttention.forward_impl (the MLA layer: W_UK absorption, forward_mqa, v_up projection), called on
  a layer object whose attributes are set here instead of by MLAAttention.__init__ (which needs a
  model's linear layers and a KV-cache binding);
- SparseMLACommonImpl.forward_mqa: logical -> physical top-k (triton_convert_req_index_to_global_index,
  per layer or once per index group through SparseMLAIndexGroupBuilder), then our _forward_mqa_kernel;
- reserve_workspace() (the profiling run's claim), then the workspace locked for the forward;
- fp8_ds_mla: the prefill reads a 16-bit copy of its context (the fp8 prefill patch); layer 0 once
  more with a copy one row too small, so that its tokens read the fp8 rows ("direct_rel_err");
- the KV cache is laid out with a block stride of twice block_size rows (other layers' pages in
  between), read through flat_kv_row_view; the top-k buffer is wider than index_topk (256 vs 128)
  with valid entries past index_topk and -1 holes;
- glm-5.3-flash: the model's top-k geometry (index_topk 2048 = 512 pools of 4, the buffer 2176
  wide, max_model_len 10240), a decode at 8,203 tokens (2,050 pools) before the mixed batch, and
  the buffer filled by vLLM 0.33.0's pooled indexer op, sparse_attn_indexer_kpool, on our Triton
  logits (pooled_indexer_chain.py beside this file: pooled logits -> top-512 pools ->
  expand_pools_and_append_tail for the decode rows, its causal fill for the prefill; its rows
  checked against float64 pooled logits there), then read by the attention as the model does.
Reference: float64 MLA over the rows the writer returned (kv_c_out, k_pe_out) for the 16-bit cache,
over the dequantised cache bytes (tests/fp8_ds_mla_reference.py) for fp8_ds_mla; the fp8 bytes are
also checked against kv_c_out (e4m3 rounding bound).
Stand-ins: the toolkit's _selection_standins (compiled modules empty, CUDA platform with capability
8.6 mocked, cuda tensor factories -> meta); CUDA_VISIBLE_DEVICES="" so that vllm.triton_utils keeps
Triton with no active GPU driver (its rule for distributed workers), the kernels then run in the
interpreter; PIN_MEMORY False; the workspace manager on the CPU; the DSA indexer is a
SimpleNamespace holding topk_indices_buffer, filled by this script (glm-5.3-flash: by the pooled
indexer op, its own stand-ins said in pooled_indexer_chain.py); the tensor-parallel size the
impl asks for (masked-MHA availability, sm100 only) answers 8 without a process group; the index
group's CUDA streams and events are no-op stand-ins (_InOrder: the CPU runs ops in order).  bfloat16 is not run: the
interpreter has no bfloat16 arithmetic (the kernel test module's bf16 cases give garbage there).
"""
from __future__ import annotations

import importlib.util
import math
import os
import sys
import types
from pathlib import Path

assert os.environ.get("TRITON_INTERPRET") == "1"
assert os.environ.get("CUDA_VISIBLE_DEVICES") == ""
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
TREE, STANDINS, CASE = sys.argv[1], sys.argv[2], sys.argv[3]
HERE = Path(__file__).resolve().parent
REFS = Path(os.environ.get("SMLA_TEST_REFS", HERE.parents[3]))
sys.path.insert(0, str(REFS))

spec = importlib.util.spec_from_file_location("_smla_selection_standins", STANDINS)
st = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = st
spec.loader.exec_module(st)
st.import_vllm_tree(TREE, capability="8.6")

import torch  # noqa: E402

import vllm.utils.torch_utils as torch_utils  # noqa: E402
from fp8_ds_mla_reference import dequant_ds_mla, quantize_ds_mla, split_ds_mla  # noqa: E402
from layer_interpret_common import (  # noqa: E402
    BLOCK, DECODE_MAX_QUERY, DTYPE, GEOMETRY, LORA, batch, geometry_batch, reference_layer, rel_err,
    split)
from vllm.config import VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.model_executor.layers.attention import sparse_mla_attention  # noqa: E402
from vllm.model_executor.layers.attention.mla_attention import MLAAttention  # noqa: E402
from vllm.triton_utils import HAS_TRITON  # noqa: E402
from vllm.v1.attention.backend import CommonAttentionMetadata  # noqa: E402
from vllm.v1.attention.backends.mla import index_group as index_group_mod  # noqa: E402
from vllm.v1.attention.backends.mla import triton_mla_sparse as backend  # noqa: E402
from vllm.v1.attention.backends.mla.index_group import SparseMLAIndexGroupBuilder  # noqa: E402
from vllm.v1.kv_cache_interface import MLAAttentionSpec  # noqa: E402
from vllm.v1.worker.workspace import (  # noqa: E402
    current_workspace_manager,
    init_workspace_manager,
)

assert HAS_TRITON, "vllm.triton_utils has no Triton: run with CUDA_VISIBLE_DEVICES="
torch_utils.PIN_MEMORY = False
sparse_mla_attention.PIN_MEMORY = False
# No process groups on this machine: the impl asks the TP size only to decide whether the sm100
# masked-MHA prefill could ever fire (it cannot here).
sparse_mla_attention.get_tensor_model_parallel_world_size = lambda: 8


class _InOrder:
    """Stream and event stand-in: the index group orders its side-stream conversion with CUDA
    streams and events; on the CPU every op runs in program order, so they have nothing to do."""

    def record(self, stream=None):
        pass

    def wait_event(self, event):
        pass

    def wait_stream(self, stream):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


index_group_mod.current_stream = _InOrder
index_group_mod._create_side_stream = lambda device: _InOrder()
index_group_mod._create_event = _InOrder
init_workspace_manager(torch.device("cpu"))

_k = importlib.util.spec_from_file_location(
    "_v32_kernels", Path(TREE) / "vllm/models/deepseek_v32/common/kernels.py")
kernels = importlib.util.module_from_spec(_k)
_k.loader.exec_module(kernels)  # by path: the package __init__ imports the whole CUDA model


GEOMETRY = GEOMETRY[CASE]  # this case's heads, qk_nope, v_head, layer count (and rope: 0 for NoPE)
ROPE = GEOMETRY.get("rope", 64)
NOPE = ROPE == 0
REQUESTS, INDEX_TOPK, WIDTH = geometry_batch(GEOMETRY)
KPOOL = GEOMETRY.get("kpool")
if KPOOL:  # GLM-5.3-Flash: its pooled indexer op fills the top-k buffer (pooled_indexer_chain.py)
    import pooled_indexer_chain  # noqa: E402
dev = torch.device("cpu")
gen = torch.Generator().manual_seed(7)


def vllm_config(heads: int, kv_cache_dtype: str) -> VllmConfig:
    hf = types.SimpleNamespace(
        model_type="glm5_next" if NOPE else "glm_moe_dsa", index_topk=INDEX_TOPK, kv_lora_rank=LORA,
        qk_nope_head_dim=GEOMETRY["qk_nope"], qk_rope_head_dim=ROPE,
        v_head_dim=GEOMETRY["v_head"], q_lora_rank=1536, num_attention_heads=heads * 8)
    cfg = VllmConfig()
    object.__setattr__(cfg, "model_config", types.SimpleNamespace(
        hf_config=hf, hf_text_config=hf, dtype=DTYPE,
        max_model_len=GEOMETRY.get("max_model_len", 4096), use_mla=True,
        rswa_window=None, model_arch_config=types.SimpleNamespace(total_num_attention_heads=heads * 8),
        get_num_attention_heads=lambda parallel_config: heads))
    cfg.cache_config.cache_dtype = kv_cache_dtype
    cfg.cache_config.block_size = BLOCK
    cfg.scheduler_config.max_num_batched_tokens = 512
    cfg.scheduler_config.max_num_seqs = 8
    return cfg


def write_cache(b, kv_cache_dtype: str):
    """vLLM's fused writer over every position; returns (cache view, rows [req] -> (kv_c, k_pe))."""
    width = 656 if kv_cache_dtype == "fp8_ds_mla" else LORA + ROPE
    store_dtype = torch.uint8 if kv_cache_dtype == "fp8_ds_mla" else DTYPE
    # twice the block stride: other layers' pages sit between this layer's blocks
    full = torch.zeros(b["num_blocks"], 2 * BLOCK, width, dtype=store_dtype)
    cache = full[:, :BLOCK]
    rows = []
    if NOPE:
        for slots in b["all_slots"]:
            kv_c = (torch.randn(slots.numel(), LORA, generator=gen) * 2).to(DTYPE)
            if kv_cache_dtype == "fp8_ds_mla":  # the rope space of NoPE rows stays zero
                new = quantize_ds_mla(kv_c, torch.zeros(slots.numel(), 64, dtype=DTYPE))
                new[:, LORA + 16:] = 0
            else:
                new = kv_c
            cache[slots // BLOCK, slots % BLOCK] = new
            rows.append((kv_c, kv_c[:, :0], slots))
        return cache, rows
    cos_sin = torch.randn(4096, ROPE, generator=gen).to(DTYPE)
    for slots in b["all_slots"]:
        n = slots.numel()
        kv_c = (torch.randn(n, LORA, generator=gen) * 2).to(DTYPE)
        k_pe = torch.randn(n, ROPE, generator=gen).to(DTYPE)
        kv_out, pe_out = torch.empty_like(kv_c), torch.empty_like(k_pe)
        kernels.fused_norm_rope(
            torch.arange(n), torch.randn(n, 64, generator=gen).to(DTYPE), torch.ones(64, dtype=DTYPE),
            1e-6, kv_c, torch.ones(LORA, dtype=DTYPE), 1e-6, k_pe, cos_sin, None, None, None, 0.0,
            None, torch.full((n, WIDTH), -1, dtype=torch.int32), slot_mapping=slots.to(torch.int64),
            mla_kv_cache=cache, mla_kv_cache_dtype=kv_cache_dtype,
            mla_k_scale=torch.ones(1, dtype=torch.float32), has_indexer=False,
            kv_c_out=kv_out, k_pe_out=pe_out)
        rows.append((kv_out, pe_out, slots))
    assert full[:, BLOCK:].abs().sum() == 0, "writer wrote into the other layers' rows"
    return cache, rows


def reference_rows(cache, rows, kv_cache_dtype):
    """float64 [seq, 576] per request: what the attention must read."""
    out = []
    for kv_out, pe_out, slots in rows:
        if kv_cache_dtype == "fp8_ds_mla":
            flat = cache.reshape(-1, 656) if cache.is_contiguous() else None
            blocks = cache[slots // BLOCK, slots % BLOCK]  # [n, 656]
            deq = dequant_ds_mla(blocks, torch.bfloat16)
            if NOPE:  # the latent alone; the reference writer's codes are torch's e4m3
                assert (blocks[:, LORA + 16:] == 0).all()
                out.append(deq[:, :LORA])
                continue
            # The writer's bytes hold kv_c_out to e4m3 precision, the rope as bf16.  Codes are
            # compared with torch's e4m3 rounding of kv_c_out / tile scale.  Triton 3.8's
            # interpreter drops the carry when rounding crosses a power of two (127.9 -> 64;
            # the GPU gives 128): such codes decode to half the right value and are counted
            # apart; every other code must match within one e4m3 step (kv_c_out is the fp16
            # rounding of the values the kernel quantised).
            x = kv_out.double()
            scales = split_ds_mla(blocks, torch.bfloat16)[1].double().repeat_interleave(128, -1)
            right = (x / scales).to(torch.float8_e4m3fn).double() * scales
            got = deq[:, :LORA]
            carry = (got * 2 == right) & (got != right)
            step = right.abs() * 2.0**-3 + scales * 2.0**-9
            other = (~carry) & ((got - right).abs() > step)
            stats["fp8_carry"] = max(stats.get("fp8_carry", 0.0), carry.double().mean().item())
            assert not other.any(), f"{int(other.sum())} fp8 codes off beyond the carry case"
            pe_err = (deq[:, LORA:] - pe_out.double()).abs() / pe_out.double().abs().clamp(min=1e-3)
            assert pe_err.max() < 2.0**-7, pe_err.max()
            del flat
            out.append(deq)
        else:
            blocks = cache[slots // BLOCK, slots % BLOCK].double()
            assert torch.equal(blocks, torch.cat([kv_out, pe_out], -1).double())
            out.append(blocks)
    return out


def make_impl(heads, kv_cache_dtype, indexer, buf, group_builder):
    return backend.TritonMLASparseImpl(
        num_heads=heads, head_size=LORA + ROPE, scale=1.0 / math.sqrt(GEOMETRY["qk_nope"] + ROPE),
        num_kv_heads=1, alibi_slopes=None, sliding_window=None, kv_cache_dtype=kv_cache_dtype,
        logits_soft_cap=None, attn_type="decoder", kv_sharing_target_layer_name=None,
        q_lora_rank=1536, kv_lora_rank=LORA, qk_nope_head_dim=GEOMETRY["qk_nope"],
        qk_rope_head_dim=ROPE, qk_head_dim=GEOMETRY["qk_nope"] + ROPE, v_head_dim=GEOMETRY["v_head"],
        kv_b_proj=None, indexer=indexer, topk_indices_buffer=None if indexer else buf,
        index_group_builder=group_builder)


def make_layer(impl, heads, kv_cache_dtype, cfg):
    """An MLAAttention whose forward_impl is vLLM's; attributes set as its __init__ /
    process_weights_after_loading would for these weights."""
    layer = MLAAttention.__new__(MLAAttention)
    torch.nn.Module.__init__(layer)
    qk_nope, v_head = GEOMETRY["qk_nope"], GEOMETRY["v_head"]
    W_UK = torch.randn(LORA, heads, qk_nope, generator=gen) / math.sqrt(qk_nope)
    W_UV = torch.randn(LORA, heads, v_head, generator=gen) / math.sqrt(LORA)
    attrs = dict(
        impl=impl, num_heads=heads, qk_nope_head_dim=qk_nope, qk_rope_head_dim=ROPE,
        v_head_dim=v_head, kv_lora_rank=LORA, kv_cache_dtype=kv_cache_dtype, use_pcp=False,
        q_pad_num_heads=None, is_aiter_triton_fp4_bmm_enabled=False,
        is_aiter_triton_fp8_bmm_enabled=False, is_amx_bmm_enabled=False,
        W_UK_T=W_UK.permute(1, 2, 0).to(DTYPE), W_UK_T_dcp_qrep=None,
        W_UV=W_UV.transpose(0, 1).to(DTYPE), prefill_backend=None, _vllm_config=cfg,
        attn_backend=backend.TritonMLASparseBackend, hisparse_cache=None,
        _k_scale=torch.ones(1), dcp_manager=None)
    for k, v in attrs.items():
        object.__setattr__(layer, k, v)
    layer.W_UK, layer.W_UV64 = W_UK.double(), W_UV.double()
    return layer


calls = {"convert": 0}
stats: dict[str, float] = {}
_convert = index_group_mod.triton_convert_req_index_to_global_index


def counting_convert(*args, **kwargs):
    calls["convert"] += 1
    return _convert(*args, **kwargs)


index_group_mod.triton_convert_req_index_to_global_index = counting_convert

def check_pooled_topk(b, kv_cache_dtype):
    """What the attention reads from the pooled indexer op's buffer (GLM-5.3-Flash): the
    8,203-token decode's 512 pools of 2,050 (2,048 tokens, no hole) and its 3 tail tokens at
    index_topk; rows with entries past index_topk after -1 holes; nothing past a row's position."""
    topk, T = b["topk"], b["T"]
    assert topk.shape[1] == WIDTH and (topk[T:] == -1).all()
    row, L = topk[0], REQUESTS[0][1]
    assert L > 4 * INDEX_TOPK and (row[:INDEX_TOPK] >= 0).all()
    assert row[:INDEX_TOPK].unique().numel() == INDEX_TOPK
    pools = (row[:INDEX_TOPK] // KPOOL).unique()
    assert pools.numel() == INDEX_TOPK // KPOOL < L // KPOOL
    assert row[INDEX_TOPK:INDEX_TOPK + 3].tolist() == list(range(L - L % KPOOL, L))
    assert (row[INDEX_TOPK + 3:] == -1).all()
    tails = holes = 0
    for t in range(T):
        r, pos = topk[t], b["pos"][t]
        valid = r[r >= 0]
        assert valid.max() <= pos and valid.unique().numel() == valid.numel()
        tails += int((r[INDEX_TOPK:] >= 0).any())
        holes += int(((r[:INDEX_TOPK] == -1).any() and (r[INDEX_TOPK:] >= 0).any()))
    assert holes > 0
    print(f"ok pooled topk {CASE} {kv_cache_dtype}: width {WIDTH}, index_topk {INDEX_TOPK}; "
          f"the {L}-token decode: 512 of {L // KPOOL} pools + {L % KPOOL} tail tokens; "
          f"{tails} rows with entries past index_topk, {holes} of them after -1 holes")


failures = 0
for kv_cache_dtype in ("auto", "fp8_ds_mla"):
    heads = GEOMETRY["heads"]
    cfg = vllm_config(heads, kv_cache_dtype)
    op_line = []

    def fill_topk(requests, g):
        buf_, line = pooled_indexer_chain.indexer_topk_buffer(TREE, requests, GEOMETRY, g,
                                                              DECODE_MAX_QUERY)
        op_line.append(line)
        return buf_

    b = batch(gen, CommonAttentionMetadata, GEOMETRY, fill_topk=fill_topk if KPOOL else None)
    buf = b["topk"]
    if KPOOL:
        print(f"ok pooled indexer op {CASE} {kv_cache_dtype}: {op_line[0]}")
        check_pooled_topk(b, kv_cache_dtype)
    with set_current_vllm_config(cfg):
        spec = backend.TritonMLASparseBackend.customize_spec(MLAAttentionSpec(
            block_size=BLOCK, num_kv_heads=1, head_size=LORA + ROPE,
            dtype=torch.uint8 if kv_cache_dtype == "fp8_ds_mla" else DTYPE,
            cache_dtype_str=kv_cache_dtype))
        cfg.compilation_config.static_forward_context.update(
            {f"layer.{i}": types.SimpleNamespace(prefill_backend=None)
             for i in range(GEOMETRY["layers"])})
        builder = backend.TritonMLASparseMetadataBuilder(
            spec, [f"layer.{i}" for i in range(GEOMETRY["layers"])], cfg, dev)
        md = builder.build(common_prefix_len=0, common_attn_metadata=b["cm"])
        nd, npf, ndt = split(REQUESTS)
        assert (md.num_decodes, md.num_prefills, md.num_decode_tokens) == (nd, npf, ndt), md
        assert md.prefill is None  # no dense MHA prefill backend: every token takes forward_mqa
        assert torch.equal(md.req_id_per_token[: b["T"]], torch.tensor(b["req"], dtype=torch.int32))
        print(f"ok builder {CASE} {kv_cache_dtype}: num_decodes {nd}, num_prefills {npf}, "
              f"reorder threshold {builder.reorder_batch_threshold}")
        group_builder = SparseMLAIndexGroupBuilder(buf)
        indexer = types.SimpleNamespace(topk_indices_buffer=buf)
        impls = [make_impl(heads, kv_cache_dtype, indexer if i == 0 else None, buf, group_builder)
                 for i in range(GEOMETRY["layers"])]
        if kv_cache_dtype == "fp8_ds_mla":  # fp16 model + fp8_ds_mla: prefills through MQA
            assert cfg.attention_config.sparse_mla_force_mqa
        assert all(i.index_group is impls[0].index_group for i in impls)
        assert [i.index_group_index for i in impls] == list(range(GEOMETRY["layers"]))
        # The profiling run's reservation must cover the forward: lock the workspace as vLLM
        # does before CUDA-graph capture (a larger request then raises).
        impls[0].reserve_workspace()
        current_workspace_manager().lock()
        calls["convert"] = 0
        for li, impl in enumerate(impls):
            cache, rows = write_cache(b, kv_cache_dtype)  # each layer its own cache contents
            ref_rows = reference_rows(cache, rows, kv_cache_dtype)
            layer = make_layer(impl, heads, kv_cache_dtype, cfg)
            q = (torch.randn(b["T"], heads, GEOMETRY["qk_nope"] + ROPE, generator=gen) * 0.5).to(DTYPE)
            impl.prepare_for_batch(md)
            if li == 0:
                impl.record_logical_topk_ready()  # as the index layer does after its indexer
            out = torch.full((b["T"], heads * GEOMETRY["v_head"]), float("nan"), dtype=DTYPE)
            kv_c = torch.zeros(b["T"], LORA, dtype=DTYPE)
            k_pe = torch.zeros(b["T"], 1, ROPE, dtype=DTYPE)
            res = MLAAttention.forward_impl(layer, q, kv_c, k_pe, cache, md, out)
            ref = reference_layer(q, b, ref_rows, layer, impl.scale)
            err = rel_err(res, ref)
            print(f"rel_err {CASE} {kv_cache_dtype} layer{li} {err:.3e}")
            if not (torch.isfinite(res).all() and err < 2e-3):
                failures += 1
        current_workspace_manager().unlock()
        print(f"ok workspace {CASE} {kv_cache_dtype}: forward within reserve_workspace()'s claim")
        want_converts = 1  # once per index group: the skip layers reuse the physical top-k
        print(f"ok converts {CASE} {kv_cache_dtype}: {calls['convert']} for "
              f"{GEOMETRY['layers']} layer(s)")
        if calls["convert"] != want_converts:
            failures += 1
        if kv_cache_dtype == "fp8_ds_mla":
            # The prefill read a 16-bit copy of its context above; with a copy too small for it,
            # its tokens read the fp8 rows through the index group's physical top-k instead.
            plan = md.fp8_prefill_context
            assert plan is not None and [c.direct for c in plan.chunks] == [False], plan
            builder._fp8_context_rows = plan.chunks[0].num_rows - 1
            md = builder.build(common_prefix_len=0, common_attn_metadata=b["cm"])
            assert [c.direct for c in md.fp8_prefill_context.chunks] == [True], md
            impl = impls[0]
            cache, rows = write_cache(b, kv_cache_dtype)
            layer = make_layer(impl, heads, kv_cache_dtype, cfg)
            q = (torch.randn(b["T"], heads, GEOMETRY["qk_nope"] + ROPE, generator=gen) * 0.5).to(DTYPE)
            impl.prepare_for_batch(md)
            impl.record_logical_topk_ready()
            out = torch.full((b["T"], heads * GEOMETRY["v_head"]), float("nan"), dtype=DTYPE)
            kv_c = torch.zeros(b["T"], LORA, dtype=DTYPE)
            k_pe = torch.zeros(b["T"], 1, ROPE, dtype=DTYPE)
            res = MLAAttention.forward_impl(layer, q, kv_c, k_pe, cache, md, out)
            err = rel_err(res, reference_layer(q, b, reference_rows(cache, rows, kv_cache_dtype),
                                               layer, impl.scale))
            print(f"direct_rel_err {CASE} layer0 {err:.3e}")
            if not (torch.isfinite(res).all() and err < 2e-3):
                failures += 1
if "fp8_carry" in stats:
    print(f"ok fp8 writer bytes: every code within one e4m3 step of torch's rounding but "
          f"{stats['fp8_carry']:.3%} (at most) halved by the interpreter's dropped carry")
sys.exit(1 if failures else 0)

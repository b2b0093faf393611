"""Layer-level CPU check of TRITON_MLA_SPARSE on vLLM 0.26.0, under Triton's interpreter.

Usage: TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES= python layer_interpret_026.py TREE STANDINS_PY CASE
CASE: deepseek-v3.2 | glm-5 | glm-5.2 (one layer with the DSA indexer, two IndexCache skip layers),
each with kv cache "auto" (the fp16 model dtype) and "fp8_ds_mla".  Prints "ok <what>" lines and
"rel_err <case> <kv> <layer> <x>" lines; exits non-zero on any failure.  The geometries, the batch
and the float64 reference are tests/layer_interpret_common.py's, shared with the 0.33.0 line's
check (tests/lines/0.33.0/attention/layer_interpret_033.py).

What is vLLM 0.26.0's own code here (TREE, unmodified but for the series):
- MLAAttention.forward (the MLA layer, direct-call path): the cache write of the batch's new
  tokens through impl.do_kv_cache_update (ours: a float16 model's rows go to fp8_ds_mla as
  bfloat16), then MLAAttention.forward_impl: every token on the MQA path (no dense prefill
  backend; fp8_ds_mla with an fp16 model forces it), W_UK absorption (bmm with W_UK_T), our
  forward_mqa, v_up projection (W_UV);
- TritonMLASparseMetadataBuilder.build = SparseMLACommonMetadataBuilder.build on a
  CommonAttentionMetadata of a mixed batch (decodes, a 3-token spec-decode row, a 130-token
  prefill with context: num_decodes 3, num_prefills 1);
- TritonMLASparseImpl (ours): forward_mqa converts the request-local top-k to slots
  (convert_req_local_to_slots) per layer and runs sparse_mla_fwd in views of vLLM's workspace,
  reserved beforehand by the backend's _reserve_workspace (as the impl does when a layer is built
  on CUDA; with an fp8_ds_mla cache also the 16-bit copy of the prefills' context, which the
  batch's prefill reads) and then locked, so the forward must fit the reservation;
- IndexCache: 0.26.0's deepseek_v2 gives skip layers no indexer and passes them the model's
  shared topk_indices_buffer, which SparseMLACommonImpl picks; each layer converts it itself
  (0.26.0 has no index group: one conversion per layer, counted);
- the KV cache has a block stride of twice block_size rows (other layers' pages in between; they
  must stay untouched); the top-k buffer is wider than index_topk (256 vs 128) with valid entries
  past index_topk and -1 holes.
Cache writer: on CUDA 0.26.0 writes the MLA cache of DeepSeek-V3.2 / GLM-5.x with
concat_and_cache_mla (vllm/v1/attention/backend.py's do_kv_cache_update -> the compiled
torch.ops._C_cache_ops op; the Triton fused_norm_rope of vllm/models/deepseek_v32/nvidia is reached
only through model_class_overrides).  A compiled op cannot run here: vllm._custom_ops.
concat_and_cache_mla is replaced by the series' reference writer (tests/fp8_ds_mla_reference.py
for fp8_ds_mla, a plain row store for the 16-bit cache); everything above it is vLLM's / ours.
Reference: float64 MLA over the rows the attention must read: the 16-bit cache must hold the
written rows exactly; for fp8_ds_mla the dequantised cache bytes, which are first checked against
the rows fed to the layer (latent within one e4m3 step, rope equal to their bfloat16 rounding).
Stand-ins: the toolkit's _selection_standins (compiled modules empty, CUDA platform with capability
8.6 mocked, cuda tensor factories -> meta, device properties with 132 SMs); CUDA_VISIBLE_DEVICES=""
so that vllm.triton_utils keeps Triton with no active GPU driver, the kernels then run in the
interpreter; PIN_MEMORY False; the workspace manager on the CPU; the DSA indexer is a
SimpleNamespace holding topk_indices_buffer, filled by this script; the forward context (metadata
and slot mapping by layer name) and the DCP group (world size 1) without a model runner or process
group.  bfloat16 models are not run: the interpreter has no bfloat16 arithmetic.
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

import vllm._custom_ops as custom_ops  # noqa: E402
import vllm.utils.torch_utils as torch_utils  # noqa: E402
from fp8_ds_mla_reference import dequant_ds_mla, split_ds_mla, write_ds_mla  # noqa: E402
from layer_interpret_common import (  # noqa: E402
    BLOCK, DTYPE, GEOMETRY, INDEX_TOPK, LORA, REQUESTS, ROPE, batch, reference_layer, rel_err)
from vllm.config import VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.model_executor.layers.attention import mla_attention  # noqa: E402
from vllm.model_executor.layers.attention.mla_attention import MLAAttention  # noqa: E402
from vllm.triton_utils import HAS_TRITON  # noqa: E402
from vllm.v1.attention.backend import CommonAttentionMetadata  # noqa: E402
from vllm.v1.attention.backends.mla import triton_mla_sparse as backend  # noqa: E402
from vllm.v1.attention.ops import triton_sparse_mla as kernel_mod  # noqa: E402
from vllm.v1.kv_cache_interface import MLAAttentionSpec  # noqa: E402
from vllm.v1.worker.workspace import (  # noqa: E402
    current_workspace_manager,
    init_workspace_manager,
)

assert HAS_TRITON, "vllm.triton_utils has no Triton: run with CUDA_VISIBLE_DEVICES="
torch_utils.PIN_MEMORY = False
GEOM = GEOMETRY[CASE]
dev = torch.device("cpu")
gen = torch.Generator().manual_seed(7)
init_workspace_manager(dev)
# No process group: the layer asks the DCP world size on its first forward.
mla_attention.get_dcp_group = lambda: types.SimpleNamespace(world_size=1)


def reference_concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
    """Stand-in for the compiled concat_and_cache_mla (same arguments): the series' reference
    writer.  Any block stride; slots < 0 are skipped."""
    assert kv_c.dtype == k_pe.dtype
    if kv_cache_dtype == "fp8_ds_mla":
        write_ds_mla(kv_c, k_pe, kv_cache, slot_mapping)
        return
    assert kv_cache_dtype == "auto" and kv_cache.dtype == kv_c.dtype
    keep = slot_mapping >= 0
    s = slot_mapping[keep].long()
    kv_cache[s // kv_cache.shape[1], s % kv_cache.shape[1]] = torch.cat([kv_c, k_pe], -1)[keep]


custom_ops.concat_and_cache_mla = reference_concat_and_cache_mla

calls = {"convert": 0}
_convert = kernel_mod.convert_req_local_to_slots


def counting_convert(*args, **kwargs):
    calls["convert"] += 1
    return _convert(*args, **kwargs)


kernel_mod.convert_req_local_to_slots = counting_convert  # forward_mqa imports it per call


def vllm_config(heads: int, kv_cache_dtype: str) -> VllmConfig:
    hf = types.SimpleNamespace(
        model_type="glm_moe_dsa", index_topk=INDEX_TOPK, kv_lora_rank=LORA,
        qk_nope_head_dim=GEOM["qk_nope"], qk_rope_head_dim=ROPE,
        v_head_dim=GEOM["v_head"], q_lora_rank=1536, num_attention_heads=heads * 8)
    cfg = VllmConfig()
    object.__setattr__(cfg, "model_config", types.SimpleNamespace(
        hf_config=hf, hf_text_config=hf, dtype=DTYPE, max_model_len=4096, use_mla=True,
        get_num_attention_heads=lambda parallel_config: heads))
    cfg.cache_config.cache_dtype = kv_cache_dtype
    cfg.cache_config.block_size = BLOCK
    cfg.scheduler_config.max_num_batched_tokens = 512
    cfg.scheduler_config.max_num_seqs = 8
    return cfg


def make_impl(heads, kv_cache_dtype, indexer, buf):
    return backend.TritonMLASparseImpl(
        num_heads=heads, head_size=LORA + ROPE, scale=1.0 / math.sqrt(GEOM["qk_nope"] + ROPE),
        num_kv_heads=1, alibi_slopes=None, sliding_window=None, kv_cache_dtype=kv_cache_dtype,
        logits_soft_cap=None, attn_type="decoder", kv_sharing_target_layer_name=None,
        q_lora_rank=1536, kv_lora_rank=LORA, qk_nope_head_dim=GEOM["qk_nope"],
        qk_rope_head_dim=ROPE, qk_head_dim=GEOM["qk_nope"] + ROPE, v_head_dim=GEOM["v_head"],
        kv_b_proj=None, indexer=indexer, topk_indices_buffer=None if indexer else buf)


def make_layer(impl, heads, kv_cache_dtype, cfg, name, cache):
    """An MLAAttention whose forward / forward_impl are vLLM's; attributes set as its __init__,
    process_weights_after_loading and the KV-cache binding would for these weights."""
    layer = MLAAttention.__new__(MLAAttention)
    torch.nn.Module.__init__(layer)
    qk_nope, v_head = GEOM["qk_nope"], GEOM["v_head"]
    W_UK = torch.randn(LORA, heads, qk_nope, generator=gen) / math.sqrt(qk_nope)
    W_UV = torch.randn(LORA, heads, v_head, generator=gen) / math.sqrt(LORA)
    attrs = dict(
        impl=impl, num_heads=heads, qk_nope_head_dim=qk_nope, qk_rope_head_dim=ROPE,
        v_head_dim=v_head, kv_lora_rank=LORA, kv_cache_dtype=kv_cache_dtype, use_pcp=False,
        q_pad_num_heads=None, is_aiter_triton_fp4_bmm_enabled=False,
        is_aiter_triton_fp8_bmm_enabled=False,
        W_UK_T=W_UK.permute(1, 2, 0).to(DTYPE), W_UV=W_UV.transpose(0, 1).to(DTYPE),
        prefill_backend=None, _vllm_config=cfg, _k_scale=torch.ones(1),
        calculate_kv_scales=False, use_direct_call=True, layer_name=name, kv_cache=cache)
    for k, v in attrs.items():
        object.__setattr__(layer, k, v)
    layer.W_UK, layer.W_UV64 = W_UK.double(), W_UV.double()
    return layer


def layer_inputs(b, kv_cache_dtype):
    """An empty cache with twice the block stride (other layers' pages between this layer's
    blocks), every position's (kv_c, k_pe, slots) per request, and the batch's new rows (the
    last query_len of each request) for the layer's forward to write."""
    width = 656 if kv_cache_dtype == "fp8_ds_mla" else LORA + ROPE
    store_dtype = torch.uint8 if kv_cache_dtype == "fp8_ds_mla" else DTYPE
    full = torch.zeros(b["num_blocks"], 2 * BLOCK, width, dtype=store_dtype)
    cache = full[:, :BLOCK]
    assert cache.shape[1:] == backend.TritonMLASparseBackend.get_kv_cache_shape(
        b["num_blocks"], BLOCK, 1, LORA + ROPE, cache_dtype_str=kv_cache_dtype)[1:]
    rows, new_kv, new_pe = [], [], []
    for slots, (ql, _) in zip(b["all_slots"], REQUESTS):
        n = slots.numel()
        kv_c = (torch.randn(n, LORA, generator=gen) * 2).to(DTYPE)
        k_pe = torch.randn(n, ROPE, generator=gen).to(DTYPE)
        rows.append((kv_c, k_pe, slots))
        new_kv.append(kv_c[n - ql:])
        new_pe.append(k_pe[n - ql:])
    return full, cache, rows, torch.cat(new_kv), torch.cat(new_pe).unsqueeze(1)


def reference_rows(full, cache, rows, kv_cache_dtype):
    """float64 [seq, 576] per request: what the attention must read; checks the cache first."""
    assert full[:, BLOCK:].abs().sum() == 0, "a write reached the other layers' rows"
    out = []
    for kv_c, k_pe, slots in rows:
        stored = cache[slots // BLOCK, slots % BLOCK]
        if kv_cache_dtype == "fp8_ds_mla":
            deq = dequant_ds_mla(stored, torch.bfloat16)
            # the backend writes a float16 model's rows as bfloat16: latent within one e4m3 step
            # of its bfloat16 rounding, rope equal to it (read back as bfloat16)
            x = kv_c.to(torch.bfloat16).double()
            scales = split_ds_mla(stored, torch.bfloat16)[1].double().repeat_interleave(128, -1)
            step = x.abs() * 2.0**-3 + scales * 2.0**-9
            off = (deq[:, :LORA] - x).abs() > step
            assert not off.any(), f"{int(off.sum())} fp8 latent values off by more than a step"
            assert torch.equal(deq[:, LORA:], k_pe.to(torch.bfloat16).double()), "rope bytes"
            out.append(deq)
        else:
            assert torch.equal(stored, torch.cat([kv_c, k_pe], -1)), "16-bit cache rows"
            out.append(stored.double())
    return out


failures = 0
for kv_cache_dtype in ("auto", "fp8_ds_mla"):
    heads, layers = GEOM["heads"], GEOM["layers"]
    names = [f"layer.{i}" for i in range(layers)]
    cfg = vllm_config(heads, kv_cache_dtype)
    b = batch(gen, CommonAttentionMetadata)
    buf = b["topk"]  # the model's topk_indices_buffer, as the index layer's indexer leaves it
    with set_current_vllm_config(cfg):
        spec = MLAAttentionSpec(
            block_size=BLOCK, num_kv_heads=1, head_size=LORA + ROPE,
            dtype=torch.uint8 if kv_cache_dtype == "fp8_ds_mla" else DTYPE,
            cache_dtype_str=kv_cache_dtype)
        cfg.compilation_config.static_forward_context.update(
            {n: types.SimpleNamespace(prefill_backend=None) for n in names})
        builder = backend.TritonMLASparseMetadataBuilder(spec, names, cfg, dev)
        md = builder.build(common_prefix_len=0, common_attn_metadata=b["cm"])
        assert (md.num_decodes, md.num_prefills, md.num_decode_tokens) == (3, 1, 5), md
        assert md.prefill is None  # no dense MHA prefill backend: every token takes forward_mqa
        assert torch.equal(md.req_id_per_token[: b["T"]], torch.tensor(b["req"], dtype=torch.int32))
        # fp8_ds_mla: the prefill reads a 16-bit copy of its context (the fp8 prefill patch)
        plan = md.fp8_prefill_context
        assert (plan is not None) == (kv_cache_dtype == "fp8_ds_mla"), plan
        assert plan is None or [c.direct for c in plan.chunks] == [False], plan
        print(f"ok builder {CASE} {kv_cache_dtype}: num_decodes 3, num_prefills 1, "
              f"reorder threshold {builder.reorder_batch_threshold}")
        indexer = types.SimpleNamespace(topk_indices_buffer=buf)
        impls = [make_impl(heads, kv_cache_dtype, indexer if i == 0 else None, buf)
                 for i in range(layers)]
        assert all(i.topk_indices_buffer is buf for i in impls)  # skip layers: the shared buffer
        if kv_cache_dtype == "fp8_ds_mla":  # fp16 model + fp8_ds_mla: prefills through MQA
            assert cfg.attention_config.sparse_mla_force_mqa
        # What impls[0]._reserve_workspace() claims on a CUDA device (it skips CPU buffers),
        # then locked as vLLM does before CUDA-graph capture: a larger request raises.
        i0 = impls[0]
        backend._reserve_workspace(
            cfg.scheduler_config.max_num_batched_tokens, i0.num_heads, i0.kv_lora_rank,
            buf.shape[1], cfg.model_config.dtype, buf.device, i0.kv_cache_dtype,
            i0._context_shape(cfg))
        current_workspace_manager().lock()
        calls["convert"] = 0
        for li, (impl, name) in enumerate(zip(impls, names)):
            full, cache, rows, new_kv, new_pe = layer_inputs(b, kv_cache_dtype)
            for (kv_c, k_pe, slots), (ql, sl) in zip(rows, REQUESTS):
                n_ctx = sl - ql  # the context: written by earlier steps' forwards
                impl.do_kv_cache_update(kv_c[:n_ctx], k_pe[:n_ctx].unsqueeze(1), cache,
                                        slots[:n_ctx].to(torch.int64), kv_cache_dtype,
                                        torch.ones(1))
            layer = make_layer(impl, heads, kv_cache_dtype, cfg, name, cache)
            q = (torch.randn(b["T"], heads, GEOM["qk_nope"] + ROPE, generator=gen) * 0.5).to(DTYPE)
            ctx_stub = types.SimpleNamespace(attn_metadata={name: md},
                                             slot_mapping={name: b["cm"].slot_mapping})
            mla_attention.get_forward_context = lambda ctx_stub=ctx_stub: ctx_stub
            res = MLAAttention.forward(layer, q, new_kv, new_pe,
                                       output_shape=(b["T"], heads * GEOM["v_head"]))
            ref = reference_layer(q, b, reference_rows(full, cache, rows, kv_cache_dtype), layer,
                                  impl.scale)
            err = rel_err(res, ref)
            print(f"rel_err {CASE} {kv_cache_dtype} layer{li} {err:.3e}")
            if not (torch.isfinite(res).all() and err < 2e-3):
                failures += 1
        current_workspace_manager().unlock()
        print(f"ok workspace {CASE} {kv_cache_dtype}: forward within _reserve_workspace()'s claim")
        print(f"ok converts {CASE} {kv_cache_dtype}: {calls['convert']} for {layers} layer(s)")
        if calls["convert"] != layers:  # no index group on 0.26.0: each layer converts
            failures += 1
sys.exit(1 if failures else 0)

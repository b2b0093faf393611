"""TRITON_MLA_SPARSE with an fp8_ds_mla KV cache, under the Triton CPU interpreter.

Usage: TRITON_INTERPRET=1 python tests/backend_fp8_interpret_smoke.py TREE
(run by tests/test_fp8_kv_interpret.py::test_backend_fp8_smoke in its own
process: TRITON_INTERPRET and the vLLM stand-ins must not leak into pytest).

Checks, printing one "ok <name>" line each (the caller asserts them all):
  spec        the backend's cache shape for fp8_ds_mla is [blocks, 64, 656] and
              vLLM's MLAAttentionSpec sizes a page with the same bytes
  canon       mla_attention._canonicalize_sparse_mla_kv_cache_dtype turns fp8 /
              fp8_e4m3 into fp8_ds_mla for TRITON_MLA_SPARSE, keeps auto
  combo       supports_combination: fp8 variants valid, fp8_e5m2 refused
  force_mqa   an fp16 model with an fp8_ds_mla cache sets
              attention_config.sparse_mla_force_mqa; a bf16 model does not
  forward     builder.build + impl.forward_mqa on a mixed decode batch (fp16,
              16 heads, top-k 128) over a cache written by the reference writer
              (tests/fp8_ds_mla_reference.py) vs the float64 reference of the
              dequantised cache: "rel_err <x>"
  prefill     decodes and three long prefills with a 320-row context buffer:
              the first two share one 16-bit copy of their context, the third
              (longer than the buffer) reads the cache; "prefill_rel_err <x>"
Relies on the stand-ins of smla.selection.import_vllm_tree and the helpers of
tests/gpu/test_backend_gpu.py (see tests/backend_interpret_smoke.py).
"""
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1"
# vllm.triton_utils hands out the real Triton only with an active driver, or none expected: no GPU
# here, so say so (as a Ray worker does) and the kernels run in the interpreter as on a GPU.
os.environ["CUDA_VISIBLE_DEVICES"] = ""
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "gpu"))
from types import SimpleNamespace  # noqa: E402

import torch  # noqa: E402

import test_backend_gpu as T  # noqa: E402
from fp8_ds_mla_reference import dequant_ds_mla, write_ds_mla  # noqa: E402
from smla.selection import import_vllm_tree  # noqa: E402

import_vllm_tree(sys.argv[1])
import vllm.utils.torch_utils as torch_utils  # noqa: E402
from vllm.model_executor.layers.attention import mla_attention  # noqa: E402
from vllm.platforms.interface import DeviceCapability  # noqa: E402
from vllm.v1.attention.backends.mla import triton_mla_sparse as m  # noqa: E402
from vllm.v1.kv_cache_interface import MLAAttentionSpec  # noqa: E402

torch_utils.PIN_MEMORY = False
B = m.TritonMLASparseBackend

# spec -------------------------------------------------------------------
shape = B.get_kv_cache_shape(10, 64, 1, 576, cache_dtype_str="fp8_ds_mla")
assert shape == (10, 64, 656), shape
assert B.get_kv_cache_shape(10, 64, 1, 576, cache_dtype_str="auto") == (10, 64, 576)
spec = MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=576, dtype=torch.uint8,
                        cache_dtype_str="fp8_ds_mla")
assert spec.page_size_bytes == 64 * 656, spec.page_size_bytes
print("ok spec")

# canon ------------------------------------------------------------------
canon = mla_attention._canonicalize_sparse_mla_kv_cache_dtype
assert canon(B, "fp8") == "fp8_ds_mla" and canon(B, "fp8_e4m3") == "fp8_ds_mla"
assert canon(B, "fp8_ds_mla") == "fp8_ds_mla" and canon(B, "auto") == "auto"
print("ok canon")

# combo ------------------------------------------------------------------
for kv in ("fp8", "fp8_e4m3", "fp8_ds_mla", "fp8_e5m2"):
    for dt in (torch.float16, torch.bfloat16):
        why = B.supports_combination(576, dt, kv, 64, True, False, True, False,
                                     DeviceCapability(8, 6))
        assert (why is None) == (kv != "fp8_e5m2"), (kv, dt, why)
        assert kv in B.supported_kv_cache_dtypes or kv == "fp8_e5m2"
print("ok combo")

# force_mqa --------------------------------------------------------------
import vllm.config as vcfg  # noqa: E402

topk_buf = torch.full((32, 128), -1, dtype=torch.int32)
for dt, want in ((torch.float16, True), (torch.bfloat16, False)):
    cfg = SimpleNamespace(model_config=SimpleNamespace(dtype=dt),
                          attention_config=SimpleNamespace(sparse_mla_force_mqa=False))
    saved = vcfg.get_current_vllm_config_or_none
    vcfg.get_current_vllm_config_or_none = lambda cfg=cfg: cfg
    try:
        m.TritonMLASparseImpl(
            num_heads=16, head_size=576, scale=0.06, num_kv_heads=1, alibi_slopes=None,
            sliding_window=None, kv_cache_dtype="fp8_ds_mla", logits_soft_cap=None,
            attn_type="decoder", kv_sharing_target_layer_name=None, q_lora_rank=2048,
            kv_lora_rank=512, qk_nope_head_dim=192, qk_rope_head_dim=64, qk_head_dim=256,
            v_head_dim=256, kv_b_proj=None,
            indexer=SimpleNamespace(topk_indices_buffer=topk_buf))
    finally:
        vcfg.get_current_vllm_config_or_none = saved
    assert cfg.attention_config.sparse_mla_force_mqa is want, (dt, cfg)
print("ok force_mqa")

# forward ----------------------------------------------------------------
T.REQUESTS = [(1, 300), (1, 70), (3, 100), (2, 2)]
T.TOPK = 128
dev = torch.device("cpu")
heads, dtype = 16, torch.float16
b, md = T.small_decode_case(m, dtype, dev, heads)
# the same latent rows, stored as fp8_ds_mla the way the backend writes them
# for a float16 model (do_kv_cache_update, the fp16 writers fix): as bfloat16 rows
nb = b["kv_cache"].shape[0]
cache = torch.zeros((nb, 64, 656), dtype=torch.uint8)
rows = b["kv_cache"].reshape(-1, 576).to(torch.bfloat16)
write_ds_mla(rows[:, :512].contiguous(), rows[:, 512:].contiguous(), cache,
             torch.arange(nb * 64))
buf = torch.full((32, T.TOPK), -1, dtype=torch.int32)
buf[: b["T"]] = b["topk"]
impl = T._make_impl(m, heads, 0.06, SimpleNamespace(topk_indices_buffer=buf))
impl.kv_cache_dtype = "fp8_ds_mla"  # as the layer passes it (helper builds an "auto" impl)
q = b["q"]
ql_nope = q[..., :512].transpose(0, 1).contiguous().transpose(0, 1)
out, lse = impl.forward_mqa((ql_nope, q[..., 512:]), cache, md, None)
assert lse is None and out.dtype == dtype
slots = T.reference_convert(b["req_id"], b["block_table"], b["topk"], 64)
ref = T.reference_sparse_mla(q, dequant_ds_mla(cache.view(-1, 656), torch.bfloat16), slots, 0.06)
print("ok forward")
print("rel_err", T.rel_err(out, ref), tuple(out.shape))

# prefill ----------------------------------------------------------------
# Decodes first, then prefills of more than 128 new tokens (the reorder
# threshold): 150 + 160 rows fit the 320-row buffer, 400 do not.
T.REQUESTS = [(1, 300), (2, 70), (129, 150), (129, 160), (129, 400)]
b = T._batch(dtype, heads, dev, torch.Generator().manual_seed(5))
nb = b["kv_cache"].shape[0]
cache = torch.zeros((nb, 64, 656), dtype=torch.uint8)
rows = b["kv_cache"].reshape(-1, 576).to(torch.bfloat16)
write_ds_mla(rows[:, :512].contiguous(), rows[:, 512:].contiguous(), cache,
             torch.arange(nb * 64))
builder = T.make_builder(m, heads, dtype, 512, dev, cache_dtype_str="fp8_ds_mla",
                         max_model_len=320)
md = builder.build(0, T._common_metadata(b, dev))
ctx = md.fp8_prefill_context
assert [(c.tokens, c.direct) for c in ctx.chunks] == [((3, 261), False), ((261, 390), True)], ctx
assert ctx.req_row_starts.tolist() == [0, 150, 0], ctx
buf = torch.full((512, T.TOPK), -1, dtype=torch.int32)
buf[: b["T"]] = b["topk"]
impl = T._make_impl(m, heads, 0.06, SimpleNamespace(topk_indices_buffer=buf))
impl.kv_cache_dtype = "fp8_ds_mla"
q = b["q"]
out, _ = impl.forward_mqa((q[..., :512], q[..., 512:]), cache, md, None)
slots = T.reference_convert(b["req_id"], b["block_table"], b["topk"], 64)
ref = T.reference_sparse_mla(q, dequant_ds_mla(cache.view(-1, 656), torch.bfloat16), slots, 0.06)
print("ok prefill")
print("prefill_rel_err", T.rel_err(out, ref), tuple(out.shape))

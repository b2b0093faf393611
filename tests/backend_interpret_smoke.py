"""Backend smoke run under the Triton CPU interpreter, in its own process.

Usage: TRITON_INTERPRET=1 python tests/backend_interpret_smoke.py TREE
Drives TritonMLASparseMetadataBuilder.build + TritonMLASparseImpl.forward_mqa
on a tiny mixed decode/prefill batch (fp32, 16 heads, top-k 128) and prints
"rel_err <x>" against the float64 reference.  Relies on the stand-ins of
smla.selection.import_vllm_tree (vllm._C, vllm.vllm_flash_attn,
flashinfer, cuda->meta tensor factories) and on SimpleNamespace stand-ins for
the VllmConfig, KV-cache spec and DSA indexer (as tests/gpu/test_backend_gpu.py).
"""
import os, sys, time
assert os.environ.get("TRITON_INTERPRET") == "1"
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE); sys.path.insert(0, os.path.join(HERE, "gpu"))
import torch
import test_backend_gpu as T
from types import SimpleNamespace
from smla.selection import import_vllm_tree
print(import_vllm_tree(sys.argv[1]))
from vllm.v1.attention.backends.mla import triton_mla_sparse as m
from vllm.v1.attention.backend import CommonAttentionMetadata
T.REQUESTS = [(1, 300), (1, 70), (3, 100), (2, 2)]
T.TOPK = 128
dev = torch.device("cpu"); heads=16; dtype=torch.float32
gen = torch.Generator().manual_seed(0)
b = T._batch(dtype, heads, dev, gen)
vc = SimpleNamespace(model_config=SimpleNamespace(hf_config=SimpleNamespace(index_topk=T.TOPK)), scheduler_config=SimpleNamespace(max_num_batched_tokens=32))
builder = m.TritonMLASparseMetadataBuilder(SimpleNamespace(block_size=64), ["l"], vc, dev)
cm = CommonAttentionMetadata(query_start_loc=b["query_start_loc_cpu"], query_start_loc_cpu=b["query_start_loc_cpu"], seq_lens=b["seq_lens"], num_reqs=4, num_actual_tokens=b["T"], max_query_len=b["max_query_len"], max_seq_len=b["max_seq_len"], block_table_tensor=b["block_table"], slot_mapping=b["slot_mapping"])
md = builder.build(0, cm)
buf = torch.full((32, T.TOPK), -1, dtype=torch.int32); buf[:b["T"]] = b["topk"]
impl = m.TritonMLASparseImpl(num_heads=heads, head_size=576, scale=0.06, num_kv_heads=1, alibi_slopes=None, sliding_window=None, kv_cache_dtype="auto", logits_soft_cap=None, attn_type="decoder", kv_sharing_target_layer_name=None, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=192, qk_rope_head_dim=64, qk_head_dim=256, v_head_dim=256, kv_b_proj=None, indexer=SimpleNamespace(topk_indices_buffer=buf))
q=b["q"]; t0=time.time()
out,lse = impl.forward_mqa((q[...,:512], q[...,512:]), b["kv_cache"], md, None)
slots = T.reference_convert(b["req_id"], b["block_table"], b["topk"], 64)
ref = T.reference_sparse_mla(q, b["kv_cache"], slots, 0.06)
print("rel_err", T.rel_err(out, ref), "secs", time.time()-t0, out.shape)

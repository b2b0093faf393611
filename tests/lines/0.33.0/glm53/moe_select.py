"""vLLM 0.33.0's FP8 MoE backend choice for GLM-5.3-Flash's experts (288 experts, top-8, hidden
4096, moe_intermediate 2048, block-fp8 128x128 weights with dynamic 1x128 activations) at one
mocked CUDA capability: select_fp8_moe_backend, the tree's own oracle (the toolkit's stand-ins:
CudaPlatform with the capability, empty compiled modules; cutlass capability queries answer False
while the quantization utilities import). Prints one JSON line.
usage: SMLA_033_TREE=<tree> SMLA_STANDINS=<.../_selection_standins.py> python moe_select.py 8.6"""
import json
import os
import sys
os.environ["CUDA_VISIBLE_DEVICES"] = ""
TREE = os.environ["SMLA_033_TREE"]; sys.path.insert(0, TREE)
sys.path.insert(0, os.path.dirname(os.environ["SMLA_STANDINS"]))
import _selection_standins as standins
cap = sys.argv[1]
standins.import_vllm_tree(TREE, capability=cap)
import vllm._custom_ops as ops
saved = {n: getattr(ops, n) for n in dir(ops) if n.startswith("cutlass_") and "_supports_" in n}
for n in saved: setattr(ops, n, lambda *a, **k: False)
import vllm.model_executor.layers.quantization.utils.w8a8_utils  # noqa
for n, f in saved.items(): setattr(ops, n, f)
import torch
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig, FusedMoEParallelConfig, RoutingMethodType
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.oracle.fp8 import select_fp8_moe_backend
from vllm.model_executor.layers.quantization.utils.quant_utils import kFp8Static128BlockSym, kFp8Dynamic128Sym
out = {}
with set_current_vllm_config(VllmConfig()):
    cfg = FusedMoEConfig(num_experts=288, experts_per_token=8, hidden_dim=4096, intermediate_size=2048,
        num_local_experts=288, num_logical_experts=288, moe_parallel_config=FusedMoEParallelConfig.make_no_parallel(),
        activation=MoEActivation.SILU, in_dtype=torch.bfloat16, device="cpu", routing_method=RoutingMethodType.DeepSeekV3, max_num_tokens=2048)
    try:
        b, cls = select_fp8_moe_backend(cfg, kFp8Static128BlockSym, kFp8Dynamic128Sym)
        out["fp8_block"] = [str(b), getattr(cls, "__name__", None)]
    except Exception as e:
        out["fp8_block"] = f"{type(e).__name__}: {str(e)[:200]}"
print(json.dumps({cap: out}))

"""CPU harness for the 0.33.0 indexer / DeepSeek-V3.2 CUDA-path proof (port-idx).

Imports vLLM from the clone ($PORT_IDX_TREE, default <tree>) as the
toolkit's selection harness does (tools/smla/_selection_standins.py: empty
compiled modules, CudaPlatform with a mocked compute capability, CUDA factories
-> meta), with Triton's interpreter on. Reuses the 0.26.0 line's float64
indexer references (tests/indexer_reference.py).

Stand-ins beyond the harness's, all listed here:
- CUDA_VISIBLE_DEVICES="" so vllm.triton_utils accepts Triton with no active
  GPU driver (its "distributed environment" branch): the kernels then run in
  the interpreter.
- vllm._custom_ops.cutlass_*_supports_* answer False while the quantization
  utilities import (module-level compiled-op queries).
- Compiled ops the indexer op calls (cp_gather_indexer_k_quant_cache,
  top_k_per_row_prefill, top_k_per_row_decode, persistent_topk): torch
  implementations in indexer_op_standins.py, written from the CUDA sources'
  semantics.
- vllm.models.glm5next as a bare package (its submodules import as they are):
  its __init__ imports the whole GLM-5.3-Flash model, whose multimodal part
  needs torchvision, which the CPU suite does not install; the kpool proofs
  import only its indexer op and kernels.
"""
from __future__ import annotations

import importlib.util
import os
import types
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
os.environ["CUDA_VISIBLE_DEVICES"] = ""

TREE = Path(os.environ["PORT_IDX_TREE"])
MAIN = Path(__file__).resolve().parents[4]  # the repository root
for p in (str(TREE), str(TREE / "tests"), str(MAIN / "tests"), str(MAIN / "tools" / "smla")):
    if p not in sys.path:
        sys.path.insert(0, p)

import _selection_standins as standins  # noqa: E402

STAND_INS = standins.import_vllm_tree(TREE, capability="8.0")

import vllm.models  # noqa: E402

if "vllm.models.glm5next" not in sys.modules:
    _glm5next = types.ModuleType("vllm.models.glm5next")
    _glm5next.__path__ = [str(TREE / "vllm" / "models" / "glm5next")]
    sys.modules[_glm5next.__name__] = vllm.models.glm5next = _glm5next

import vllm._custom_ops as _custom_ops  # noqa: E402

_saved = {n: getattr(_custom_ops, n) for n in dir(_custom_ops)
          if n.startswith("cutlass_") and "_supports_" in n}
for _n in _saved:
    setattr(_custom_ops, _n, lambda *a, **k: False)
import vllm.model_executor.layers.quantization.utils.w8a8_utils  # noqa: E402,F401

for _n, _f in _saved.items():
    setattr(_custom_ops, _n, _f)

# Stand-in added in the toolkit (not in the port's proof): CuTe DSL (nvidia-cutlass-dsl, a CUDA
# requirement of vLLM 0.33.0, about 0.5 GB) is not installed for the CPU suite. On a CUDA platform
# fused_q imports its CuTe DSL module only to ask is_fused_q_cutedsl_supported, which is False below
# sm100 whatever the tensors; the stand-in answers that and raises where the real module would be asked.
if importlib.util.find_spec("cutlass") is None:
    def _cutedsl_supported(*args, **kwargs):
        from vllm.platforms import current_platform

        if current_platform.has_device_capability(100):
            raise RuntimeError("CuTe DSL is not installed: the sm100+ fused_q check needs it")
        return False

    def _cutedsl_missing(*args, **kwargs):
        raise RuntimeError("CuTe DSL is not installed (stand-in)")

    _cutedsl = types.ModuleType("vllm.models.deepseek_v32.nvidia.ops.fused_q_cutedsl")
    _cutedsl.is_fused_q_cutedsl_supported = _cutedsl_supported
    _cutedsl.fused_q_cutedsl = _cutedsl_missing
    sys.modules[_cutedsl.__name__] = _cutedsl

"""CPU harness for the 0.33.0 indexer / DeepSeek-V3.2 CUDA-path proof (port-idx).

Imports vLLM from the clone ($PORT_IDX_TREE, default /work/port/port-idx) as the
toolkit's selection harness does (tools/smla/_selection_standins.py: empty
compiled modules, CudaPlatform with a mocked compute capability, CUDA factories
-> meta), with Triton's interpreter on. Reuses the 0.26.0 line's float64
indexer references (/work/main/tests/indexer_reference.py).

Stand-ins beyond the harness's, all listed here:
- CUDA_VISIBLE_DEVICES="" so vllm.triton_utils accepts Triton with no active
  GPU driver (its "distributed environment" branch): the kernels then run in
  the interpreter.
- vllm._custom_ops.cutlass_*_supports_* answer False while the quantization
  utilities import (module-level compiled-op queries).
- Compiled ops the indexer op calls (cp_gather_indexer_k_quant_cache,
  top_k_per_row_prefill, top_k_per_row_decode): torch implementations in
  test_indexer_op.py, written from the CUDA sources' semantics.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
os.environ["CUDA_VISIBLE_DEVICES"] = ""

TREE = Path(os.environ.get("PORT_IDX_TREE", "/work/port/port-idx"))
MAIN = Path(__file__).resolve().parents[4]  # the repository root
for p in (str(TREE), str(TREE / "tests"), str(MAIN / "tests"), str(MAIN / "tools" / "smla")):
    if p not in sys.path:
        sys.path.insert(0, p)

import _selection_standins as standins  # noqa: E402

STAND_INS = standins.import_vllm_tree(TREE, capability="8.0")

import vllm._custom_ops as _custom_ops  # noqa: E402

_saved = {n: getattr(_custom_ops, n) for n in dir(_custom_ops)
          if n.startswith("cutlass_") and "_supports_" in n}
for _n in _saved:
    setattr(_custom_ops, _n, lambda *a, **k: False)
import vllm.model_executor.layers.quantization.utils.w8a8_utils  # noqa: E402,F401

for _n, _f in _saved.items():
    setattr(_custom_ops, _n, _f)

"""Layer-level CPU check of TRITON_MLA_SPARSE on vLLM 0.26.0 under Triton's interpreter: vLLM's
MLAAttention.forward (cache write through the impl, forward_impl: W_UK absorption, forward_mqa,
v_up), its sparse metadata builder and our impl, for the DeepSeek-V3.2, GLM-5 and GLM-5.2
(an index layer and two IndexCache skip layers) geometries, a mixed decode/prefill batch, 16-bit
(fp16) and fp8_ds_mla caches, against float64 (the same batch and reference as the 0.33.0 line's
check).  Each case runs layer_interpret_026.py (beside this file; what is stood in is said there,
the compiled cache writer among it) in its own process: TRITON_INTERPRET and the stand-ins must
not leak into this one.

Run (CPU only; run by tests/test_backend_interpret.py::test_line_layer_proof):
  VLLM_TREE=<0.26.0 tree> SMLA_STANDINS=tools/smla/_selection_standins.py \
  SMLA_TEST_REFS=tests .venv/bin/python -m pytest -q test_layer_interpret_026.py
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "layer_interpret_026.py"
LAYERS = {"deepseek-v3.2": 1, "glm-5": 1, "glm-5.2": 3}


@pytest.mark.parametrize("case", list(LAYERS))
def test_layer_forward_interpreted(case):
    tree = os.environ.get("VLLM_TREE")
    if not tree:
        pytest.skip("set VLLM_TREE")
    standins = os.environ.get("SMLA_STANDINS",
                              str(Path(__file__).resolve().parents[4] / "tools/smla/_selection_standins.py"))
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="", VLLM_LOGGING_LEVEL="ERROR")
    proc = subprocess.run([sys.executable, str(SCRIPT), tree, standins, case], capture_output=True,
                          text=True, timeout=1800, env=env, cwd="/")
    out = proc.stdout
    assert proc.returncode == 0, (out + proc.stderr)[-6000:]
    errs = re.findall(r"rel_err (\S+) (\S+) layer(\d) (\S+)", out)
    assert len(errs) == 2 * LAYERS[case], out
    assert {kv for _, kv, _, _ in errs} == {"auto", "fp8_ds_mla"}
    assert all(float(e) < 2e-3 for *_, e in errs), errs
    # 0.26.0 has no index group: every layer converts the shared top-k buffer itself
    assert out.count(f"{LAYERS[case]} for {LAYERS[case]} layer(s)") == 2, out
    # the forward fits what the backend's _reserve_workspace claimed (workspace locked)
    assert out.count("ok workspace") == 2, out

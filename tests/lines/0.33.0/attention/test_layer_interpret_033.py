"""Layer-level CPU check of TRITON_MLA_SPARSE on vLLM 0.33.0 under Triton's interpreter: vLLM's
fused cache writer, its sparse metadata builder, MLAAttention.forward_impl and SparseMLACommonImpl
with our impl, for the DeepSeek-V3.2, GLM-5, GLM-5.2 (index group of three layers) and GLM-5.3-Flash
(NoPE, head size 512; its real top-k geometry: index_topk 2048 in a 2176-wide buffer filled by its
pooled indexer op, sparse_attn_indexer_kpool, with a decode at 8,203 tokens) geometries,
a mixed decode/prefill batch, 16-bit (fp16) and fp8_ds_mla caches, against float64.  Each case runs
layer_interpret_033.py (beside this file; what is stood in is said there) in its own process:
TRITON_INTERPRET and the stand-ins must not leak into this one.

Run (CPU only, ~3-15 min per case on 2 cores):
  SMLA_033_TREE=<tree> SMLA_STANDINS=tools/smla/_selection_standins.py \
  SMLA_TEST_REFS=tests .venv-0.33.0/bin/python -m pytest -q test_layer_interpret_033.py
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "layer_interpret_033.py"
LAYERS = {"deepseek-v3.2": 1, "glm-5": 1, "glm-5.2": 3, "glm-5.3-flash": 1}


@pytest.mark.parametrize("case", list(LAYERS))
def test_layer_forward_interpreted(case):
    tree = os.environ.get("SMLA_033_TREE")
    if not tree:
        pytest.skip("set SMLA_033_TREE")
    standins = os.environ.get("SMLA_STANDINS",
                              str(Path(__file__).resolve().parents[4] / "tools/smla/_selection_standins.py"))
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="", VLLM_LOGGING_LEVEL="ERROR")
    proc = subprocess.run([sys.executable, str(SCRIPT), tree, standins, case], capture_output=True,
                          text=True, timeout=3600, env=env, cwd="/")
    out = proc.stdout
    assert proc.returncode == 0, (out + proc.stderr)[-6000:]
    errs = re.findall(r"rel_err (\S+) (\S+) layer(\d) (\S+)", out)
    assert len(errs) == 2 * LAYERS[case], out
    assert {kv for _, kv, _, _ in errs} == {"auto", "fp8_ds_mla"}
    assert all(float(e) < 2e-3 for *_, e in errs), errs
    # fp8_ds_mla: the prefill through its 16-bit context copy above, then through the fp8 rows
    direct = re.findall(r"direct_rel_err \S+ layer0 (\S+)", out)
    assert len(direct) == 1 and float(direct[0]) < 2e-3, out
    # the index group converts the logical top-k once for all its layers
    assert out.count(f"1 for {LAYERS[case]} layer(s)") == 2, out
    # the forward fits what reserve_workspace() claimed (workspace locked)
    assert out.count("ok workspace") == 2, out
    if case == "glm-5.3-flash":  # the pooled op's top-k: 512 of 2,050 pools, tail tokens, -1 holes
        assert out.count("ok pooled indexer op glm-5.3-flash") == 2, out
        assert out.count("ok pooled topk glm-5.3-flash") == 2, out
        assert "the 8203-token decode: 512 of 2050 pools + 3 tail tokens" in out, out
        assert out.count("ok builder glm-5.3-flash") == 2 and "num_decodes 4, num_prefills 1" in out

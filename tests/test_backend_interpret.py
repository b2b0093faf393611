"""CPU (Triton interpreter) smoke test of the TRITON_MLA_SPARSE backend.

Runs tests/backend_interpret_smoke.py in a subprocess (TRITON_INTERPRET must be
set before triton is imported, and the vLLM stand-ins must not leak into this
pytest process).  Relies on stand-ins: see that script's docstring.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import lineproofs


@lineproofs.replaced_on(v0_33_0=(
    "0.33.0's backend is a SparseMLACommonImpl hook with a new metadata builder; test_line_layer_proof "
    "runs it there through vLLM's MLA layer, cache writer and builder (tests/lines/0.33.0/attention)"))
def test_backend_forward_interpreted_with_stand_ins(vllm_tree):
    script = Path(__file__).resolve().parent / "backend_interpret_smoke.py"
    env = dict(os.environ, TRITON_INTERPRET="1", VLLM_LOGGING_LEVEL="ERROR")
    proc = subprocess.run([sys.executable, str(script), str(vllm_tree)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    m = re.search(r"rel_err (\S+)", proc.stdout)
    assert m, proc.stdout[-2000:]
    assert float(m.group(1)) < 1e-3  # float16 output rounding (~3e-4)


def test_explicit_backend_validation_reasons(vllm_tree):
    """--attention-backend TRITON_MLA_SPARSE through vLLM's own selector
    (capability mocked by smla.selection): valid wherever the kernel runs,
    an fp8 cache stored as fp8_ds_mla; refused with a reason for an fp8
    format it does not read, a 16-bit cache of the other type than the model,
    and GPUs below sm80."""
    from smla import selection as S

    cells = [
        S.Cell("glm-5", "8.6", "float16", backend="TRITON_MLA_SPARSE"),
        S.Cell("glm-5", "12.0", "bfloat16", kv_cache_dtype="bfloat16", backend="TRITON_MLA_SPARSE"),
        S.Cell("glm-5", "9.0", "bfloat16", backend="TRITON_MLA_SPARSE"),
        S.Cell("glm-5", "8.0", "bfloat16", kv_cache_dtype="fp8", backend="TRITON_MLA_SPARSE"),
        S.Cell("glm-5", "8.0", "bfloat16", kv_cache_dtype="fp8_e5m2", backend="TRITON_MLA_SPARSE"),
        S.Cell("glm-5", "8.9", "float16", kv_cache_dtype="bfloat16", backend="TRITON_MLA_SPARSE"),
        S.Cell("glm-5", "7.5", "float16", backend="TRITON_MLA_SPARSE"),
    ]
    res = S.run_selection(vllm_tree, cells)
    picked = [r.get("selected") for r in res]
    assert picked[:4] == ["TRITON_MLA_SPARSE"] * 4, [(r.get("selected"), r.get("error")) for r in res]
    assert res[3]["kv_cache_dtype_used"] == "fp8_ds_mla"
    assert picked[4:] == [None, None, None]
    assert "kv_cache_dtype fp8_e5m2 not supported by TRITON_MLA_SPARSE" in res[4]["error"]
    assert "cache in the model dtype" in res[5]["error"]  # 0.26.0: "needs the cache ...", 0.33.0: "needs a 16-bit cache ..."
    assert "compute capability not supported" in res[6]["error"]


# tests/lines/<line>/attention/: the layer-level check (vLLM's MLA layer, sparse metadata builder and
# our impl; DeepSeek-V3.2, GLM-5 and GLM-5.2's index layer + IndexCache layers, and on 0.33.0
# GLM-5.3-Flash's NoPE head 512 with its top-k geometry (2048 of a 2176-wide buffer, filled by its
# pooled indexer op, a decode at 8,203 tokens); a mixed decode/prefill batch; 16-bit and fp8_ds_mla
# caches) against float64, the batch and reference shared (tests/layer_interpret_common.py).  0.33.0: its fused Triton
# cache writer, MLAAttention.forward_impl and SparseMLACommonImpl's index group; 0.26.0:
# MLAAttention.forward with the impl's cache update (the compiled concat_and_cache_mla replaced by the
# reference writer) and per-layer conversion.
LINE_PROOFS = {"0.33.0": [("attention", "test_layer_interpret_033.py", 4)],
               "0.26.0": [("attention", "test_layer_interpret_026.py", 3)]}


@pytest.mark.parametrize("case", lineproofs.cases(
    LINE_PROOFS, "no layer-level check for this line yet (tests/lines/<line>/attention/)"))
def test_line_layer_proof(vllm_tree, case):
    lineproofs.check(case, vllm_tree)


# The line's own vLLM-style backend tests that need no GPU (0.33.0: tests/v1/attention/
# test_triton_mla_sparse.py of the series: validation, KV-cache spec, block stride, top-k width), run
# by pytest in the tree under the toolkit's stand-ins (tests/lines/<line>/attention/standins_plugin.py);
# the least number that must pass.
LINE_TREE_TESTS = {"0.33.0": ("tests/v1/attention/test_triton_mla_sparse.py", 98)}


@pytest.mark.skipif(lineproofs.current_line() not in LINE_TREE_TESTS,
                    reason="this line's backend tests are the series' kernel tests (test_series_kernel_tests.py)")
def test_line_tree_backend_tests(vllm_tree):
    rel, least = LINE_TREE_TESTS[lineproofs.current_line()]
    plugin_dir = lineproofs.proof_dir("attention")
    env = dict(os.environ, SMLA_033_TREE=str(vllm_tree), PYTHONPATH=str(plugin_dir),
               SMLA_STANDINS=str(lineproofs.REPO_ROOT / "tools" / "smla" / "_selection_standins.py"))
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "standins_plugin", "--noconftest",
                           "-p", "no:cacheprovider", "-W", "ignore", rel], cwd=vllm_tree, env=env,
                          capture_output=True, text=True, timeout=900)
    tail = "\n".join(proc.stdout.splitlines()[-15:])
    assert proc.returncode == 0, tail
    passed = re.search(r"(\d+) passed", tail)
    assert passed and int(passed.group(1)) >= least, tail

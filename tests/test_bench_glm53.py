"""bench/bench_glm53.py's CPU smoke path (TRITON_INTERPRET=1, in a process of its own: the
interpreter must be chosen before triton is imported): the benchmark's own GLM-5.3-Flash cells on
tiny shapes -- the NoPE attention call TRITON_MLA_SPARSE makes (head 512, q_pe [T, H, 0], the
2176-style pooled top-k row with its tail and -1 padding, 16-bit and fp8_ds_mla caches) and the
pooled indexer's paged and prefill logits over the 132-byte pool pages (both Triton paths, the
queries quantised by kpool_compress loaded through tests/gpu/test_kpool_indexer_gpu.py's loader)
-- against float64. Fails when the call form or the loader stops working, or the results drift."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_bench_glm53_cpu_smoke(vllm_tree, tmp_path):
    if not (vllm_tree / "vllm/models/glm5next/nvidia/ops/kpool_compress.py").is_file():
        pytest.skip("this line's vLLM has no GLM-5.3-Flash (vllm/models/glm5next: 0.33.0 on)")
    env = dict(os.environ, SMLA_TREE=str(vllm_tree), TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "bench_glm53.py"), str(tmp_path),
                           "--cpu-smoke"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    rows = json.loads((tmp_path / "glm53-cpu-smoke.json").read_text())["rows"]
    att = [r for r in rows if r["call"] == "attention"]
    assert [r["cache"] for r in att] == ["float16", "fp8_ds_mla"]
    for r in att:
        assert "error" not in r, r
        assert r["topk_width"] == 128 and r["in_place"], r  # round_up(64 + 3, 128)
        assert r["rel_err_vs_f64"] < 2e-3, r
    dec = [r for r in rows if r["call"] == "indexer-decode"]
    assert sorted(r["page_pools"] for r in dec) == [32, 64]
    pre = [r for r in rows if r["call"] == "indexer-prefill"]
    assert len(pre) == 1
    for r in dec + pre:
        for side in ("ours", "software"):
            assert f"{side}_error" not in r, r
            assert r[f"{side}_rel_err_vs_f64"] < 1e-5, r

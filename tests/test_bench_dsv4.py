"""bench/bench_dsv4.py's (and bench_dsv4_prefill.py's) CPU smoke path (TRITON_INTERPRET=1, in a process of its own: the
interpreter must be chosen before triton is imported): the DeepSeek-V4 decode call built from
the argument expressions of the tree's DeepseekV4TritonAttention._forward_decode (and FlashMLA's
from DeepseekV4FlashMLAAttention._forward_decode), against the series' float64 reference. Fails
when the class starts passing a name the benchmark does not bind, or the call's result drifts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_bench_dsv4_cpu_smoke(vllm_tree, tmp_path):
    env = dict(os.environ, SMLA_TREE=str(vllm_tree), TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "bench_dsv4.py"), str(tmp_path),
                           "--cpu-smoke", "--sweep"], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    res = json.loads((tmp_path / "dsv4-cpu-smoke.json").read_text())
    assert [r["layer"] for r in res["rows"]] == ["swa", "c4", "c128"]
    for r in res["rows"]:
        assert r["rel_err_vs_f64"] < 2e-3, r
        assert r["bytes"] == 584 * r["rows_gathered"] > 0, r
        # --sweep: the same call under other launch configs (head/row tiles), same answer
        assert [c["config"] for c in r["sweep"]] == ["16:32:8:1", "32:16:4:1"], r
        assert all(c["rel_err_vs_f64"] < 2e-3 for c in r["sweep"]), r


def test_bench_dsv4_prefill_cpu_smoke(vllm_tree, tmp_path):
    """bench/bench_dsv4_prefill.py: each layer's prefill chunk through the call read from the
    tree's DeepseekV4TritonAttention._sparse_prefill (in the plan's unsplit 64-row tile under the
    interpreter), against float64 with the sink."""
    env = dict(os.environ, SMLA_TREE=str(vllm_tree), TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "bench_dsv4_prefill.py"),
                           str(tmp_path), "--cpu-smoke"], env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    res = json.loads((tmp_path / "dsv4_prefill-cpu-smoke.json").read_text())
    assert [r["layer"] for r in res["rows"]] == ["swa", "c4", "c128"]
    assert all(r["rel_err_vs_f64"] < 2e-3 for r in res["rows"]), res

"""bench/bench_dsv4.py's CPU smoke path (TRITON_INTERPRET=1, in a process of its own: the
interpreter must be chosen before triton is imported): the DeepSeek-V4 decode call built from
the argument expressions of the tree's DeepseekV4TritonAttention._forward_decode (and FlashMLA's
from DeepseekV4FlashMLAAttention._forward_decode), against the series' float64 reference. Fails
when either class's call drifts from the forms the benchmark freezes for the GPU machine, or when
the class starts passing a name the benchmark does not bind."""
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
                           "--cpu-smoke"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    res = json.loads((tmp_path / "dsv4-cpu-smoke.json").read_text())
    assert res["call_forms"] == {"ours": "tree", "flashmla": "tree"}, res["call_forms"]
    assert [r["layer"] for r in res["rows"]] == ["swa", "c4", "c128"]
    for r in res["rows"]:
        assert r["rel_err_vs_f64"] < 2e-3, r
        assert r["bytes"] == 584 * r["rows_gathered"] > 0, r


def test_frozen_forms_are_the_classes_calls(vllm_tree):
    """The same check without running a kernel: the frozen forms, parsed from the script's
    source (importing it would import triton in this process), equal the tree's calls."""
    import ast

    src = (REPO / "bench" / "bench_dsv4.py").read_text()
    consts = {t.id: ast.literal_eval(n.value) for n in ast.parse(src).body
              if isinstance(n, ast.Assign) for t in n.targets
              if isinstance(t, ast.Name) and t.id in ("OURS_FORM", "FLASHMLA_FORM",
                                                      "TRITON_CLASS", "FLASHMLA_CLASS")}
    ns: dict = {}
    call_form_src = ast.get_source_segment(src, next(
        n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "call_form"))
    exec("import ast\n" + call_form_src, ns)  # noqa: S102 (the repo's own function)
    for cls_key, form_key in (("TRITON_CLASS", "OURS_FORM"), ("FLASHMLA_CLASS", "FLASHMLA_FORM")):
        rel, cls, func = consts[cls_key]
        got = ns["call_form"]((vllm_tree / rel).read_text(), cls, func)
        want = consts[form_key]
        assert got == (want[0], [tuple(kw) for kw in want[1]]), (cls, got)

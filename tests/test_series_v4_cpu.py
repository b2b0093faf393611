"""The series' DeepSeek-V4 tests that need no GPU (its DeepSeek-V4 and breakable CUDA graphs
patches: the e4m3 encoder's routing, the CuTe DSL gates and the Triton compressor path, mHC, o_proj,
the attention class and its selection under a mocked capability), run by pytest as
vLLM would run them, in a process of their own with the patched tree first on the
path. Their CUDA cases skip here; tests/gpu runs the kernels on the H200.
`--noconftest`: vLLM's tests/conftest.py needs packages of vLLM's test requirements
that the toolkit does not install."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import lineproofs

FILES = ["tests/kernels/test_deepseek_v4_attn_selection.py",
         "tests/kernels/test_deepseek_v4_cutedsl_fallback.py",
         "tests/kernels/test_deepseek_v4_mhc_portable.py",
         "tests/kernels/test_deepseek_v4_o_proj_bf16.py",
         "tests/kernels/test_deepseek_v4_triton_fp8.py",
         "tests/kernels/attention/test_deepseek_v4_triton_attention.py"]


@lineproofs.replaced_on(v0_33_0="its V4 tests are other files (the series' DeepSeek-V4 patches): "
                                 "tests/lines/0.33.0/v4/test_tree_v4_tests_cpu.py runs them (test_line_v4_proof)")
def test_series_v4_tests_pass_on_cpu(vllm_tree):
    missing = [f for f in FILES if not (vllm_tree / f).is_file()]
    assert not missing, f"not in the tree {vllm_tree} (the series' DeepSeek-V4 patches): {missing}"
    env = dict(os.environ, PYTHONPATH=str(vllm_tree))
    for knob in ("TRITON_INTERPRET", "VLLM_DSV4_PORTABLE"):  # the tests set what they need
        env.pop(knob, None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "--noconftest", "-p", "no:cacheprovider",
                           "-W", "ignore", *FILES], cwd=vllm_tree, env=env, capture_output=True, text=True,
                          timeout=900)
    tail = "\n".join(proc.stdout.splitlines()[-25:])
    assert proc.returncode == 0, tail
    passed = re.search(r"(\d+) passed", tail)
    assert passed and int(passed.group(1)) >= 100, tail  # 142 on 2026-12-01; CUDA cases skip


BREAKABLE_TESTS = "tests/v1/cudagraph/test_breakable_cudagraph.py"


@lineproofs.replaced_on(v0_33_0="0.26.0's breakable CUDA graphs patch is not carried (0.33.0's "
                                 "eager_break_during_capture checks for a capture per call): "
                                 "tests/lines/0.33.0/v4/test_breakable_cudagraph_fix_present.py runs its test on 0.33.0")
def test_series_breakable_cudagraph_decorator_tests_pass_on_cpu(vllm_tree):
    """The breakable CUDA graphs patch's vLLM-style test and the pass-through one next to it (the
    file's CUDA cases skip; its runner-metadata test needs llguidance, which the toolkit does not
    install)."""
    env = dict(os.environ, PYTHONPATH=str(vllm_tree))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "--noconftest", "-p", "no:cacheprovider",
                           "-W", "ignore", BREAKABLE_TESTS, "-k", "enabled_after_import or passthrough"],
                          cwd=vllm_tree, env=env, capture_output=True, text=True, timeout=600)
    tail = "\n".join(proc.stdout.splitlines()[-15:])
    assert proc.returncode == 0 and "2 passed" in tail, tail


@lineproofs.replaced_on(v0_33_0="0.26.0's breakable CUDA graphs patch is not carried: tests/lines/0.33.0/v4/"
                                 "test_breakable_cudagraph_fix_present.py checks 0.33.0 breaks per call")
def test_v4_ops_stay_eager_breaks_when_imported_before_the_config_enables_them(vllm_tree):
    """The import order of a real engine (tests/series_import_chain.py): the V4 attention op and
    the sparse indexer op, imported while VLLM_USE_BREAKABLE_CUDAGRAPH is unset, are still eager
    breaks. Without the breakable CUDA graphs patch both are the bare functions and the PIECEWISE
    graphs capture them."""
    env = dict(os.environ, PYTHONPATH=str(vllm_tree))
    env.pop("VLLM_USE_BREAKABLE_CUDAGRAPH", None)
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("series_import_chain.py"))],
                          cwd=vllm_tree, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"attention_imported": True, "indexer_imported": True, "attention_impl_breaks": True,
                   "indexer_op_breaks": True, "breakable_env": None}, got


# tests/lines/<line>/v4/: the line's own DeepSeek-V4 CPU proof (what the tests above check on 0.26.0,
# for 0.33.0's V4 code), and the least number of tests each file must pass.
LINE_PROOFS = {
    "0.33.0": [("v4", "test_tree_v4_tests_cpu.py", 1),               # the tree's V4 vLLM-style tests
               ("v4", "test_v4_triton_fp8_interp.py", 14),            # e4m3 ops, compressor without CuTe DSL
               ("v4", "test_v4_triton_attention_kernel_interp.py", 9),  # the V4 Triton attention kernels
               ("v4", "test_v4_attention_class_interp.py", 13),        # forward_mqa on a mixed batch
               ("v4", "test_v4_import_without_triton.py", 2),
               ("v4", "test_v4_tiny_checkpoint_config.py", 1),         # the tiny checkpoint's config on 0.33.0
               ("v4", "test_breakable_cudagraph_fix_present.py", 1)],  # 0.26.0's graphs fix test, unpatched
}


@pytest.mark.parametrize("case", lineproofs.cases(LINE_PROOFS, "its V4 CPU tests are the ones above"))
def test_line_v4_proof(vllm_tree, case):
    lineproofs.check(case, vllm_tree, pristine=True)

"""The series' DeepSeek-V4 tests that need no GPU (patches 0014-0020: the e4m3
encoder's routing, the CuTe DSL gates and the Triton compressor path, mHC, o_proj,
the attention class and its selection under a mocked capability), run by pytest as
vLLM would run them, in a process of their own with the patched tree first on the
path. Their CUDA cases skip here; tests/gpu runs the kernels on the H200.
`--noconftest`: vLLM's tests/conftest.py needs packages of vLLM's test requirements
that the toolkit does not install."""
from __future__ import annotations

import os
import re
import subprocess
import sys

FILES = ["tests/kernels/test_deepseek_v4_attn_selection.py",
         "tests/kernels/test_deepseek_v4_cutedsl_fallback.py",
         "tests/kernels/test_deepseek_v4_mhc_portable.py",
         "tests/kernels/test_deepseek_v4_o_proj_bf16.py",
         "tests/kernels/test_deepseek_v4_triton_fp8.py",
         "tests/kernels/attention/test_deepseek_v4_triton_attention.py"]


def test_series_v4_tests_pass_on_cpu(vllm_tree):
    missing = [f for f in FILES if not (vllm_tree / f).is_file()]
    assert not missing, f"not in the tree {vllm_tree} (patches 0014-0020): {missing}"
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

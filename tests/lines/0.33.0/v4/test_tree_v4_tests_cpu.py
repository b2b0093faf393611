"""The clone's DeepSeek-V4 vLLM-style tests run by pytest as vLLM's CI would, on the CPU (their
CUDA-only cases skip; the interpreter-run variants of those are in the other files here).
`--noconftest`: vLLM's tests/conftest.py needs packages of vLLM's test requirements."""
import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import TREE

FILES = [
    "tests/kernels/test_deepseek_v4_triton_fp8.py",
    "tests/kernels/test_deepseek_v4_cutedsl_fallback.py",
    "tests/kernels/attention/test_triton_sparse_mla_dsv4.py",
    "tests/kernels/test_deepseek_v4_mhc_portable.py",
    "tests/kernels/test_deepseek_v4_o_proj_bf16.py",
    "tests/kernels/attention/test_deepseek_v4_triton_attention.py",
    "tests/kernels/test_deepseek_v4_attn_selection.py",
]


def test_tree_v4_tests_pass_on_cpu():
    files = [f for f in FILES if (TREE / f).is_file()]
    env = dict(os.environ, PYTHONPATH=f"{TREE}{os.pathsep}{Path(__file__).parent}")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--noconftest", "-p", "no:cacheprovider",
         "-p", "port_v4_interp", "-W", "ignore", *files],
        cwd=TREE, env=env, capture_output=True, text=True, timeout=1800)
    tail = "\n".join(proc.stdout.splitlines()[-15:])
    print(tail)
    assert proc.returncode == 0, tail
    assert re.search(r"(\d+) passed", tail), tail

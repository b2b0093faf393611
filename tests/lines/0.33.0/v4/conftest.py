"""Shared set-up for the CPU proof of the DeepSeek-V4 commits of the 0.33.0 line.

Every test here imports vLLM from the clone (VLLM_TREE, default <tree>) and runs
Triton kernels under the interpreter (TRITON_INTERPRET=1, set before Triton is imported).
vLLM-style test modules of the clone are loaded with their DEVICE set to "cpu" and their test
functions are called directly (their CUDA skip marks apply only under pytest collection)."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

TREE = Path(os.environ["VLLM_TREE"])
if str(TREE) not in sys.path:
    sys.path.insert(0, str(TREE))

import port_v4_interp  # noqa: E402,F401  (interpreter set-up)
import pytest  # noqa: E402


def load_tree_test(rel: str, name: str):
    """The clone's test module `rel` (imported as a package module of the clone, so its
    relative imports work), with DEVICE set to "cpu"."""
    path = TREE / rel
    if not path.is_file():
        pytest.fail(f"{rel} is missing in {TREE}")
    mod = importlib.import_module(rel.removesuffix(".py").replace("/", "."))
    if hasattr(mod, "DEVICE"):
        mod.DEVICE = "cpu"
    return mod


@pytest.fixture
def tree():
    return TREE

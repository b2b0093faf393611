"""Shared pytest fixtures and markers.

`vllm_tree` is the patched vLLM work tree that `make patch` produces
(override with SMLA_TREE). GPU tests carry the `gpu` marker and skip
cleanly when CUDA is not available.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

# Triton's compile cache (hundreds of MB for the kernel tests) goes under the toolkit's cache
# (<cache>/triton), not ~/.triton, unless the user chose a place with TRITON_CACHE_DIR.
if os.environ.get("TRITON_CACHE_DIR"):
    os.environ["SMLA_TEST_USER_TRITON_CACHE"] = "1"
else:
    try:
        from smla.cache import cache_dir
    except ImportError:  # the GPU machine runs tests/gpu without the toolkit installed
        cache_dir = None
    if cache_dir is not None:
        os.environ["TRITON_CACHE_DIR"] = str(cache_dir() / "triton")


def default_tree() -> Path:
    return Path(os.environ.get("SMLA_TREE") or REPO_ROOT / "work" / "vllm")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (make test-gpu)")
    config.addinivalue_line("markers", "slow: integration test on the real vLLM source")


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # torch missing or broken: no GPU tests
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="no CUDA device (GPU tests run with make test-gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def vllm_tree() -> Path:
    tree = default_tree()
    if not (tree / "vllm" / "__init__.py").is_file():
        pytest.fail(f"no vLLM work tree at {tree}: run `make patch` first")
    return tree

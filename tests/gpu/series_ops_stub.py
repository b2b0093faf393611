"""pytest plugin for the GPU machine (no vLLM installed there): make
``vllm.v1.attention.ops`` importable from the tree in SMLA_TREE, and
``vllm.platforms.current_platform`` answer from torch.cuda
(tests/gpu/platform_stand_in.py), so that the series' own kernel tests
(tests/kernels/attention/test_triton_*.py of the patched tree,
on vLLM's platform API since issue 33) run as they would in vLLM;
``vllm._custom_ops.concat_and_cache_mla`` is vLLM's compiled cache writer
from SMLA_VLLM_C_SO (vLLM 0.26.0's _C_stable_libtorch.abi3.so; the call
0.26.0 and 0.33.0 share), or a skip where it is not carried.
usage: PYTHONPATH=tests:tests/gpu python3 -m pytest -p series_ops_stub <tree>/tests/kernels/attention/test_triton_*.py"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from platform_stand_in import provide_platforms
from sparse_mla_reference import provide_ops_package


def provide_custom_ops() -> None:
    import types

    import pytest
    import torch

    if not getattr(sys.modules["vllm"], "__smla_stub__", False):
        return  # a real vLLM (the installed wheel) has its own
    so = os.environ.get("SMLA_VLLM_C_SO", "")
    mod = types.ModuleType("vllm._custom_ops")
    mod.__smla_stub__ = True

    def concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
        if not Path(so).is_file():
            pytest.skip("vLLM's compiled cache writer is not carried (SMLA_VLLM_C_SO)")
        if not hasattr(torch.ops._C_cache_ops, "concat_and_cache_mla"):
            torch.ops.load_library(so)
        torch.ops._C_cache_ops.concat_and_cache_mla(
            kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)

    mod.concat_and_cache_mla = concat_and_cache_mla
    sys.modules["vllm._custom_ops"] = mod
    sys.modules["vllm"]._custom_ops = mod


provide_ops_package(Path(os.environ["SMLA_TREE"]))
provide_platforms()
provide_custom_ops()
